"""Answers holding file regions: record bytes sent with ``os.sendfile``.

An engine that keeps record bytes in files hands a Fetch its batches as
``FileRegion``s (tablets/seam.py) rather than bytes. On a plaintext listener
each region goes from the page cache to the socket with ``os.sendfile``: no
record byte is read into Python, copied or joined. On a TLS listener the bytes
must pass through Python to be encrypted: there a region is read (one
``os.pread``, on the loop: a copy from the page cache, where a Fetch's bytes
mostly are) and written through the transport like any other bytes
(``Answers.write``).

How a region is sent, the same way under uvloop (deployed) and the stdlib loop:

- the bytes before it (the response header, the partition's fields) go
  through the transport as usual;
- the region waits until the transport's buffer is empty
  (``get_write_buffer_size() == 0``): then the transport has nothing queued
  and writes nothing until it is handed more, and nothing hands it more
  meanwhile (answers are written one at a time: ``Answers.sending``), so the
  socket's descriptor is ours to write to;
- ``os.sendfile`` on it, in a loop, on the event loop (the socket is
  non-blocking, as every transport's is: a call never waits). When the
  socket's buffer is full (EAGAIN), the loop watches for writability and
  carries on then. It watches a ``dup`` of the descriptor: both loops refuse
  ``add_writer`` on a descriptor their transport owns. Meanwhile the
  connection counts as not writable (``ConnectionState.sendfile_waiting``):
  no new request is taken, the next Fetch waits, and the idle timeout runs,
  as when the transport's own buffer is full;
- then the rest of the answer, through the transport.

The socket is corked (``TCP_CORK``) from the first byte of such an answer to
its last: the few bytes before a region, the region and the few after it
leave as full segments, not as three pushes. Measured on loopback (1 MiB
Fetches, uvloop): uncorked, the two small extra segments per answer cost the
gateway 0.41-0.47 CPU s/GiB and 0.6-1.05 ms per Fetch; corked, 0.18-0.21 s/GiB
and 0.32-0.40 ms, the cheapest way measured (reading the region and writing it
through the transport: 0.18-0.30 s/GiB, 0.33-0.68 ms; docs/performance.md).

A client gone meanwhile (EPIPE or ECONNRESET from ``sendfile``, or the
connection lost while waiting) ends the send quietly: ``Answers.cancel``
stops the watch and closes the dup, which would otherwise keep the socket
open. Any other failure (an I/O error, a region past its file's end) is
logged and counted as a refused write and closes the connection: the frame's
length is already on the wire, so the connection cannot carry on.

Why not ``loop.sendfile``: uvloop does not implement it, and the stdlib's
pauses reading and wants a seekable file object; the loop here is what the
stdlib's ``sock_sendfile`` does, minus those.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Callable, Iterator, Sequence
from typing import cast

from tablets.seam import FileRegion

from .state import ConnectionState, SocketLike

log = logging.getLogger(__package__)

_CORK = getattr(socket, "TCP_CORK", None)  # Linux; elsewhere answers go uncorked

# What an answer is made of: bytes, and regions of the engine's files.
AnswerChunks = Sequence[bytes | bytearray | FileRegion]
BytesRun = list[bytes | bytearray]


def has_regions(chunks: AnswerChunks) -> bool:
    return any(isinstance(chunk, FileRegion) for chunk in chunks)


def region_bytes(chunks: AnswerChunks) -> int:
    """Bytes of an answer that lie in files."""
    return sum(len(chunk) for chunk in chunks if isinstance(chunk, FileRegion))


def read_regions(chunks: AnswerChunks) -> Sequence[bytes | bytearray]:
    """The answer as bytes only (TLS), each region read with one ``os.pread``;
    ``chunks`` itself when it has none (the usual case, no copy of the list)."""
    if not has_regions(chunks):
        return cast(Sequence[bytes | bytearray], chunks)  # checked: bytes only
    return [chunk.read() if isinstance(chunk, FileRegion) else chunk for chunk in chunks]


def _pieces(chunks: AnswerChunks) -> Iterator[BytesRun | FileRegion]:
    """Runs of bytes (one ``writelines`` each) and the regions between them."""
    run: BytesRun = []
    for chunk in chunks:
        if isinstance(chunk, FileRegion):
            if run:
                yield run
                run = []
            if chunk.length:
                yield chunk
        else:
            run.append(chunk)
    if run:
        yield run


class RegionSend:
    """One answer with file regions, being written to a plaintext socket.

    ``run()`` writes as much as the socket takes at once: True when all is
    written, False when it failed or the connection closed (the connection
    is closing), None when it waits for the socket; then ``done(ok)`` is
    called once it has finished (not if cancelled)."""

    __slots__ = ("_pieces", "corked", "done", "fd", "offset", "region", "sock", "state",
                 "waiting", "watch_fd", "write_bytes")

    def __init__(self, state: ConnectionState, sock: SocketLike, chunks: AnswerChunks,
                 write_bytes: Callable[[BytesRun], bool], done: Callable[[bool], None],
                 waiting: Callable[[bool], None]) -> None:
        self.state = state
        self.sock = sock  # the transport's socket (only setsockopt is used)
        self.fd = sock.fileno()  # its descriptor, owned by the transport
        self.corked = False
        self._pieces = _pieces(chunks)
        self.write_bytes = write_bytes  # through the transport (Answers.write)
        self.done = done
        self.waiting = waiting  # the connection cannot write (True) or can again (False)
        self.region: FileRegion | None = None
        self.offset = 0  # bytes of ``region`` sent
        self.watch_fd = -1  # a dup of ``fd``, watched for writability while waiting

    def run(self) -> bool | None:
        if not self.corked:
            self._cork(True)
        result = self._run()
        if result is not None:
            self._cork(False)  # pushes what is left of the answer
        return result

    def _cork(self, on: bool) -> None:
        if _CORK is None or self.corked == on:
            return
        self.corked = on
        # OSError: the connection is gone, nothing to hold back or push.
        with contextlib.suppress(OSError):
            self.sock.setsockopt(socket.IPPROTO_TCP, _CORK, int(on))

    def _run(self) -> bool | None:
        state = self.state
        transport = state.transport
        while True:
            if transport is None or transport.is_closing() or state.closing:
                return False
            region = self.region
            if region is None:
                piece = next(self._pieces, None)
                if piece is None:
                    return True
                if isinstance(piece, FileRegion):
                    self.region, self.offset = piece, 0
                elif not self.write_bytes(piece):
                    return False
                continue
            if transport.get_write_buffer_size():
                self._wait()  # for the bytes before the region to leave first
                return None
            try:
                sent = os.sendfile(self.fd, region.file.fileno(), region.offset + self.offset,
                                   region.length - self.offset)
            except BlockingIOError:
                self._wait()
                return None
            except (BrokenPipeError, ConnectionResetError) as exc:
                log.debug("%s went away during a sendfile: %s", state.peer, exc)
                state.close()
                return False
            except (OSError, ValueError) as exc:  # ValueError: the file object was closed
                self._fail(region, exc)
                return False
            if not sent:  # the file ends before the region does
                self._fail(region, OSError(f"the file ends {region.length - self.offset} "
                                           f"bytes before the region"))
                return False
            self.offset += sent
            state.metrics.bytes_out += sent
            state.metrics.sendfile_bytes += sent
            state.active()
            if self.offset == region.length:
                self.region = None

    def _fail(self, region: FileRegion, exc: BaseException) -> None:
        state = self.state
        state.metrics.response_write_failures += 1
        state.bad_input.log(state.address, logging.ERROR,
                            "closing %s: sending a file region of %d bytes failed: %s",
                            state.peer, region.length, exc)
        state.close()

    def _wait(self) -> None:
        if self.watch_fd < 0:
            self.watch_fd = os.dup(self.fd)
            self.state.loop.add_writer(self.watch_fd, self._writable)
            self.waiting(True)

    def _writable(self) -> None:
        result = self.run()
        if result is not None:
            self._stop_watching()
            self.done(result)

    def _stop_watching(self) -> None:
        if self.watch_fd >= 0:
            self.state.loop.remove_writer(self.watch_fd)
            os.close(self.watch_fd)
            self.watch_fd = -1
            self.waiting(False)

    def cancel(self) -> None:
        """The connection closed: stop, holding no descriptor and no region."""
        self._cork(False)
        self._stop_watching()
        self.region = None
        self._pieces = iter(())
