"""One client connection: framing, dispatch and in-order responses.

Requests are read as they arrive (clients pipeline) and each runs as its own
task, so a long-polling Fetch does not hold up a Produce behind it; answers
are written strictly in request order, as the protocol requires. A handler
takes its offsets before its first ``await`` and tasks start in creation
order, so produce requests on one connection append in the order sent.

Backpressure, so that a slow or stalled client only ever stalls itself: at
most ``MAX_IN_FLIGHT`` requests and ``MAX_IN_FLIGHT_BYTES`` of request frames
per connection (a producer pipelining large batches keeps the writer busy
without holding hundreds of MiB of frames); no new request is taken while
the socket's send buffer is full; and one Fetch at a time per connection, each
started only while the client is reading its answers, so what waits in memory
for a client that stopped reading is at most one Fetch answer (as with
Kafka, which serves one request per connection at a time).

Memory (see request_memory.py): the socket reads into a buffer that grows with the
bytes of the frame actually received (doubling, up to the frame), never sized
from the length prefix alone, charged to the node's ``queued.max.request.bytes``
budget until the last frame read into it is answered; a connection with
nothing unread holds no buffer at all. A fresh buffer is as large as the
connection's last frame (capped), so a producer of large batches reads each
into one buffer without copies.

Timeouts: a connection with no request or response activity for
``connections.max.idle.ms`` is closed (one with a request being served, e.g. a
parked long-poll, is not idle; one whose client stopped reading its answers
is), and so is one whose half-received frame gets no new byte for
``gateway.partial.request.timeout.ms`` while we are reading.

A malformed or oversized frame, or a request for an API or version this
gateway does not implement, closes this connection only (Kafka does the same,
except that ApiVersions is always answered), and is logged, at most a few
lines a minute per client address.

Security (security/): each connection belongs to a listener. On a TLS
listener the transport is TLS (set up by the server) and a client
certificate names the principal; on a SASL listener a ``SaslGate`` sees every
frame until the client has authenticated (ApiVersions, SaslHandshake,
SaslAuthenticate only, one request at a time, as Kafka serves them; frames no
larger than ``sasl.server.max.receive.size``; a failed authentication mutes
the connection and ends it ``connection.failed.authentication.delay.ms``
later, by a timer), then steps aside: afterwards, and on PLAINTEXT listeners
always, the frame path is the same as without security. Handlers find the listener and principal in
``request.session``.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections import deque
from collections.abc import Callable

from kio.schema.errors import ErrorCode

from .apis import APIS, api_versions
from .broker import Broker
from .codec import (
    API_VERSIONS_KEY,
    MalformedRequest,
    Request,
    decode_request,
    encode_response,
    read_header,
)
from .connection_limits import ConnectionLimits
from .request_memory import FIRST_READ_BYTES, ReadBuffer
from .security.listeners import Listener
from .security.sasl import SaslGate
from .security.session import ANONYMOUS, Session
from .security.tls import principal_from_certificate
from .slicing import encode

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 64
MAX_IN_FLIGHT_BYTES = 32 << 20
# A fresh buffer is sized from the connection's last frame, up to this.
MAX_FRESH_BUFFER_BYTES = 8 << 20
# Less free room than this (and than the frame still misses) gets a new buffer.
MIN_READ_ROOM = 4 << 10
_SIZE = struct.Struct(">i")


class KafkaConnection(asyncio.BufferedProtocol):
    def __init__(self, broker: Broker, connections: set[KafkaConnection],
                 limits: ConnectionLimits, listener: Listener) -> None:
        self.broker = broker
        self.connections = connections
        self.limits = limits
        self.listener = listener
        self.session: Session | None = None
        # Until a SASL client has authenticated: what sees its frames first.
        self._gate: SaslGate | None = None
        self._max_in_flight = MAX_IN_FLIGHT
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.address = "?"
        self.client_host = ""
        self.id = broker.new_connection_id()
        # Set by the acceptor: hands back this connection's quota slot (quotas.py).
        self.on_close: Callable[[], None] | None = None
        # The socket reads straight into _buffer (BufferedProtocol): bytes in
        # [_start, _end) are received but not yet a whole frame. None while
        # nothing is unread: an idle connection holds no buffer.
        self._buffer: ReadBuffer | None = None
        self._start = 0
        self._end = 0
        self._fresh_size = FIRST_READ_BYTES
        self._awaiting_memory = False
        # Requests being served, in arrival order, with their frame sizes and
        # the buffers their frames are views of.
        self._pending: deque[
            tuple[asyncio.Future[list[bytes] | None], int, ReadBuffer | None]
        ] = deque()
        self._pending_bytes = 0
        self._reading_paused = False
        self._writing_paused = False
        self._writable = asyncio.Event()
        self._writable.set()
        self._one_at_a_time = asyncio.Lock()
        self._one_at_a_time_holder: asyncio.Future[list[bytes] | None] | None = None
        self._closing = False
        self._loop = asyncio.get_running_loop()
        self._last_active = self._last_read = self._loop.time()
        self._timer: asyncio.TimerHandle | None = None
        self._failed_authentication: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------ transport
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.address = str(peer[0]) if peer else "?"
        self.client_host = f"/{peer[0]}" if peer else ""
        principal = ANONYMOUS
        if self.listener.protocol == "SSL":  # SASL_SSL: the principal comes from SASL
            principal = principal_from_certificate(transport.get_extra_info("ssl_object"))
        self.session = Session(self.listener, self.address, principal)
        if self.listener.sasl:
            self._gate = SaslGate(self)
            self._max_in_flight = 1
        self.connections.add(self)
        self.broker.metrics.connections += 1
        self.broker.metrics.connections_total += 1
        self._on_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.on_close is not None:
            self.on_close()
        self.connections.discard(self)
        self.broker.metrics.connections -= 1
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
        if self._failed_authentication is not None:
            self._failed_authentication.cancel()
        memory = self.limits.memory
        memory.forget(self)
        for task, _size, buffer in self._pending:
            task.cancel()
            if buffer is not None:
                memory.retire(buffer)
        self._pending.clear()
        if self._buffer is not None:
            memory.retire(self._buffer)
            self._buffer = None

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._writable.clear()
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._last_active = self._loop.time()  # the client read
        self._writable.set()
        self._take_frames()

    def get_buffer(self, sizehint: int) -> memoryview:
        buffer = self._buffer
        if buffer is None:
            buffer = self._buffer = self.limits.memory.fresh(self._fresh_size)
            self._start = self._end = 0
        elif self._end == len(buffer.data):  # not expected: _prepare_read leaves room
            self._move_to(self.limits.memory.fresh(self._end - self._start + MIN_READ_ROOM))
            buffer = self._buffer
        return memoryview(buffer.data)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        self.broker.metrics.bytes_in += nbytes
        self._end += nbytes
        self._last_active = self._last_read = self._loop.time()
        self._take_frames()

    def _take_frames(self) -> None:
        """Dispatch the whole frames received, as long as backpressure allows."""
        buffer = self._buffer
        if buffer is None or self._closing:
            self._update_reading()
            return
        # Frames are handed on as read-only views of the buffer: no copy. The
        # socket only ever writes past _end, never under a frame handed out.
        view = memoryview(buffer.data).toreadonly()
        pos, end = self._start, self._end
        limit = self.broker.config.max_frame_bytes
        while end - pos >= 4 and not self._closing and not self._saturated:
            (size,) = _SIZE.unpack_from(view, pos)
            if self._gate is not None and not 0 <= size <= self._gate.max_receive_size:
                # Before authentication only small frames (sasl.server.max.receive.size),
                # refused from the size prefix alone, as Kafka does.
                self._gate.oversized(size)
                return
            if size < 0 or size > limit:
                self._reject(f"frame of {size} bytes (limit {limit})")
                return
            if end - pos - 4 < size:
                break
            self._start = pos + 4 + size
            self._fresh_size = min(max(FIRST_READ_BYTES, 4 + size), MAX_FRESH_BUFFER_BYTES)
            self.limits.memory.frame_received(self)
            self._dispatch(view[pos + 4 : pos + 4 + size], buffer)
            pos = self._start
        self._start = pos
        if not (self._closing or self._saturated or self._awaiting_memory):
            self._prepare_read()
        self._update_reading()

    def _prepare_read(self) -> None:
        """Leave room for the next read: drop an emptied buffer, grow for a partial frame."""
        buffer = self._buffer
        assert buffer is not None
        unread = self._end - self._start
        if unread == 0:
            self._buffer = None
            self._start = self._end = 0
            if not buffer.frames:
                self.limits.memory.retire(buffer)
            return
        if unread >= 4:
            whole = 4 + _SIZE.unpack_from(buffer.data, self._start)[0]
            missing = whole - unread
        else:
            whole, missing = FIRST_READ_BYTES, 4 - unread
        if len(buffer.data) - self._end >= min(missing, MIN_READ_ROOM):
            return
        # Grow with what arrived (doubling), never straight to the declared size:
        # a length prefix alone must not reserve memory.
        size = min(whole, max(2 * unread, self._fresh_size))
        granted = self.limits.memory.request(self, size, whole)
        if granted is None:
            self._awaiting_memory = True  # memory_granted resumes reading
        else:
            self._move_to(granted)

    def memory_granted(self, buffer: ReadBuffer) -> None:
        if self._closing:
            self.limits.memory.retire(buffer)
            return
        self._awaiting_memory = False
        self._move_to(buffer)
        self._update_reading()

    def _move_to(self, buffer: ReadBuffer) -> None:
        """Move the unread bytes to ``buffer``; the old one lives on while frames view it."""
        old = self._buffer
        assert old is not None
        unread = self._end - self._start
        buffer.data[:unread] = memoryview(old.data)[self._start : self._end]
        self._buffer, self._start, self._end = buffer, 0, unread
        if not old.frames:
            self.limits.memory.retire(old)

    @property
    def _saturated(self) -> bool:
        return (
            self._writing_paused
            or len(self._pending) >= self._max_in_flight
            or self._pending_bytes >= MAX_IN_FLIGHT_BYTES
        )

    # ------------------------------------------------------------- requests
    def _dispatch(self, frame: memoryview, buffer: ReadBuffer) -> None:
        if self._gate is not None and self._gate.intercept(frame):
            return
        try:
            header, body_pos = read_header(frame)
            api = APIS.get(header.api_key)
            if api is None or not api.min_version <= header.api_version <= api.max_version:
                if header.api_key == API_VERSIONS_KEY:
                    # Answer in v0 so the client can retry at a version we know.
                    response = api_versions.response(0, ErrorCode.unsupported_version)
                    self._queue_ready(encode_response(header.api_key, header.correlation_id,
                                                      response))
                    return
                name = api.name if api else f"unknown API key {header.api_key}"
                self._reject(f"{name} v{header.api_version} is not supported")
                return
            request = decode_request(frame, header, body_pos, api.decode, self.client_host,
                                     self.id, self.session,
                                     self.broker.config.request_max_array_items)
        except MalformedRequest as exc:
            self._reject(str(exc))
            return
        task = self._loop.create_task(self._serve(request, api.name))
        self._pending_bytes += len(frame)
        buffer.frames += 1
        self._pending.append((task, len(frame), buffer))
        task.add_done_callback(self._flush)

    async def _serve(self, request: Request, name: str) -> list[bytes] | None:
        metrics = self.broker.metrics
        started = time.perf_counter()
        metrics.requests[name] += 1
        api = APIS[request.header.api_key]
        handle = api.handle
        try:
            if api.one_at_a_time:
                # Held until _flush has written the answer: released when the
                # handler returns, the next one would find the socket still
                # writable and answer too, before the first answer is written.
                await self._one_at_a_time.acquire()
                self._one_at_a_time_holder = asyncio.current_task()
                await self._writable.wait()
                body = await handle(self.broker, request)
            else:
                body = await handle(self.broker, request)
        except Exception:
            metrics.request_errors[name] += 1
            raise
        finally:
            metrics.latency[name].observe(time.perf_counter() - started)
        if body is None:
            return None
        return await encode(metrics, name, request.header.api_key,
                            request.header.correlation_id, body)

    def authenticated(self, principal: str) -> None:
        """The SASL gate is done: from now on frames take the ordinary path."""
        assert self.session is not None
        self.session.principal = principal
        self._gate = None
        self._max_in_flight = MAX_IN_FLIGHT

    def gate_answer(self, chunks: list[bytes], close: bool = False) -> None:
        """An answer of the SASL gate, written at once: before authentication one
        request is served at a time, so no other answer is due before it.
        ``close``: the last one (a failed authentication); the socket closes once
        it is written."""
        assert not self._pending
        if self.transport is not None and not self._closing:
            self.transport.writelines(chunks)
            self.broker.metrics.bytes_out += sum(map(len, chunks))
            self._last_active = self._loop.time()
        if close:
            self._close()

    def fail_authentication(self, chunks: list[bytes] | None) -> None:
        """End a failed SASL authentication as Kafka does: the connection is muted at
        once (nothing more read or served), and ``connection.failed.authentication.delay.ms``
        later its answer, if any, is written and it is closed. A timer: the delay holds
        up nothing but this connection, and slows down guessing passwords."""
        self._max_in_flight = 0  # saturated: no frame is taken, reading pauses
        self._update_reading()
        delay = self.broker.config.failed_authentication_delay_ms / 1000
        if delay <= 0:
            self.gate_answer(chunks or [], close=True)
        else:
            self._failed_authentication = self._loop.call_later(
                delay, self.gate_answer, chunks or [], True)

    def _queue_ready(self, chunks: list[bytes]) -> None:
        future: asyncio.Future[list[bytes] | None] = self._loop.create_future()
        future.set_result(chunks)
        self._pending.append((future, 0, None))
        # Not flushed from here: this runs inside _take_frames' loop.
        self._loop.call_soon(self._flush)

    def _flush(self, _task: object = None) -> None:
        pending = self._pending
        while pending and pending[0][0].done():
            task, size, buffer = pending.popleft()
            self._pending_bytes -= size
            if buffer is not None:
                buffer.frames -= 1
                if not buffer.frames and buffer is not self._buffer:
                    self.limits.memory.retire(buffer)
            failed = not task.cancelled() and not self._answer(task)
            if task is self._one_at_a_time_holder:
                self._one_at_a_time_holder = None
                self._one_at_a_time.release()
            if failed:
                return
        self._take_frames()

    def _answer(self, task: asyncio.Future[list[bytes] | None]) -> bool:
        """Write a finished request's answer; False if it failed (the connection closes)."""
        error = task.exception()
        if error is not None:
            self.limits.bad_input.log(self.address, logging.ERROR,
                                      "closing %s: request failed", self.peer, exc_info=error)
            self._close()
            return False
        chunks = task.result()
        if chunks and self.transport is not None and not self._closing:
            return self._write(chunks)
        return True

    def _write(self, chunks: list[bytes]) -> bool:
        """Hand an answer to the socket; False (logged, counted) if it refused it.

        A refused write (writev's EINVAL, say) closes the transport at once and
        silently: seen here, or the client would just see the connection close."""
        assert self.transport is not None
        if self.transport.is_closing():  # the client went away first: nothing refused
            return True
        try:
            self.transport.writelines(chunks)
            failure: BaseException | None = None
        except (OSError, RuntimeError, ValueError) as exc:
            failure = exc
        if failure is None and not self.transport.is_closing():
            self.broker.metrics.bytes_out += sum(map(len, chunks))
            self._last_active = self._loop.time()
            return True
        self.broker.metrics.response_write_failures += 1
        self.limits.bad_input.log(
            self.address, logging.ERROR, "closing %s: writing an answer of %d bytes in %d "
            "buffers failed: %s", self.peer, sum(map(len, chunks)), len(chunks),
            failure or "the transport closed", exc_info=failure)
        self._close()
        return False

    def _update_reading(self) -> None:
        if self.transport is None or self._closing:
            return
        should_pause = self._saturated or self._awaiting_memory
        if should_pause and not self._reading_paused:
            self.transport.pause_reading()
            self._reading_paused = True
        elif not should_pause and self._reading_paused:
            self.transport.resume_reading()
            self._reading_paused = False
            self._last_read = self._loop.time()  # a pause of ours is no stall of theirs

    # ------------------------------------------------------------- timeouts
    def _on_timer(self) -> None:
        """Close the connection if idle or stalled mid-frame; else check again later."""
        self._timer = None
        idle, partial = self.limits.idle_seconds, self.limits.partial_request_seconds
        if self._closing or (idle is None and partial is None):
            return
        now = self._loop.time()
        # A timeout that starts later is caught one period after it starts at worst.
        deadline = now + min(t for t in (idle, partial) if t is not None)
        if partial is not None and self._end > self._start and not self._reading_paused:
            if now - self._last_read >= partial:
                self._expire(f"no byte of a partial request for {partial:g} s", bad=True)
                return
            deadline = min(deadline, self._last_read + partial)
        # Busy means serving a request (a parked long-poll) or waiting for our
        # memory; not a client that stopped reading its answers, whatever it
        # has sent or is owed.
        busy = (self._pending and not self._writing_paused) or self._awaiting_memory
        if idle is not None and not busy:
            if now - self._last_active >= idle:
                self._expire(f"idle for {idle:g} s", bad=False)
                return
            deadline = min(deadline, self._last_active + idle)
        self._timer = self._loop.call_at(deadline, self._on_timer)

    def _expire(self, reason: str, bad: bool) -> None:
        self.broker.metrics.connections_expired += 1
        if bad:
            self.limits.bad_input.log(self.address, logging.WARNING,
                                      "closing connection from %s: %s", self.peer, reason)
        else:
            log.debug("closing connection from %s: %s", self.peer, reason)
        self._closing = True
        if self.transport is not None:
            self.transport.abort()  # whatever it has not read in all that time is dropped

    def _reject(self, reason: str) -> None:
        self.limits.bad_input.log(self.address, logging.WARNING,
                                  "closing connection from %s: %s", self.peer, reason)
        self.broker.metrics.bad_frames += 1
        self._close()

    def _close(self) -> None:
        self._closing = True
        if self.transport is not None:
            self.transport.close()

    async def drain(self, timeout: float) -> None:
        """Let the requests already read finish and be answered (shutdown)."""
        if self._pending:
            await asyncio.wait([task for task, _size, _buffer in self._pending], timeout=timeout)
        self._close()
