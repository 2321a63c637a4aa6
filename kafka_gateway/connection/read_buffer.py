"""One connection's read buffer, charged to the node's request memory
(request_memory.py, ``queued.max.request.bytes``).

The socket reads into a buffer that grows with the bytes of the frame actually
received (doubling, up to the frame), never sized from the length prefix alone,
charged to the node's budget until the last frame read into it is answered; a
connection with nothing unread holds no buffer at all. A fresh buffer is as
large as the connection's last frame (capped), so a producer of large batches
reads each into one buffer without copies.

A connection whose reads fill all the room they are given has more waiting in
the socket: a client pipelining small requests. Its read-ahead doubles with
each such read (up to ``MAX_READ_AHEAD_BYTES``) and halves with each read that
comes back short, and its buffers are at least that large where the node's
budget has room for it at once, so one read takes many of its frames instead
of one (docs/performance.md, "Reads that take many frames").
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from ..request_memory import FIRST_READ_BYTES, ReadBuffer, RequestMemory
from .state import ConnectionState

# A fresh buffer is sized from the connection's last frame, up to this.
MAX_FRESH_BUFFER_BYTES = 8 << 20
# Less free room than this (and than the frame still misses) gets a new buffer.
MIN_READ_ROOM = 4 << 10
# The most a connection's reads grow to while they keep filling their buffers.
MAX_READ_AHEAD_BYTES = 256 << 10
_SIZE = struct.Struct(">i")


class ConnectionBuffer:
    """Bytes in ``data[start:end]`` are received but not yet a whole frame;
    ``current`` is None while nothing is unread."""

    def __init__(self, state: ConnectionState, memory: RequestMemory,
                 on_granted: Callable[[], None]) -> None:
        self.state = state
        self.memory = memory
        self.on_granted = on_granted  # reading may resume
        self.current: ReadBuffer | None = None
        self.start = 0
        self.end = 0
        self.fresh_size = FIRST_READ_BYTES
        self.read_ahead = FIRST_READ_BYTES
        self.awaiting_memory = False

    @property
    def unread(self) -> int:
        return self.end - self.start

    def get(self) -> memoryview:
        """Where the socket reads next (BufferedProtocol.get_buffer)."""
        buffer = self.current
        if buffer is None:
            buffer = self.current = self.memory.fresh(self._with_read_ahead(self.fresh_size))
            self.start = self.end = 0
        elif self.end == len(buffer.data):  # not expected: prepare_read leaves room
            buffer = self.memory.fresh(self.end - self.start + MIN_READ_ROOM)
            self._move_to(buffer)
        return memoryview(buffer.data)[self.end :]

    def received(self, nbytes: int) -> None:
        """The socket read ``nbytes`` into the room ``get`` gave it."""
        self.end += nbytes
        assert self.current is not None  # get() gave it
        if self.end == len(self.current.data):  # filled: more is likely waiting
            self.read_ahead = min(2 * self.read_ahead, MAX_READ_AHEAD_BYTES)
        elif self.read_ahead > FIRST_READ_BYTES:
            self.read_ahead //= 2

    def _with_read_ahead(self, size: int) -> int:
        """``size``, or the read-ahead if larger and the budget has room for it now:
        a pipelining client's buffer also holds the frames behind the one being
        read, but never waits for memory to do so."""
        if self.read_ahead > size and self.memory.grants_now(self.read_ahead):
            return self.read_ahead
        return size

    def frame_taken(self, size: int) -> None:
        """A whole frame of ``size`` bytes (less its prefix) was handed on."""
        self.start += 4 + size
        self.fresh_size = min(max(FIRST_READ_BYTES, 4 + size), MAX_FRESH_BUFFER_BYTES)
        self.memory.frame_received(self)

    def prepare_read(self) -> None:
        """Leave room for the next read: drop an emptied buffer, grow for a partial frame."""
        buffer = self.current
        assert buffer is not None
        unread = self.end - self.start
        if unread == 0:
            self.current = None
            self.start = self.end = 0
            if not buffer.frames:
                self.memory.retire(buffer)
            return
        if unread >= 4:
            whole = 4 + _SIZE.unpack_from(buffer.data, self.start)[0]
            missing = whole - unread
        else:
            whole, missing = FIRST_READ_BYTES, 4 - unread
        if len(buffer.data) - self.end >= min(missing, MIN_READ_ROOM):
            return
        # Grow with what arrived (doubling), never straight to the declared size:
        # a length prefix alone must not reserve memory.
        size = self._with_read_ahead(min(whole, max(2 * unread, self.fresh_size)))
        granted = self.memory.request(self, size, whole)
        if granted is None:
            self.awaiting_memory = True  # memory_granted resumes reading
        else:
            self._move_to(granted)

    def memory_granted(self, buffer: ReadBuffer) -> None:
        """RequestMemory's answer to a request it could not grant at once."""
        if self.state.closing:
            self.memory.retire(buffer)
            return
        self.awaiting_memory = False
        self._move_to(buffer)
        self.on_granted()

    def _move_to(self, buffer: ReadBuffer) -> None:
        """Move the unread bytes to ``buffer``; the old one lives on while frames view it."""
        old = self.current
        assert old is not None
        unread = self.end - self.start
        buffer.data[:unread] = memoryview(old.data)[self.start : self.end]
        self.current, self.start, self.end = buffer, 0, unread
        if not old.frames:
            self.memory.retire(old)

    def answered(self, buffer: ReadBuffer) -> None:
        """A frame read into ``buffer`` was answered: retire it once no frame needs it."""
        buffer.frames -= 1
        if not buffer.frames and buffer is not self.current:
            self.memory.retire(buffer)

    def release(self) -> None:
        """The connection closed: it waits for no memory and holds no buffer."""
        self.memory.forget(self)
        if self.current is not None:
            self.memory.retire(self.current)
            self.current = None
