"""Request memory: ``queued.max.request.bytes``, shared by every connection of the node.

``RequestMemory``: every connection reads into buffers charged to one node-wide
budget, from allocation until they are freed (their last frame answered and
dropped by whoever held it). A connection whose next buffer does not fit waits,
its reading paused, in arrival order. Buffers grow with the bytes that arrive,
so what a connection holds is charged for bytes it was actually sent, not for
a length it declared.

Half-received frames hold memory while they wait for more, so a budget spent
on them alone could wait forever. One overdraft slot prevents that: when the
head waiter does not fit and the slot is free, it gets the whole frame it is
receiving past the budget; the slot is free again once that frame's buffer is
freed. So memory is bounded by the budget plus one frame (at most
``socket.request.max.bytes``), and a frame larger than the budget is still
served. Each connection may also always read into a small fresh buffer
(``FIRST_READ_BYTES``), as it always has kernel socket buffers.

(Not to be confused with body_bounds.py, which checks one request body's
lengths against its frame before kio decodes it.)
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections import deque
from typing import Protocol

from .metrics import Metrics

# A fresh buffer, before a connection has sent a larger frame.
FIRST_READ_BYTES = 16 << 10
FULL_COLLECT_INTERVAL_SECONDS = 1.0


class _Bytes(bytearray):
    """A bytearray that returns its charge when it is freed (``__del__``: wherever
    its last reference goes, or the collector frees a cycle holding it). Cheaper than
    a ``weakref.finalize`` per buffer, which registers and unregisters each one: a
    buffer is allocated for about every request of a producer of small batches."""

    __slots__ = ("_charge", "_memory")
    _memory: RequestMemory
    _charge: _Charge

    def __del__(self) -> None:
        self._memory._freed(self._charge)


class _Charge:
    __slots__ = ("overdraft", "retired", "size")

    def __init__(self, size: int, overdraft: bool) -> None:
        self.size = size
        self.overdraft = overdraft
        self.retired = False  # its connection is done with it


class ReadBuffer:
    """A connection's read buffer, charged to the node's budget until it is freed.

    ``frames`` counts the frames read into it whose requests are not answered
    yet. The charge is returned when ``data`` is actually freed, not when the
    connection is done with it: a handler that keeps a view of a frame (or a
    reference cycle that does, until the garbage collector runs) keeps its
    memory charged, so the budget bounds what the process really holds.
    """

    __slots__ = ("charge", "data", "frames")

    def __init__(self, data: _Bytes, charge: _Charge) -> None:
        self.data = data
        self.charge = charge
        self.frames = 0


class MemoryWaiter(Protocol):
    def memory_granted(self, buffer: ReadBuffer) -> None: ...


class RequestMemory:
    def __init__(self, limit: int, metrics: Metrics) -> None:
        self.limit = limit if limit > 0 else None  # <= 0: no limit, as Kafka's -1
        self.used = 0
        self.metrics = metrics
        self._waiting: deque[tuple[MemoryWaiter, int, int]] = deque()
        self._overdraft_owner: MemoryWaiter | None = None  # receiving its overdraft frame
        self._overdraft_bytes = 0  # overdraft buffers not freed yet
        self._retired_bytes = 0  # buffers no connection needs, not freed yet
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake_scheduled = False
        self._last_full_collect = 0.0

    def _fits(self, size: int) -> bool:
        return self.limit is None or self.used + size <= self.limit

    @property
    def _overdraft_free(self) -> bool:
        return self._overdraft_owner is None and self._overdraft_bytes == 0

    def grants_now(self, size: int) -> bool:
        """Whether ``request`` would grant ``size`` bytes at once, within the budget
        and ahead of no waiter."""
        return not self._waiting and self._fits(size)

    def fresh(self, size: int) -> ReadBuffer:
        """A buffer for a connection with nothing unread: never refused.

        It is ``size`` if that fits, else ``FIRST_READ_BYTES``.
        """
        if self._waiting or not self._fits(size):
            size = min(size, FIRST_READ_BYTES)
        return self._charge(size, overdraft=False)

    def request(self, waiter: MemoryWaiter, size: int, whole: int) -> ReadBuffer | None:
        """A buffer of ``size`` bytes for a frame of ``whole`` bytes being received.

        None when it does not fit now: ``waiter.memory_granted`` gets it later.
        """
        if waiter is self._overdraft_owner:
            return self._charge(whole, overdraft=True)
        if not self._waiting:
            if self._fits(size):
                return self._charge(size, overdraft=False)
            if self._overdraft_free:
                self._overdraft_owner = waiter
                return self._charge(whole, overdraft=True)
        self._waiting.append((waiter, size, whole))
        self._schedule_wake()  # what blocks it may be garbage waiting for a collection
        return None

    def frame_received(self, waiter: MemoryWaiter) -> None:
        """The overdraft owner has its frame: the slot frees with the frame's buffer."""
        if waiter is self._overdraft_owner:
            self._overdraft_owner = None
            self._schedule_wake()

    def retire(self, buffer: ReadBuffer) -> None:
        """Its connection is done with it (no frame of it unanswered, not read into)."""
        charge = buffer.charge
        if not charge.retired:
            charge.retired = True
            self._retired_bytes += charge.size

    def forget(self, waiter: MemoryWaiter) -> None:
        """A connection closed: it waits no more and gives up the overdraft."""
        if any(w is waiter for w, _size, _whole in self._waiting):
            self._waiting = deque(item for item in self._waiting if item[0] is not waiter)
        if waiter is self._overdraft_owner:
            self._overdraft_owner = None
        self._schedule_wake()

    def _charge(self, size: int, overdraft: bool) -> ReadBuffer:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        if overdraft:
            self._overdraft_bytes += size
        else:
            self.used += size
        self.metrics.request_memory_bytes = self.used + self._overdraft_bytes
        charge = _Charge(size, overdraft)
        data = _Bytes(size)  # no __init__ of its own: a Python frame less per buffer
        data._memory, data._charge = self, charge
        return ReadBuffer(data, charge)

    def _freed(self, charge: _Charge) -> None:
        # Runs wherever the last reference went: only bookkeeping here.
        if charge.overdraft:
            self._overdraft_bytes -= charge.size
        else:
            self.used -= charge.size
        if charge.retired:
            self._retired_bytes -= charge.size
        self.metrics.request_memory_bytes = self.used + self._overdraft_bytes
        if self._waiting:
            self._schedule_wake()

    def _schedule_wake(self) -> None:
        if not self._wake_scheduled and self._loop is not None and not self._loop.is_closed():
            self._wake_scheduled = True
            self._loop.call_soon(self._wake)

    def _wake(self) -> None:
        self._wake_scheduled = False
        while self._waiting:
            waiter, size, whole = self._waiting[0]
            if self._fits(size):
                buffer = self._charge(size, overdraft=False)
            elif self._overdraft_free:
                self._overdraft_owner = waiter
                buffer = self._charge(whole, overdraft=True)
            else:
                self._collect_garbage()
                return
            self._waiting.popleft()
            waiter.memory_granted(buffer)

    def _collect_garbage(self) -> None:
        """Free retired buffers that only reference cycles still hold, if any.

        A young collection is cheap; a full one runs at most once a second.
        The frees it causes schedule the next wake.
        """
        if not self._retired_bytes:
            return
        before = self._retired_bytes
        gc.collect(1)
        if self._retired_bytes == before:
            now = time.monotonic()
            if now - self._last_full_collect >= FULL_COLLECT_INTERVAL_SECONDS:
                self._last_full_collect = now
                gc.collect()
            elif self._loop is not None:
                self._loop.call_later(FULL_COLLECT_INTERVAL_SECONDS, self._schedule_wake)
