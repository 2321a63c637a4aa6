"""Reading a partition's log (a part of ``PartitionTablet``): Fetch from
the in-memory tail (bytes), the read-ahead or the store (regions of segment
files: ``FileRegion``, the bytes are never read here); long-poll waiters
woken when the high watermark moves; ListOffsets by timestamp through the
time index (which reads the batches it looks into).

Readers never take the log lock: a compaction swap or a truncation changes
entries under them one WriteBatch at a time, and ``_read_disk`` reads an
entry again when the file it named went in such a swap. A read-ahead
begun before a swap is not kept (``_log_version``).
"""

from __future__ import annotations

import asyncio
from array import array
from bisect import bisect_left
from typing import TYPE_CHECKING

from . import batch as batch_header
from . import keys, log_entry
from .errors import OffsetOutOfRange
from .in_memory_batches import InMemoryBatches, Piece
from .records import first_record_at_or_after
from .seam import ReadResult
from .store import Ops

if TYPE_CHECKING:
    from .segment_files import PartitionFiles
    from .store import RocksStore

READAHEAD_BYTES = 4 << 20  # read past a fetch below the tail, for the next ones


class LogReads:
    if TYPE_CHECKING:
        store: RocksStore
        files: PartitionFiles
        prefix: bytes
        log_start_offset: int
        log_end_offset: int
        high_watermark: int
        _tail: InMemoryBatches
        _ahead: InMemoryBatches
        _ahead_end: int
        _ts_offsets: array[int]
        _ts_values: array[int]
        _waiters: set[asyncio.Future[None]]
        _log_version: int

        _tail_cache_bytes: int
        deleted: bool
        pending: dict[bytes, bytes]

    # ------------------------------------------------------------ in memory
    def _cache(self, offset: int, data: bytes) -> None:
        self._tail.append(offset, data)
        self._tail.trim(self._tail_cache_bytes)

    @property
    def _tail_start(self) -> int:
        return self._tail.first_offset(default=self.log_end_offset)

    def set_tail_budget(self, nbytes: int) -> None:
        """This partition's share of the node's in-memory tail budget."""
        self._tail_cache_bytes = nbytes
        self._tail.trim(nbytes)

    def release(self) -> None:
        """The partition is deleted: wake its fetchers and free its memory now
        (a tablet and its topic reference each other, so only the cyclic
        garbage collector would free them, and big buffers do not prompt it)."""
        self.deleted = True
        self.wake_waiters()
        self.pending.clear()
        self._tail, self._ahead, self._ahead_end = InMemoryBatches(), InMemoryBatches(), 0
        self._ts_offsets, self._ts_values = array("q"), array("q")

    def read_entry(self, entry: bytes) -> bytes:
        """The batch a log entry stands for, read from its file."""
        return self.files.read(entry)

    def _index_timestamp(self, offset: int, max_timestamp: int, ops: Ops) -> None:
        if not self._ts_values or max_timestamp > self._ts_values[-1]:
            self._ts_offsets.append(offset)
            self._ts_values.append(max_timestamp)
            ops.put(keys.offset_key(keys.TIME_INDEX, self.prefix, offset),
                    max_timestamp.to_bytes(8, "big", signed=True))

    def _advance_high_watermark(self, offset: int) -> None:
        if offset > self.high_watermark:
            self.high_watermark = offset
            self.wake_waiters()

    # ------------------------------------------------------------------ read
    @property
    def last_stable_offset(self) -> int:
        # Transactional data reaches the log only when committed.
        return self.high_watermark

    async def read(self, offset: int, max_bytes: int, min_one: bool = True) -> ReadResult:
        """Batches from the one containing ``offset``, up to ``max_bytes``.

        With ``min_one`` the first batch is returned whole even when larger
        (KIP-74). Reads at or past the high watermark return nothing; reads
        outside [log start, log end] raise OffsetOutOfRange.
        """
        hw = self.high_watermark
        if offset < self.log_start_offset or offset > self.log_end_offset:
            raise OffsetOutOfRange(
                f"offset {offset} is outside [{self.log_start_offset}, {self.log_end_offset}]"
            )
        if offset >= hw:  # at the end, or in a write not yet in the WAL
            return ReadResult([], hw, self.log_start_offset)
        if offset >= self._tail_start:
            batches = self._tail.slice(offset, hw, max_bytes, min_one)
        elif self._ahead.first_offset(default=self._ahead_end) <= offset < self._ahead_end:
            batches = self._ahead.slice(offset, hw, max_bytes, min_one)
        else:
            # A consumer behind the tail reads the log in order: read ahead of
            # it, so its next fetches are served from memory without a trip
            # to a reader thread (what bounds a one-partition consumer).
            loop = asyncio.get_running_loop()
            version = self._log_version
            bases, loaded, end = await loop.run_in_executor(
                self.store.readers, self._read_disk, offset, hw, max_bytes + READAHEAD_BYTES,
                min_one,
            )
            ahead = InMemoryBatches(bases, loaded)
            if version == self._log_version:  # else compaction changed what it read
                self._ahead = ahead
                self._ahead_end = end
            batches = ahead.slice(offset, hw, max_bytes, min_one)
        return ReadResult(batches, hw, self.log_start_offset)

    def _read_disk(self, offset: int, hw: int, max_bytes: int,
                   min_one: bool) -> tuple[list[int], list[Piece], int]:
        """(base offsets, batches, end offset) of the batches from the one
        holding ``offset``, up to ``max_bytes``, as regions of their files."""
        bases: list[int] = []
        out: list[Piece] = []
        total = 0
        last_end = 0
        floor = keys.LOG + self.prefix
        start = keys.offset_key(keys.LOG, self.prefix, offset)
        end = keys.offset_key(keys.LOG, self.prefix, hw)
        for key, entry in self.store.scan_from_containing(start, floor, end):
            if batch_header.last_offset_of(entry) < offset:
                continue
            size = log_entry.size(entry)
            if total + size > max_bytes and (out or not min_one):
                break
            try:
                piece = self.files.regions(entry)
            except log_entry.MissingBlob:
                # Compaction or retention replaced the batch and deleted its
                # file after this scan began: read the entry as it is now.
                current = self.store.get(key)
                if current is None:
                    continue
                entry = current
                piece = self.files.regions(entry)
            bases.append(log_entry.base_offset(entry))
            out.append(piece)
            last_end = batch_header.last_offset_of(entry) + 1
            total += size
        return bases, out, last_end

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
        floor = keys.LOG + self.prefix
        start = keys.offset_key(keys.LOG, self.prefix, offset)
        end = keys.offset_key(keys.LOG, self.prefix, self.high_watermark)
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
        index = bisect_left(self._ts_values, target)
        if index == len(self._ts_values):
            return None
        offset = max(self._ts_offsets[index - 1] if index else 0, self.log_start_offset)
        hw = self.high_watermark
        # The first batch whose max timestamp reaches the target is at
        # _ts_offsets[index]; scanning from the previous entry keeps the
        # answer exact after retention trimmed the index.
        while offset < hw:
            data = self._batch_at(offset)
            if data is None:
                return None
            if batch_header.max_timestamp_of(data) >= target:
                found = first_record_at_or_after(data, target, self.log_start_offset)
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
        if not self._ts_values or self.high_watermark == self.log_start_offset:
            return None
        return await self.offset_for_timestamp(self._ts_values[-1])
