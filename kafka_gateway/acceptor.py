"""Accepting the connections of one listener: quotas first, then TLS, then Kafka.

Each accepted socket is counted against the connection quotas (quotas.py)
with the client's address before anything else, as Kafka's Acceptor does; a
connection past a limit is closed at once. Then, on a TLS listener, the TLS
handshake has ``gateway.ssl.handshake.timeout.ms`` to finish: a client that
sends part of a ClientHello (or nothing) and waits is closed then, instead of
holding its socket and TLS state for as long as it likes. Kafka has no such
setting (a half-done handshake is idle and closes after
``connections.max.idle.ms``, 10 minutes); asyncio's own default is 60 s.

Until the client's first TLS record (its ClientHello) has arrived whole, a
TLS connection holds nothing but its socket: no TLS state is made for it
(about 64 KiB: OpenSSL's and the event loop's TLS read buffer). The socket's
receive low-water mark (SO_RCVLOWAT) makes the event loop wake it only once
the record's header, then the whole record, is there; the bytes are peeked,
not read, and the TLS layer reads them as usual. So a client that sends 4
bytes of a ClientHello and waits costs a socket until the timeout.

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
import sys
import time
from collections.abc import Callable
from typing import Protocol

from .metrics import Metrics
from .quotas import ConnectionQuotas, Slot

log = logging.getLogger(__name__)

BACKLOG = 1024
# After an accept error (out of file descriptors, most often), as asyncio waits.
ACCEPT_RETRY_SECONDS = 1.0
# TLS records: a 5-byte header (type, version, length), a handshake record is
# type 22, and a plaintext record (as a ClientHello is) holds at most 2^14 bytes.
_RECORD_HEADER = 5
_HANDSHAKE = 0x16
_MAX_RECORD = _RECORD_HEADER + (1 << 14)
# Linux wakes a reader only once SO_RCVLOWAT bytes are in (or the peer closed).
_LOW_WATER = sys.platform.startswith("linux") and hasattr(socket, "SO_RCVLOWAT")


class Closable(Protocol):
    """What the acceptor builds (a connection protocol): told how to hand back its slot."""

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
            try:
                sock = socket.socket(family, kind, proto)
            except OSError:  # a family this host lacks (IPv6, often): as create_server
                continue
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
    if not out:
        raise OSError(f"no address to listen on for {host or '*'}:{port}")
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

    async def close(self) -> None:
        """Stop accepting (connections already open stay; handshakes under way stop)."""
        tasks = [*self._tasks, *self._handshakes]
        for task in tasks:
            task.cancel()
        # The accept loops stop watching their sockets before these close.
        await asyncio.gather(*tasks, return_exceptions=True)
        for sock in self.sockets:
            sock.close()

    async def _accept_loop(self, listening: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, address = await loop.sock_accept(listening)
            except asyncio.CancelledError:
                raise
            except (ConnectionAbortedError, InterruptedError):
                continue  # the client gave up before we took it: nothing to do
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
        task = loop.create_task(loop.connect_accepted_socket(
            self._protocol(slot), sock))  # type: ignore[arg-type]

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
            await asyncio.wait_for(self._tls(loop, sock, slot), self.handshake_timeout)
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


    async def _tls(self, loop: asyncio.AbstractEventLoop, sock: socket.socket,
                   slot: Slot) -> None:
        if _LOW_WATER:
            await _first_record(loop, sock)
        await loop.connect_accepted_socket(
            self._protocol(slot), sock, ssl=self.tls)  # type: ignore[arg-type]


async def _first_record(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    """Return once the client's first TLS record is here whole (peeked, not read),
    or once it is plain that it will not be (not a handshake record, the peer
    closed): the TLS layer then takes over and finds out for itself."""
    want = _RECORD_HEADER
    try:
        while True:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, want)
            await _readable(loop, sock)
            head = sock.recv(_RECORD_HEADER, socket.MSG_PEEK)
            # Woken with fewer bytes than the low-water mark: the peer closed
            # or failed; with more than a header that is no handshake: done.
            if len(head) < _RECORD_HEADER or head[0] != _HANDSHAKE:
                return
            whole = min(_RECORD_HEADER + int.from_bytes(head[3:5], "big"), _MAX_RECORD)
            if want >= whole or len(sock.recv(whole, socket.MSG_PEEK)) >= whole:
                return
            want = whole
    except (BlockingIOError, InterruptedError):
        return  # not expected after a wake-up; the TLS layer reads as usual
    finally:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)


async def _readable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    fd = sock.fileno()
    loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


def _abort(sock: socket.socket) -> None:
    """Close at once, with a reset: nothing is owed to this client."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()
