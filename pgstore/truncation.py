"""The front of a partition's log on PostgreSQL (``Truncation``, a collaborator
of ``PgPartitionLog``): DeleteRecords, retention (retention.ms,
retention.bytes) and idle producers' expiry (producer.id.expiration.ms).

Moving the log start is one change, fenced by the leader epoch: the
partition row's new log start and size, then the batches wholly below it and
their bytes, deleted in one statement (whole ranges of the oldest rows:
autovacuum makes their space reusable). The batch holding the new log start
stays, as in Kafka and the RocksDB engine. Truncations of one partition run
one at a time, each in steps of at most ``STEP_BATCHES`` batches, one change
each: deleting a batch deletes its TOASTed bytes too (about 0.35 ms per
16 KiB batch measured), and a change holds the node's group commit while it
is written, so one step of 48 MiB (1.1 s) would stall every produce.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from tablets.errors import OffsetOutOfRange, PolicyViolation

if TYPE_CHECKING:
    from .log_state import LogState

STEP_BATCHES = 256


class Truncation:
    def __init__(self, log: LogState) -> None:
        self.log = log
        self._lock = asyncio.Lock()

    async def delete_records(self, before: int) -> int:
        """Advance the log start offset to ``before`` (-1: the high watermark)."""
        log = self.log
        log.check_writable()
        if not log.settings().deletes:
            raise PolicyViolation(f"Records of partition {log.name} can not be deleted due to "
                                  "the configured policy")
        if before == -1:
            before = log.high_watermark
        if before < 0 or before > log.high_watermark:
            raise OffsetOutOfRange(
                f"offset {before} is outside [{log.log_start_offset}, {log.high_watermark}]")
        await self.truncate_to(before)
        return log.log_start_offset

    async def enforce_retention(self, now_ms: int) -> None:
        """Drop the oldest batches past retention.ms or retention.bytes."""
        if self.log.deleted or self.log.fenced:
            return
        new_start = await self.retention_start(now_ms)
        await self.truncate_to(new_start)

    async def retention_start(self, now_ms: int) -> int:
        """Where retention.ms and retention.bytes put the log start offset."""
        log = self.log
        settings = log.settings()
        hw = log.high_watermark
        new_start = log.log_start_offset
        by_time = settings.retention_ms >= 0 and log.running_max_timestamp >= 0
        by_size = settings.retention_bytes >= 0 and log.size_bytes > settings.retention_bytes
        if not (by_time or by_size):
            return new_start
        async with log.context.pool.acquire() as conn:
            if by_time:
                # Every batch before the first one stamped at or after the
                # cutoff is older than retention.ms.
                first = await conn.fetchval(log.sql.first_unexpired, log.log_id,
                                            now_ms - settings.retention_ms)
                new_start = max(new_start, hw if first is None else min(int(first), hw))
            if by_size:
                # As in Kafka, the oldest data goes only while what remains is
                # still at least retention.bytes.
                kept = await conn.fetchval(log.sql.first_kept_for_size, log.log_id,
                                           log.size_bytes - settings.retention_bytes, hw)
                new_start = max(new_start, hw if kept is None else int(kept))
        return new_start

    async def truncate_to(self, new_start: int) -> None:
        """Make ``new_start`` the log start offset (if it moves it forward), in
        steps of at most ``STEP_BATCHES`` batches."""
        log = self.log
        async with self._lock:
            while new_start > log.log_start_offset:
                log.check_writable()
                async with log.context.pool.acquire() as conn:
                    step = await conn.fetchval(log.sql.step_end, log.log_id,
                                               log.log_start_offset, STEP_BATCHES)
                await self._move_start(new_start if step is None else min(int(step), new_start))

    async def _move_start(self, new_start: int) -> None:
        log = self.log
        sql = log.sql
        freed: list[int] = []
        change = log.writer.begin()
        log.fence_epoch(change)
        change.fetch(sql.move_start, log.log_id, new_start,
                     into=lambda rows: freed.__setitem__(
                         slice(None), [int(r["freed"]) for r in rows]))
        change.execute(sql.delete_below, log.log_id, new_start)
        await log.writer.commit(change)
        log.log_start_offset = max(log.log_start_offset, new_start)
        log.size_bytes = max(0, log.size_bytes - sum(freed))
        log.tail.drop_below(new_start)
        log.wake_waiters()

    async def expire_producers(self, now_ms: int, expiration_ms: int) -> int:
        """Forget producers idle for ``producer.id.expiration.ms``."""
        log = self.log
        if log.deleted or log.fenced:
            return 0
        change = log.writer.begin()
        log.fence_epoch(change)
        expired = log.producer_states.expire(now_ms, expiration_ms, change)
        if expired:
            await log.writer.commit(change)
        return expired
