"""``KafkaConnection``: the asyncio protocol of one client connection, which
puts the parts of this package together and applies backpressure.

Backpressure, so that a slow or stalled client only ever stalls itself: at
most ``MAX_IN_FLIGHT`` requests and ``MAX_IN_FLIGHT_BYTES`` of request frames
per connection (a producer pipelining large batches keeps the writer busy
without holding hundreds of MiB of frames); no new request is taken while
the socket's send buffer is full (or an answer's file region waits to be
sent, connection/regions.py); and one Fetch at a time per connection, each
started only while the client is reading its answers, so what waits in memory
for a client that stopped reading is at most one Fetch answer (as with
Kafka, which serves one request per connection at a time).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ..connection_limits import ConnectionLimits
from ..context import HandlerContext
from ..security.listeners import Listener
from ..security.sasl import SaslGate, enabled_mechanisms
from ..security.session import ANONYMOUS, Session
from ..security.tls import principal_from_certificate
from .answers import Answers
from .dispatch import Dispatcher
from .framing import take_frames
from .read_buffer import ConnectionBuffer
from .sasl_hooks import SaslHooks
from .state import ConnectionState
from .timers import ConnectionTimers


class KafkaConnection(asyncio.BufferedProtocol):
    def __init__(self, broker: HandlerContext, connections: set[KafkaConnection],
                 limits: ConnectionLimits, listener: Listener) -> None:
        self.broker = broker
        self.connections = connections
        self.limits = limits
        self.listener = listener
        self.id = broker.new_connection_id()
        # Set by the acceptor: hands back this connection's quota slot (quotas.py).
        self.on_close: Callable[[], None] | None = None
        state = self.state = ConnectionState(asyncio.get_running_loop(), broker.metrics,
                                             limits.bad_input)
        self.buffer = ConnectionBuffer(state, limits.memory, self._update_reading)
        self.answers = Answers(state, self.buffer, self._take_frames)
        self.dispatcher = Dispatcher(broker, state, self.answers, self.id)
        self.timers = ConnectionTimers(state, self.buffer, self.answers, limits.idle_seconds,
                                       limits.partial_request_seconds)

    @property
    def transport(self) -> asyncio.Transport | None:
        return self.state.transport

    @property
    def peer(self) -> str:
        return self.state.peer

    @property
    def session(self) -> Session | None:
        return self.state.session

    # ------------------------------------------------------------ transport
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        state = self.state
        state.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        state.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        state.address = str(peer[0]) if peer else "?"
        state.client_host = f"/{peer[0]}" if peer else ""
        principal = ANONYMOUS
        if self.listener.protocol == "SSL":  # SASL_SSL: the principal comes from SASL
            principal = principal_from_certificate(transport.get_extra_info("ssl_object"))
        state.session = Session(self.listener, state.address, principal)
        if not self.listener.tls:
            # Plaintext: file regions of answers go out by os.sendfile on the
            # socket (regions.py); uvloop's and the stdlib's transports both
            # expose it (a pseudo-socket / TransportSocket with fileno()).
            state.sendfile_socket = transport.get_extra_info("socket")
        if self.listener.sasl:
            config = self.broker.config
            credentials = self.broker.credentials
            assert credentials is not None  # set by the server before any listener opens
            hooks = SaslHooks(state, self.answers, self.timers,
                              config.failed_authentication_delay_ms, self._update_reading)
            state.gate = SaslGate(hooks, self.listener,
                                  enabled_mechanisms(config, self.listener),
                                  config.sasl_server_max_receive_size, credentials,
                                  self.broker.metrics, self.limits.bad_input)
            state.max_in_flight = 1
        self.connections.add(self)
        self.broker.metrics.connections += 1
        self.broker.metrics.connections_total += 1
        self.timers.check()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.on_close is not None:
            self.on_close()
        self.connections.discard(self)
        self.broker.metrics.connections -= 1
        self.state.closing = True
        self.timers.cancel()
        self.answers.cancel()
        self.buffer.release()

    def pause_writing(self) -> None:
        self.state.writing_paused = True
        self.answers.writable.clear()
        self._update_reading()

    def resume_writing(self) -> None:
        self.state.writing_paused = False
        self.state.active()  # the client read
        if not self.state.sendfile_waiting:
            self.answers.writable.set()
        self._take_frames()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.buffer.get()

    def buffer_updated(self, nbytes: int) -> None:
        state = self.state
        state.metrics.bytes_in += nbytes
        self.buffer.received(nbytes)
        state.last_active = state.last_read = state.loop.time()
        self._take_frames()

    # ---------------------------------------------------------- backpressure
    def _take_frames(self) -> None:
        """Dispatch the whole frames received, as long as backpressure allows."""
        take_frames(self.state, self.buffer, self.broker.config.max_frame_bytes,
                    self._saturated, self.dispatcher.dispatch)
        self._update_reading()

    def _saturated(self) -> bool:
        return self.state.cannot_write or self.answers.full

    def _update_reading(self) -> None:
        state = self.state
        if state.transport is None or state.closing:
            return
        should_pause = self._saturated() or self.buffer.awaiting_memory
        if should_pause and not state.reading_paused:
            state.transport.pause_reading()
            state.reading_paused = True
        elif not should_pause and state.reading_paused:
            state.transport.resume_reading()
            state.reading_paused = False
            state.last_read = state.loop.time()  # a pause of ours is no stall of theirs

    async def drain(self, timeout: float) -> None:
        """Let the requests already read finish and be answered (shutdown)."""
        await self.answers.drain(timeout)
        self.state.close()
