"""The front of a partition's log (a part of ``PartitionTablet``):
DeleteRecords and retention (retention.ms, retention.bytes) move the log
start offset and delete the entries of the batches wholly below it, the
time index entries before it and the segments' sizes, in one write, and
count the batches out of their segment files: a file left with nothing live
is deleted whole once that write is durable (``segment_files``), which is
how retention frees disk. They run under the log lock, one at a time with
compaction swaps. Idle producers' states expire here too
(producer.id.expiration.ms).
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left, bisect_right
from typing import TYPE_CHECKING

from . import batch as batch_header
from . import keys, log_entry
from .errors import OffsetOutOfRange, PolicyViolation
from .store import Ops

if TYPE_CHECKING:
    from array import array
    from collections.abc import Callable

    from .in_memory_batches import InMemoryBatches
    from .producers import ProducerStates
    from .segment_files import PartitionFiles
    from .segments import Segments
    from .store import GroupCommitWriter, RocksStore
    from .tablet_settings import TabletSettings


class TruncatedLog:
    if TYPE_CHECKING:
        store: RocksStore
        files: PartitionFiles
        writer: GroupCommitWriter
        settings: Callable[[], TabletSettings]
        prefix: bytes
        meta_key: bytes
        @property
        def name(self) -> str: ...

        log_start_offset: int
        high_watermark: int
        size_bytes: int
        segments: Segments
        producers: ProducerStates
        _tail: InMemoryBatches
        _ts_offsets: array[int]
        _ts_values: array[int]
        _log_lock: asyncio.Lock

        def _meta(self) -> bytes: ...

        def wake_waiters(self) -> None: ...

    # ----------------------------------------------------- deleting records
    async def delete_records(self, before: int) -> int:
        """Advance the log start offset to ``before`` (DeleteRecords); returns it.

        ``-1`` means the high watermark, as in Kafka.
        """
        if not self.settings().deletes:
            raise PolicyViolation(f"Records of partition {self.name} can not be deleted due to "
                                  "the configured policy")
        if before == -1:
            before = self.high_watermark
        if before < 0 or before > self.high_watermark:
            raise OffsetOutOfRange(
                f"offset {before} is outside [{self.log_start_offset}, {self.high_watermark}]"
            )
        if before > self.log_start_offset:
            await self._truncate_front(before)
        return self.log_start_offset

    async def enforce_retention(self, now_ms: int) -> None:
        """Drop the oldest batches past retention.ms or retention.bytes."""
        new_start = await self.retention_start(now_ms)
        if new_start > self.log_start_offset:
            await self._truncate_front(new_start)

    async def truncate_to(self, new_start: int) -> None:
        """Move the log start offset forward to ``new_start`` (a retention pass
        that another piece, important consumers, has held back)."""
        if new_start > self.log_start_offset:
            await self._truncate_front(new_start)

    async def expire_producers(self, now_ms: int, expiration_ms: int) -> int:
        """Forget producers idle for ``producer.id.expiration.ms``."""
        ops = Ops()
        expired = self.producers.expire(now_ms, expiration_ms, ops)
        if expired:
            await self.writer.submit(ops)
        return expired

    async def retention_start(self, now_ms: int) -> int:
        """Where retention.ms and retention.bytes would put the log start offset."""
        settings = self.settings()
        new_start = self.log_start_offset
        if settings.retention_ms >= 0 and self._ts_values:
            cutoff = now_ms - settings.retention_ms
            # Entries before `index` have running max < cutoff: every batch
            # before the next entry's base offset is older than retention.
            index = bisect_left(self._ts_values, cutoff)
            if index > 0:
                hw = self.high_watermark
                expired_until = self._ts_offsets[index] if index < len(self._ts_offsets) else hw
                new_start = max(new_start, min(expired_until, self.high_watermark))
        if settings.retention_bytes >= 0 and self.size_bytes > settings.retention_bytes:
            loop = asyncio.get_running_loop()
            by_size = await loop.run_in_executor(
                self.store.readers, self._start_for_size, settings.retention_bytes
            )
            new_start = max(new_start, by_size)
        return new_start

    def _start_for_size(self, retention_bytes: int) -> int:
        """The first batch to keep: as in Kafka, the oldest data goes only while
        what remains is still at least retention.bytes."""
        excess = self.size_bytes - retention_bytes
        floor = keys.LOG + self.prefix
        for key, entry in self.store.scan(floor, floor + b"\xff" * 8):
            base = keys.offset_of_key(key)
            size = log_entry.size(entry)
            if excess - size < 0 or base >= self.high_watermark:
                return base
            excess -= size
        return self.high_watermark

    async def _truncate_front(self, new_start: int) -> None:
        """Make ``new_start`` the log start offset; delete batches wholly below it."""
        async with self._log_lock:
            await self._truncate_front_locked(new_start)

    async def _truncate_front_locked(self, new_start: int) -> None:
        loop = asyncio.get_running_loop()
        floor = keys.LOG + self.prefix
        start_key = keys.offset_key(keys.LOG, self.prefix, new_start)

        def doomed() -> tuple[bytes, int, dict[int, int]]:
            # Batches below the one containing new_start go; that one stays.
            cut = floor
            freed = 0
            by_file: dict[int, int] = {}  # file number -> bytes freed in it
            for key, entry in self.store.scan(floor, start_key + b"\x00"):
                if batch_header.last_offset_of(entry) >= new_start:
                    break
                cut = keys.offset_key(keys.LOG, self.prefix, keys.offset_of_key(key) + 1)
                size = log_entry.size(entry)
                freed += size
                no = log_entry.locate(entry)[0]
                by_file[no] = by_file.get(no, 0) + size
            return cut, freed, by_file

        cut, freed, by_file = await loop.run_in_executor(self.store.readers, doomed)
        if new_start <= self.log_start_offset:
            return  # another truncation got there first
        self.log_start_offset = new_start
        self.size_bytes = max(0, self.size_bytes - freed)
        ops = Ops()
        self.segments.truncate(new_start, freed, ops)
        ops.delete_range(floor, cut)
        for no, nbytes in by_file.items():
            self.files.release_bytes(no, nbytes, ops)
        # Keep the index entry that covers new_start, clamped to it.
        index = bisect_right(self._ts_offsets, new_start) - 1
        if index > 0:
            ops.delete_range(
                keys.offset_key(keys.TIME_INDEX, self.prefix, 0),
                keys.offset_key(keys.TIME_INDEX, self.prefix, self._ts_offsets[index]),
            )
            del self._ts_offsets[:index]
            del self._ts_values[:index]
        self._tail.drop_below(new_start)
        ops.put(self.meta_key, self._meta())
        await self.writer.submit(ops)
        self.wake_waiters()
