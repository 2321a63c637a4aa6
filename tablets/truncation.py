"""The front of a partition's log (``TruncatedLog``, a collaborator the
tablet holds as ``tablet.truncation``): DeleteRecords and retention
(retention.ms, retention.bytes) move the log start offset and delete the
entries of the batches wholly below it, the time index entries before it and
the segments' sizes, in one write, and count the batches out of their segment
files: a file left with nothing live is deleted whole once that write is
durable (``segment_files``), which is how retention frees disk. They run under
the log lock, one at a time with compaction swaps. Idle producers' states
expire here too (producer.id.expiration.ms).

It reads and writes the tablet's state through ``TruncatedTablet``, the
narrow view it is constructed with.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left, bisect_right
from typing import TYPE_CHECKING, Protocol

from . import batch as batch_header
from . import keys, log_entry
from .errors import OffsetOutOfRange, PolicyViolation
from .rocks_store import Ops

if TYPE_CHECKING:
    from array import array
    from collections.abc import Callable

    from .in_memory_batches import InMemoryBatches
    from .producer_rules import ProducerStates
    from .rocks_store import RocksStore
    from .segment_files import PartitionFiles
    from .segment_rules import Segments
    from .store import GroupCommitWriter
    from .tablet_settings import TabletSettings


class TruncatedTablet(Protocol):
    """The tablet state truncation reads and writes."""

    store: RocksStore
    files: PartitionFiles
    writer: GroupCommitWriter
    settings: Callable[[], TabletSettings]
    prefix: bytes
    meta_key: bytes
    log_start_offset: int
    high_watermark: int
    size_bytes: int
    segments: Segments[Ops]
    producers: ProducerStates[Ops]
    log_lock: asyncio.Lock
    _tail: InMemoryBatches
    _ts_offsets: array[int]
    _ts_values: array[int]

    @property
    def name(self) -> str: ...

    def meta(self) -> bytes: ...

    def wake_waiters(self) -> None: ...


class TruncatedLog:
    def __init__(self, log: TruncatedTablet) -> None:
        self.log = log

    # ----------------------------------------------------- deleting records
    async def delete_records(self, before: int) -> int:
        """Advance the log start offset to ``before`` (DeleteRecords); returns it.

        ``-1`` means the high watermark, as in Kafka.
        """
        log = self.log
        if not log.settings().deletes:
            raise PolicyViolation(f"Records of partition {log.name} can not be deleted due to "
                                  "the configured policy")
        if before == -1:
            before = log.high_watermark
        if before < 0 or before > log.high_watermark:
            raise OffsetOutOfRange(
                f"offset {before} is outside [{log.log_start_offset}, {log.high_watermark}]"
            )
        if before > log.log_start_offset:
            await self._truncate_front(before)
        return log.log_start_offset

    async def enforce_retention(self, now_ms: int) -> None:
        """Drop the oldest batches past retention.ms or retention.bytes."""
        new_start = await self.retention_start(now_ms)
        if new_start > self.log.log_start_offset:
            await self._truncate_front(new_start)

    async def truncate_to(self, new_start: int) -> None:
        """Move the log start offset forward to ``new_start`` (a retention pass
        that another piece, important consumers, has held back)."""
        if new_start > self.log.log_start_offset:
            await self._truncate_front(new_start)

    async def expire_producers(self, now_ms: int, expiration_ms: int) -> int:
        """Forget producers idle for ``producer.id.expiration.ms``."""
        log = self.log
        ops = Ops()
        expired = log.producers.expire(now_ms, expiration_ms, ops)
        if expired:
            await log.writer.submit(ops)
        return expired

    async def retention_start(self, now_ms: int) -> int:
        """Where retention.ms and retention.bytes would put the log start offset."""
        log = self.log
        settings = log.settings()
        new_start = log.log_start_offset
        if settings.retention_ms >= 0 and log._ts_values:
            cutoff = now_ms - settings.retention_ms
            # Entries before `index` have running max < cutoff: every batch
            # before the next entry's base offset is older than retention.
            index = bisect_left(log._ts_values, cutoff)
            if index > 0:
                hw = log.high_watermark
                expired_until = log._ts_offsets[index] if index < len(log._ts_offsets) else hw
                new_start = max(new_start, min(expired_until, log.high_watermark))
        if settings.retention_bytes >= 0 and log.size_bytes > settings.retention_bytes:
            loop = asyncio.get_running_loop()
            by_size = await loop.run_in_executor(
                log.store.readers, self.start_for_size, settings.retention_bytes
            )
            new_start = max(new_start, by_size)
        return new_start

    def start_for_size(self, retention_bytes: int) -> int:
        """The first batch to keep: as in Kafka, the oldest data goes only while
        what remains is still at least retention.bytes."""
        log = self.log
        excess = log.size_bytes - retention_bytes
        floor = keys.LOG + log.prefix
        for key, entry in log.store.scan(floor, floor + b"\xff" * 8):
            base = keys.offset_of_key(key)
            size = log_entry.size(entry)
            if excess - size < 0 or base >= log.high_watermark:
                return base
            excess -= size
        return log.high_watermark

    async def _truncate_front(self, new_start: int) -> None:
        """Make ``new_start`` the log start offset; delete batches wholly below it."""
        async with self.log.log_lock:
            await self._truncate_front_locked(new_start)

    async def _truncate_front_locked(self, new_start: int) -> None:
        log = self.log
        loop = asyncio.get_running_loop()
        floor = keys.LOG + log.prefix
        start_key = keys.offset_key(keys.LOG, log.prefix, new_start)

        def doomed() -> tuple[bytes, int, dict[int, int]]:
            # Batches below the one containing new_start go; that one stays.
            cut = floor
            freed = 0
            by_file: dict[int, int] = {}  # file number -> bytes freed in it
            for key, entry in log.store.scan(floor, start_key + b"\x00"):
                if batch_header.last_offset_of(entry) >= new_start:
                    break
                cut = keys.offset_key(keys.LOG, log.prefix, keys.offset_of_key(key) + 1)
                size = log_entry.size(entry)
                freed += size
                no = log_entry.locate(entry)[0]
                by_file[no] = by_file.get(no, 0) + size
            return cut, freed, by_file

        cut, freed, by_file = await loop.run_in_executor(log.store.readers, doomed)
        if new_start <= log.log_start_offset:
            return  # another truncation got there first
        log.log_start_offset = new_start
        log.size_bytes = max(0, log.size_bytes - freed)
        ops = Ops()
        log.segments.truncate(new_start, freed, ops)
        ops.delete_range(floor, cut)
        for no, nbytes in by_file.items():
            log.files.release_bytes(no, nbytes, ops)
        # Keep the index entry that covers new_start, clamped to it.
        index = bisect_right(log._ts_offsets, new_start) - 1
        if index > 0:
            ops.delete_range(
                keys.offset_key(keys.TIME_INDEX, log.prefix, 0),
                keys.offset_key(keys.TIME_INDEX, log.prefix, log._ts_offsets[index]),
            )
            del log._ts_offsets[:index]
            del log._ts_values[:index]
        log._tail.drop_below(new_start)
        ops.put(log.meta_key, log.meta())
        await log.writer.submit(ops)
        log.wake_waiters()
