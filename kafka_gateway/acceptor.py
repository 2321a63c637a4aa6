"""Accepting the connections of one listener: quotas first, then TLS, then Kafka.

Each accepted socket is counted against the connection quotas (quotas.py)
with the client's address before anything else, as Kafka's Acceptor does; a
connection past a limit is closed at once. Then, on a TLS listener, the TLS
handshake has ``gateway.ssl.handshake.timeout.ms`` to finish: a client that
sends part of a ClientHello (or nothing) and waits is closed then, instead of
holding its socket and TLS state for as long as it likes. Kafka has no such
setting (a half-done handshake is idle and closes after
``connections.max.idle.ms``, 10 minutes); asyncio's own default is 60 s.

The accept loop is ours rather than ``loop.create_server``'s because the
client's address must be known before the TLS handshake, which is when
asyncio would first tell a protocol about it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
from collections.abc import Callable

from .metrics import Metrics
from .quotas import ConnectionQuotas, Slot

log = logging.getLogger(__name__)

BACKLOG = 1024
# After an accept error (out of file descriptors, most often), as asyncio waits.
ACCEPT_RETRY_SECONDS = 1.0


class Closable(asyncio.BaseProtocol):
    """What the acceptor builds: told, once, how to hand back its slot."""

    on_close: Callable[[], None] | None


def listening_sockets(host: str, port: int) -> list[socket.socket]:
    """Bound, listening sockets for ``host`` ('' = every interface), as create_server binds."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                               flags=socket.AI_PASSIVE)
    out: list[socket.socket] = []
    seen = set()
    try:
        for family, kind, proto, _name, address in infos:
            if (family, address) in seen:
                continue
            seen.add((family, address))
            sock = socket.socket(family, kind, proto)
            out.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(out) > 1:  # every address on the port the first got
                address = (address[0], out[0].getsockname()[1], *address[2:])
            sock.bind(address)
            sock.listen(BACKLOG)
            sock.setblocking(False)
    except OSError:
        for sock in out:
            sock.close()
        raise
    return out


class Acceptor:
    def __init__(self, sockets: list[socket.socket], factory: Callable[[], Closable],
                 quotas: ConnectionQuotas, metrics: Metrics,
                 tls: ssl.SSLContext | None, handshake_timeout: float) -> None:
        self.sockets = sockets
        self.factory = factory
        self.quotas = quotas
        self.metrics = metrics
        self.tls = tls
        self.handshake_timeout = handshake_timeout
        self._tasks: list[asyncio.Task[None]] = []
        self._handshakes: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        return int(self.sockets[0].getsockname()[1])

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._accept_loop(sock)) for sock in self.sockets]

    def close(self) -> None:
        """Stop accepting (connections already open stay; handshakes under way stop)."""
        for task in self._tasks:
            task.cancel()
        for task in list(self._handshakes):
            task.cancel()
        for sock in self.sockets:
            sock.close()

    async def _accept_loop(self, listening: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, address = await loop.sock_accept(listening)
            except asyncio.CancelledError:
                raise
            except OSError as exc:
                log.warning("accepting a connection failed: %s; retrying in %g s", exc,
                            ACCEPT_RETRY_SECONDS)
                await asyncio.sleep(ACCEPT_RETRY_SECONDS)
                continue
            slot = self.quotas.acquire(str(address[0]))
            if slot is None:
                _abort(sock)
                continue
            sock.setblocking(False)
            if self.tls is None:
                self._connect(loop, sock, slot)
            else:
                task = loop.create_task(self._handshake(loop, sock, slot))
                self._handshakes.add(task)
                task.add_done_callback(self._handshakes.discard)

    def _protocol(self, slot: Slot) -> Callable[[], Closable]:
        def build() -> Closable:
            protocol = self.factory()
            protocol.on_close = slot.release
            return protocol
        return build

    def _connect(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, slot: Slot) -> None:
        """A plaintext connection: its protocol is made (and told) at once."""
        task = loop.create_task(loop.connect_accepted_socket(self._protocol(slot), sock))

        def done(finished: asyncio.Task[object]) -> None:
            if finished.cancelled() or finished.exception() is not None:
                slot.release()  # no protocol was made, or it was never told
                _abort(sock)
        task.add_done_callback(done)

    async def _handshake(self, loop: asyncio.AbstractEventLoop, sock: socket.socket,
                         slot: Slot) -> None:
        metrics = self.metrics
        metrics.tls_handshakes_in_progress += 1
        started = time.monotonic()
        try:
            await asyncio.wait_for(
                loop.connect_accepted_socket(self._protocol(slot), sock, ssl=self.tls),
                self.handshake_timeout)
        except TimeoutError:
            metrics.tls_handshake_timeouts += 1
            log.debug("closing a connection whose TLS handshake took over %g s",
                      time.monotonic() - started)
            slot.release()
            _abort(sock)
        except asyncio.CancelledError:  # the listener is closing
            slot.release()
            _abort(sock)
            raise
        except Exception:
            # A failed handshake (counted and logged by tls.HandshakeWatch): the
            # Kafka connection never began.
            slot.release()
            _abort(sock)
        finally:
            metrics.tls_handshakes_in_progress -= 1


def _abort(sock: socket.socket) -> None:
    """Close at once, with a reset: nothing is owed to this client."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()
