"""The RocksDB database of a gateway node: opened with its options, read, and
written one group of atomic changes at a time.

Every change that must be atomic is one ``Ops`` (the seam's opaque
``AtomicChange``), written as one ``WriteBatch`` by ``RocksStore._apply``; the
group commit (``store.GroupCommitWriter``) decides when and on which thread,
and gathers many changes into one call.

A change may also carry file writes (``Ops.write_file``: record bytes going
to a segment file, ``segment_files``) and work to do once it is durable
(``Ops.after_write``: unlinking a dead file, reclaiming aborted bytes).
``_apply`` writes the files first, fdatasyncs them when the policy is
``always``, then makes the RocksDB write that indexes them: an index entry
never lands before the bytes it points at. ``Ops.size`` counts the file
bytes too, so a change carrying big batches is written on the thread.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal, Protocol

from rocksdict import (
    BlockBasedOptions,
    DBCompressionType,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
    WriteOptions,
)

from .seam import AtomicChange, WriteStats

# The store's logger, by the name it had before the writer moved to its own
# module: operators' log filters and the log lines (%(name)s) stay the same.
log = logging.getLogger("tablets.store")

FsyncPolicy = Literal["never", "always"]


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
