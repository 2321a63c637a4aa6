"""Reading a partition's log (``LogReads``, a collaborator its
``PartitionTablet`` holds): Fetch from the in-memory tail (bytes) or from the
segment files (``FileRegion``s: the bytes are never read here); long-poll
waiters woken when the high watermark moves; ListOffsets by timestamp
through the time index (which reads the batches it looks into).

Below the tail, a read is served on the event loop, without a hand-off to a
reader thread: one bounded RocksDB iterator walks the small index entries
(``log_entry.file_entry``) from the one holding the offset, and the batches
become one region per run of batches lying end to end in one file (fewer
``sendfile`` calls). A committed transactional batch, whose file copy still
has base offset 0, is its patched first bytes, then a region of the rest.
There is no read-ahead: the page cache reads the files ahead, and the index
walk a read-ahead would save is what a read costs anyway (docs/performance.md).

Readers never take the log lock: a compaction swap or a truncation changes
entries under them one WriteBatch at a time. A read sees the index as of its
iterator (a RocksDB snapshot), and the whole read runs on the loop with no
await, so the tablet's state cannot move under it; the one thing that can is
the writer thread deleting a file a swap or retention emptied, once that
change is durable. An entry naming such a file is read again, as it is now
(``_regions``). A region handed out keeps its file open
(``seam.FileRegion``): ``PartitionFiles`` never closes a file, it only
unlinks it, so a region outlives the file's deletion.
"""

from __future__ import annotations

import asyncio
from array import array
from bisect import bisect_left
from typing import TYPE_CHECKING, Protocol

from . import batch as batch_header
from . import keys, log_entry
from .errors import OffsetOutOfRange
from .in_memory_batches import InMemoryBatches
from .records import first_record_at_or_after
from .rocks_store import Ops
from .seam import FileRegion, ReadResult

if TYPE_CHECKING:
    from io import FileIO

    from .rocks_store import RocksStore
    from .segment_files import PartitionFiles


class LogState(Protocol):
    """The partition state reads look at and publish (``PartitionTablet``):
    its offsets, its in-memory tail and its time index, which appends,
    commits, truncation and compaction change."""

    prefix: bytes
    log_start_offset: int
    log_end_offset: int
    high_watermark: int
    _tail: InMemoryBatches
    _ts_offsets: array[int]
    _ts_values: array[int]


class LogReads:
    def __init__(self, store: RocksStore, files: PartitionFiles, state: LogState,
                 tail_cache_bytes: int) -> None:
        self.store = store
        self.files = files
        self.state = state
        self._tail_cache_bytes = tail_cache_bytes
        self._waiters: set[asyncio.Future[None]] = set()

    # ------------------------------------------------------------ in memory
    def cache(self, offset: int, data: bytes) -> None:
        """A batch just appended joins the tail (the oldest leave past the budget)."""
        tail = self.state._tail
        tail.append(offset, data)
        tail.trim(self._tail_cache_bytes)

    @property
    def tail_start(self) -> int:
        """The first offset the in-memory tail serves."""
        return self.state._tail.first_offset(default=self.state.log_end_offset)

    def set_tail_budget(self, nbytes: int) -> None:
        """This partition's share of the node's in-memory tail budget."""
        self._tail_cache_bytes = nbytes
        self.state._tail.trim(nbytes)

    def release(self) -> None:
        """The partition is deleted: wake its fetchers and free its memory."""
        self.wake_waiters()
        state = self.state
        state._tail = InMemoryBatches()
        state._ts_offsets, state._ts_values = array("q"), array("q")

    def read_entry(self, entry: bytes) -> bytes:
        """The batch a log entry stands for, read from its file."""
        return self.files.read(entry)

    def index_timestamp(self, offset: int, max_timestamp: int, ops: Ops) -> None:
        state = self.state
        if not state._ts_values or max_timestamp > state._ts_values[-1]:
            state._ts_offsets.append(offset)
            state._ts_values.append(max_timestamp)
            ops.put(keys.offset_key(keys.TIME_INDEX, state.prefix, offset),
                    max_timestamp.to_bytes(8, "big", signed=True))

    def advance_high_watermark(self, offset: int) -> None:
        if offset > self.state.high_watermark:
            self.state.high_watermark = offset
            self.wake_waiters()

    # ------------------------------------------------------------------ read
    @property
    def last_stable_offset(self) -> int:
        # Transactional data reaches the log only when committed.
        return self.state.high_watermark

    def read(self, offset: int, max_bytes: int, min_one: bool = True) -> ReadResult:
        """Batches from the one containing ``offset``, up to ``max_bytes``.

        With ``min_one`` the first batch is returned whole even when larger
        (KIP-74). Reads at or past the high watermark return nothing; reads
        outside [log start, log end] raise OffsetOutOfRange. Runs on the
        calling thread (the event loop): it waits on nothing but RocksDB's
        index blocks (cached), never on record bytes.
        """
        state = self.state
        hw = state.high_watermark
        if offset < state.log_start_offset or offset > state.log_end_offset:
            raise OffsetOutOfRange(
                f"offset {offset} is outside [{state.log_start_offset}, {state.log_end_offset}]"
            )
        if offset >= hw:  # at the end, or in a write not yet in the WAL
            return ReadResult([], hw, state.log_start_offset)
        if offset >= self.tail_start:
            batches = state._tail.slice(offset, hw, max_bytes, min_one)
        else:
            batches = self._regions(offset, hw, max_bytes, min_one)
        return ReadResult(batches, hw, state.log_start_offset)

    def _regions(self, offset: int, hw: int, max_bytes: int,
                 min_one: bool) -> list[bytes | FileRegion]:
        """The batches from the one holding ``offset`` up to ``max_bytes`` (and
        below ``hw``), as regions of their files, one per run of batches lying
        end to end in one file."""
        out: list[bytes | FileRegion] = []
        total = 0
        # The run of batches being gathered: its file, start and end.
        run_file: FileIO | None = None
        run_start = run_end = 0
        prefix = self.state.prefix
        floor = keys.LOG + prefix
        start = keys.offset_key(keys.LOG, prefix, offset)
        end = keys.offset_key(keys.LOG, prefix, hw)
        for key, entry in self.store.scan_from_containing(start, floor, end):
            base, last, size, no, position, shifted = log_entry.span(entry)
            if last < offset:
                continue
            file = self.files.open_file(no)
            if file is None:
                # A compaction swap or retention replaced the batch and the
                # writer thread deleted its file after this scan began: read
                # the entry as it is now (gone: retention removed it).
                current = self.store.get(key)
                if current is None:
                    continue
                entry = current
                base, last, size, no, position, shifted = log_entry.span(entry)
                if last < offset:
                    continue
                file = self.files.open_file(no)
                if file is None:
                    raise log_entry.MissingBlob(
                        f"log entry at offset {base} names segment file {no}, which is gone")
            if total + size > max_bytes and (out or run_file is not None or not min_one):
                break
            if shifted:
                # Committed transactional: its first bytes patched, then the rest.
                if run_file is not None:
                    out.append(FileRegion(run_file, run_start, run_end - run_start))
                    run_file = None
                out.append(bytes(entry[:log_entry.PREFIX_SIZE]))
                position += log_entry.PREFIX_SIZE
            if file is not run_file or position != run_end:
                if run_file is not None:
                    out.append(FileRegion(run_file, run_start, run_end - run_start))
                run_file, run_start = file, position
            run_end = position + size - (log_entry.PREFIX_SIZE if shifted else 0)
            total += size
            offset = last + 1  # a batch read again may cover the next ones
        if run_file is not None:
            out.append(FileRegion(run_file, run_start, run_end - run_start))
        return out

    # ------------------------------------------------------------- long-poll
    def waiter(self) -> asyncio.Future[None]:
        """A future resolved the next time the high watermark moves."""
        future = asyncio.get_running_loop().create_future()
        self._waiters.add(future)
        return future

    def forget_waiter(self, future: asyncio.Future[None]) -> None:
        """Drop a waiter whose fetch stopped waiting (timeout, other partition)."""
        self._waiters.discard(future)

    def wake_waiters(self) -> None:
        waiters, self._waiters = self._waiters, set()
        for future in waiters:
            if not future.done():
                future.set_result(None)

    # ------------------------------------------------------ offsets by time
    def _batch_at(self, offset: int) -> bytes | None:
        """The stored batch containing ``offset``, read (a blocking read)."""
        prefix = self.state.prefix
        floor = keys.LOG + prefix
        start = keys.offset_key(keys.LOG, prefix, offset)
        end = keys.offset_key(keys.LOG, prefix, self.state.high_watermark)
        for key, entry in self.store.scan_from_containing(start, floor, end):
            if batch_header.last_offset_of(entry) < offset:
                continue
            try:
                return self.files.read(entry)
            except log_entry.MissingBlob:  # replaced meanwhile: as it is now
                current = self.store.get(key)
                if current is not None:
                    return self.files.read(current)
        return None

    def _first_record_at_or_after(self, target: int) -> tuple[int, int] | None:
        state = self.state
        index = bisect_left(state._ts_values, target)
        if index == len(state._ts_values):
            return None
        offset = max(state._ts_offsets[index - 1] if index else 0, state.log_start_offset)
        hw = state.high_watermark
        # The first batch whose max timestamp reaches the target is at
        # _ts_offsets[index]; scanning from the previous entry keeps the
        # answer exact after retention trimmed the index.
        while offset < hw:
            data = self._batch_at(offset)
            if data is None:
                return None
            if batch_header.max_timestamp_of(data) >= target:
                found = first_record_at_or_after(data, target, state.log_start_offset)
                if found is not None:
                    return found
            offset = batch_header.last_offset_of(data) + 1
        return None

    async def offset_for_timestamp(self, target: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record stamped at or after ``target``."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self.store.readers, self._first_record_at_or_after, target
        )

    async def max_timestamp(self) -> tuple[int, int] | None:
        """(offset, timestamp) of the record with the largest timestamp."""
        state = self.state
        if not state._ts_values or state.high_watermark == state.log_start_offset:
            return None
        return await self.offset_for_timestamp(state._ts_values[-1])
