"""The RocksDB store's writer: group commit.

Every change that must be atomic is one ``Ops`` (``rocks_store``), written as
one ``WriteBatch``; callers hand it to ``GroupCommitWriter.submit`` and get a
future that resolves once the change is in the WAL. The writer guarantees:

- changes are written, and their futures resolved, in submission order;
- each change is atomic (never split across writes), and everything pending
  at a write joins it (group commit: one WAL append, one fsync when the
  policy asks for it, for many changes);
- a failed write fails every caller of that write and every later one
  (``failed``): nothing of it is acknowledged.

The changes submitted during one pass of the event loop are one group,
which a callback at the start of the loop's next pass (``call_soon``) writes
in one of two places, never both at once:

- **on the event loop** when the group is small (at most ``INLINE_BYTES``,
  ``Ops.size``), the writer thread has nothing in flight and RocksDB is not
  delaying writes (``write_may_wait``: a stalled write sleeps, and the loop
  must not). A small write without fsync takes microseconds, while crossing
  to the thread and back (queue, thread wake-up, the GIL,
  ``call_soon_threadsafe`` and the loop's self-pipe) took longer, and under
  load the thread's wake-ups and its contention for the GIL slowed the loop;
- **on the writer thread** otherwise: a larger group, every group with
  ``gateway.fsync=always`` (an fsync never runs on the loop), every group
  during a write stall, and every group while the thread still has one in
  flight (so order holds). The group is one item of the thread's queue, so
  a busy loop wakes the thread at most once per pass; the thread merges
  every group queued meanwhile into one write.

Both call ``RocksStore._apply``, one at a time: the loop writes only while the
thread has nothing in flight (counted on the loop, so without a lock), and
the thread receives nothing while the loop writes. A change carrying file
writes or work to do once durable is described in ``rocks_store``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from typing import Any

from .errors import StorageError
from .rocks_store import Ops, RocksStore

log = logging.getLogger(__name__)

# The most bytes (``Ops.size``) the event loop writes in one pass, itself.
INLINE_BYTES = 256 << 10


_STOP = object()


class GroupCommitWriter:
    """Turns concurrent changes into as few writes as possible: the changes of
    one pass of the event loop are one group, written on the loop when it is
    small and the writer thread is idle, else on the thread."""

    def __init__(self, store: RocksStore, loop: asyncio.AbstractEventLoop,
                 inline_bytes: int = INLINE_BYTES) -> None:
        self.store = store
        self.loop = loop
        self.failed: BaseException | None = None
        # An fsync never runs on the loop.
        self._inline_bytes = 0 if store.fsync == "always" else inline_bytes
        # Groups handed to the thread whose futures are not resolved yet
        # (read and written on the loop only).
        self._in_flight = 0
        # This pass's changes, written (or handed over) by _end_pass in the next.
        self._gathered: list[tuple[Ops, asyncio.Future[None]]] = []
        self._gathered_bytes = 0
        # Groups (lists of (ops, future) pairs), then _STOP.
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="rocks-writer", daemon=True)
        self._thread.start()

    def submit(self, ops: Ops) -> asyncio.Future[None]:
        """Queue one atomic change; the future resolves once it is in the WAL.

        Called on the event loop only."""
        future = self.loop.create_future()
        if self.failed is not None:
            future.set_exception(StorageError(f"store failed earlier: {self.failed}"))
            return future
        if not self._gathered:
            self.loop.call_soon(self._end_pass)
        self._gathered.append((ops, future))
        if ops.after:
            # Clean-up after the write (unlinking a segment file, punching out
            # aborted bytes) may wait on the disk, as freeing a big file's
            # extents does: such a pass goes to the thread, never the loop.
            self._gathered_bytes = self._inline_bytes + 1
        elif self._gathered_bytes <= self._inline_bytes:  # no sum once the pass is too big
            self._gathered_bytes += ops.size()
        return future

    def _end_pass(self) -> None:
        """Write this pass's changes on the loop, or hand them to the thread."""
        group = self._gathered
        if not group:
            return
        size = self._gathered_bytes
        self._gathered = []
        self._gathered_bytes = 0
        if self.failed is not None:
            _resolve([future for _, future in group], self.failed)
        elif (self._in_flight or not self._inline_bytes or size > self._inline_bytes
              or self.store.write_may_wait()):
            self._hand_over(group)
        else:
            self._write_on_loop(group)

    def _hand_over(self, group: list[tuple[Ops, asyncio.Future[None]]]) -> None:
        self._in_flight += 1
        self._queue.put(group)

    def _write_on_loop(self, group: list[tuple[Ops, asyncio.Future[None]]]) -> None:
        futures = [future for _, future in group]
        try:
            self.store._apply([ops for ops, _ in group])
        except BaseException as exc:  # the store is unusable: fail loudly, ack nothing
            log.exception("RocksDB write failed; the gateway stops accepting writes")
            self.failed = exc
            _resolve(futures, exc)
            if not isinstance(exc, Exception):
                raise
            return
        self.store.stats.loop_writes += 1
        _resolve(futures, None)

    def _run(self) -> None:
        stop = False
        while not stop:
            groups, stop = self._take()
            if groups:
                self._write(groups)
            # Nothing of a write is held while waiting for the next: its bytes
            # are freed now, and a deleted file's last holder is the reaper
            # (file_reaper), never this thread.
            del groups

    def _take(self) -> tuple[list[list[tuple[Ops, asyncio.Future[None]]]], bool]:
        """The next group, with every group queued behind it (they join one
        write), and whether the writer is to stop after them."""
        item = self._queue.get()
        if item is _STOP:
            return [], True
        groups = [item]
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return groups, False
            if item is _STOP:
                return groups, True
            groups.append(item)

    def _write(self, groups: list[list[tuple[Ops, asyncio.Future[None]]]]) -> None:
        changes = [change for group in groups for change in group]
        error: BaseException | None = self.failed  # queued behind a failed write
        if error is None:
            try:
                self.store._apply([ops for ops, _ in changes])
            except BaseException as exc:  # the store is unusable: fail loudly, ack nothing
                log.exception("RocksDB write failed; the gateway stops accepting writes")
                self.failed = error = exc
        # RuntimeError: the loop closed under us during shutdown.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self._written, len(groups),
                                           [f for _, f in changes], error)

    def _written(self, groups: int, futures: list[asyncio.Future[None]],
                 error: BaseException | None) -> None:
        """On the loop: the thread wrote (or failed to write) these changes."""
        self._in_flight -= groups
        _resolve(futures, error)

    def close(self) -> None:
        """Finish every change submitted (those of this pass too), then stop
        the thread."""
        group, self._gathered, self._gathered_bytes = self._gathered, [], 0
        if group:
            self._hand_over(group)
        self._queue.put(_STOP)
        self._thread.join()


def _resolve(futures: list[asyncio.Future[None]], error: BaseException | None) -> None:
    for future in futures:
        if future.done():
            continue
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(StorageError(str(error)))
