"""The RocksDB database and its writer (group commit).

Every change that must be atomic is one ``Ops``, written as one
``WriteBatch``; callers hand it to ``GroupCommitWriter.submit`` and get a
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
the thread receives nothing while the loop writes.

A change may also carry file writes (``Ops.write_file``: record bytes going
to a segment file, ``segment_files``) and work to do once it is durable
(``Ops.after_write``: unlinking a dead file, reclaiming aborted bytes).
``_apply`` writes the files first, fdatasyncs them when the policy is
``always``, then makes the RocksDB write that indexes them: an index entry
never lands before the bytes it points at. ``Ops.size`` counts the file
bytes too, so a change carrying big batches is written on the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from rocksdict import (
    BlockBasedOptions,
    DBCompressionType,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
    WriteOptions,
)

from .errors import StorageError
from .seam import AtomicChange, WriteStats

log = logging.getLogger(__name__)

FsyncPolicy = Literal["never", "always"]
# The most bytes (``Ops.size``) the event loop writes in one pass, itself.
INLINE_BYTES = 256 << 10


class WritableFile(Protocol):
    """A file a change appends to (``segment_files.SegmentFile``)."""

    def fileno(self) -> int: ...

    def sync(self) -> None:
        """Make what was written durable (and the file's directory entry, if new)."""


@dataclass(slots=True)
class Ops(AtomicChange):
    """The operations of one atomic change, in order."""

    puts: list[tuple[bytes, bytes]] = field(default_factory=list)
    deletes: list[bytes] = field(default_factory=list)
    delete_ranges: list[tuple[bytes, bytes]] = field(default_factory=list)
    # Bytes written to files before the RocksDB write: (file, position, data).
    writes: list[tuple[WritableFile, int, bytes | memoryview]] = field(default_factory=list)
    # Run once the change is written, on the writer thread (a change that has
    # any is never written on the loop): unlinking dead files, punching out
    # aborted bytes.
    after: list[Callable[[], None]] = field(default_factory=list)

    def write_file(self, file: WritableFile, position: int, data: bytes | memoryview) -> None:
        self.writes.append((file, position, data))

    def after_write(self, action: Callable[[], None]) -> None:
        self.after.append(action)

    def put(self, key: bytes, value: bytes) -> None:
        self.puts.append((key, value))

    def delete(self, key: bytes) -> None:
        self.deletes.append(key)

    def delete_range(self, start: bytes, end: bytes) -> None:
        self.delete_ranges.append((start, end))

    def size(self) -> int:
        """The bytes a write of this change copies: what decides whether the
        event loop may write it (anything ``_apply`` writes counts here)."""
        return (sum([len(key) + len(value) for key, value in self.puts])
                + sum([len(data) for _file, _position, data in self.writes]))

WriterStats = WriteStats  # the seam's name for the same counters


class RocksStore:
    """One RocksDB database per gateway node, opened in raw (bytes) mode."""

    def __init__(self, path: str, fsync: FsyncPolicy = "never") -> None:
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        options.set_max_background_jobs(2)
        options.set_write_buffer_size(64 << 20)
        # Record batches arrive compressed by the client, or are incompressible
        # payloads: compressing them again costs CPU on every flush and read.
        options.set_compression_type(DBCompressionType.none())
        # Record bytes live in segment files (``segment_files``): the values
        # here are small (index entries of about 80 bytes), so no blob files.
        # A data directory of format 1 may still hold blob files: RocksDB
        # reads them without the option (the migration reads them once).
        options.set_enable_blob_files(False)
        table = BlockBasedOptions()
        table.set_block_size(64 << 10)
        options.set_block_based_table_factory(table)
        self.path = path
        self.db = Rdict(path, options)
        self.fsync = fsync
        self._write_options = WriteOptions()
        self._write_options.sync = fsync == "always"
        self.stats = WriterStats()
        # Reads of cold data (older than a tablet's in-memory tail) run here.
        self.readers = ThreadPoolExecutor(max_workers=4, thread_name_prefix="rocks-read")

    def get(self, key: bytes) -> bytes | None:
        return self.db.get(key)

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Keys in [start, end), in order."""
        it = self.db.iter(ReadOptions())
        it.seek(start)
        while it.valid():
            key = it.key()
            if key >= end:
                return
            yield key, it.value()
            it.next()

    def scan_from_containing(
        self, start: bytes, floor: bytes, end: bytes
    ) -> Iterator[tuple[bytes, bytes]]:
        """Keys in [floor, end) from the last one at or before ``start``, in order.

        The read path of a fetch below a tablet's in-memory tail: one bounded
        iterator with readahead. Checksums are not verified again, as Kafka's
        own fetch path (sendfile) does not: each batch's CRC was checked when it
        was produced, and consumers may check it again.
        """
        options = ReadOptions()
        options.set_iterate_lower_bound(floor)
        options.set_iterate_upper_bound(end)
        options.set_verify_checksums(False)
        options.set_readahead_size(2 << 20)
        it = self.db.iter(options)
        it.seek_for_prev(start)
        # The lower bound does not hold for seek_for_prev: a key below the
        # floor (another kind's, another partition's) means none at or before
        # start (a compacted log's first batch may begin after its log start).
        if not it.valid() or it.key() < floor:
            it.seek(floor)
        while it.valid():
            yield it.key(), it.value()
            it.next()

    def scan_reverse(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Keys in [start, end), newest first."""
        options = ReadOptions()
        options.set_iterate_lower_bound(start)
        options.set_iterate_upper_bound(end)
        it = self.db.iter(options)
        it.seek_for_prev(end)
        while it.valid():
            key = it.key()
            if key < start:
                return
            if key < end:
                yield key, it.value()
            it.prev()

    def write_may_wait(self) -> bool:
        """Whether RocksDB is delaying or stopping writes now (a write stall:
        too many memtables or level-0 files waiting for a flush or compaction),
        so that a write may sleep. About 0.3 us to ask."""
        db = self.db
        return bool(db.property_int_value("rocksdb.actual-delayed-write-rate")
                    or db.property_int_value("rocksdb.is-write-stopped"))

    def write_now(self, ops: Ops, durable: bool = False) -> None:
        """Apply one change synchronously (start-up and tests only); with
        ``durable``, synced whatever the fsync policy (a migration)."""
        self._apply([ops], durable)

    def _apply(self, changes: list[Ops], durable: bool = False) -> None:
        written: dict[int, WritableFile] = {}
        size = 0
        for ops in changes:
            for file, position, data in ops.writes:
                _pwrite_all(file.fileno(), data, position)
                written[id(file)] = file
                size += len(data)
        write_options = self._write_options
        if durable and not write_options.sync:
            write_options = WriteOptions()
            write_options.sync = True
        if written and write_options.sync:
            for file in written.values():
                file.sync()
        batch = WriteBatch(raw_mode=True)
        for ops in changes:
            for start, end in ops.delete_ranges:
                batch.delete_range(start, end)
            for key in ops.deletes:
                batch.delete(key)
            for key, value in ops.puts:
                batch.put(key, value)
                size += len(key) + len(value)
        started = time.perf_counter()
        self.db.write(batch, write_options)
        stats = self.stats
        seconds = time.perf_counter() - started
        stats.write_seconds += seconds
        stats.write_latency.observe(seconds)
        stats.group_sizes.observe(len(changes))
        stats.writes += 1
        stats.changes += len(changes)
        stats.fsyncs += self._write_options.sync
        stats.bytes += size
        for ops in changes:
            for action in ops.after:
                try:
                    action()
                except Exception:  # reclaiming space failed: the data is safe, log it
                    log.exception("clean-up after a write failed")

    def close(self) -> None:
        self.readers.shutdown(wait=True)
        self.db.close()


def _pwrite_all(fd: int, data: bytes | memoryview, position: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, position)
        view = view[written:]
        position += written


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
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            groups = [item]
            stop = False
            # Everything queued while the last write ran joins this one.
            while True:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stop = True
                    break
                groups.append(nxt)
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
            if stop:
                return

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
