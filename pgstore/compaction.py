"""Compaction of one partition's log on PostgreSQL (``PgCompactedLog``): when a
run is due, the planner's reads (``PgBatches``, the ``BatchesInOrder`` port of
``tablets.compaction``, the engine-free planner both engines share) and the
swap of each chunk it hands back (docs/cluster-design.md, "Compacted topics").

State, in PostgreSQL: the partition row's ``clean_offset`` (where the next
run starts: the end of the last offset map) and ``delete_horizon`` (the
earliest delete horizon the last run kept; a run is due once it passes, so
tombstones go soon after delete.retention.ms). Both are read when a leader
first plans (``load``: a restarted gateway or a new leader continues where the
last run, by any gateway, stopped) and written with a run's last chunk.

When a run is due, as on the embedded engine (``tablets.compacted_log``):
the dirty section's share of the log's bytes passes
min.cleanable.dirty.ratio, or its oldest batch is older than
max.compaction.lag.ms, or the delete horizon passed. This store keeps no
segments, so the rules of ``tablets.segment_rules`` run over segments rebuilt
for the check: the clean section as one segment, then Kafka's roll rules
(segment.bytes, segment.ms) replayed over the dirty section's index rows,
from the clean offset on. The last one is the active segment, never
compacted, nor a segment whose newest record is within
min.compaction.lag.ms.

A chunk is swapped in with one change of the group commit (one PostgreSQL
transaction), fenced: the leader epoch this gateway claimed (a gateway that
lost the partition writes nothing, and knows it is fenced), the log start the
run began at (retention or DeleteRecords moved it: the run stops), then one
statement that, for each changed batch whose index row still names the bytes
the run read, writes the re-encoded bytes (once, a new ``batch_data`` row:
its ``STORAGE EXTERNAL`` column keeps them uncompressed and out of line),
points the index row at them with the new size and max timestamp (or deletes
it: the batch kept nothing), deletes the old bytes, and moves the partition's
size (and, with the last chunk, the clean offset and delete horizon). A row
that changed under the run makes the statement return nothing: the change is
rolled back whole and the run stops. Readers see the index before or after
the chunk, never between. The time index (``running_max_timestamp``) is kept
as it was: a rewritten batch is no newer than before, so each running
maximum stays an upper bound, which is all lookups by time and retention.ms
need (they then read the batches' own max timestamps).
"""

from __future__ import annotations

import asyncio
import struct
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from tablets import batch as batch_header
from tablets.compaction import Aborted, Chunk, Plan, due_plan
from tablets.seam import CompactionStatus
from tablets.segment_rules import NO_TIMESTAMP, Cleanable, Segment, Segments

from .batch_log import _INT64
from .writer import OutcomeUnknown

if TYPE_CHECKING:
    import asyncpg

    from .partition_log import PgPartitionLog

_DATA_ID = struct.Struct(">q")
PAGE_BATCHES = 64  # batches one read of the planner fetches
PAGE_WAIT_SECONDS = 120.0
INDEX_PAGE = 10_000  # index rows read at once to rebuild the dirty section's segments


class Stopped(Exception):
    """The swap was refused: the log changed under the run (it stops)."""


class _NoPersistence:
    """Segments rebuilt for one check are kept nowhere."""

    def load(self) -> list[Segment]:
        return []

    def stage_segment(self, change: None, segment: Segment) -> None:
        pass

    def stage_removal(self, change: None, base: int) -> None:
        pass

    def stage_removal_below(self, change: None, base: int) -> None:
        pass


class CompactionSql:
    def __init__(self, s: str) -> None:
        self.state = f"SELECT clean_offset, delete_horizon FROM {s}.partitions WHERE log_id = $1"
        self.clean_bytes = (f"SELECT coalesce(sum(size), 0) FROM {s}.batches "
                            "WHERE log_id = $1 AND base_offset < $2")
        self.dirty_index = f"""
            SELECT base_offset, size, max_timestamp FROM {s}.batches
             WHERE log_id = $1 AND base_offset >= $2 AND base_offset < $3
             ORDER BY base_offset LIMIT $4"""
        self.page = f"""
            SELECT b.base_offset, b.last_offset, b.size, b.data_id, b.shifted, d.data
              FROM {s}.batches b
              JOIN {s}.batch_data d ON d.log_id = b.log_id AND d.data_id = b.data_id
             WHERE b.log_id = $1 AND b.last_offset >= $2 AND b.base_offset < $3
             ORDER BY b.base_offset LIMIT $4"""
        self.start_fence = (f"SELECT 1 FROM {s}.partitions WHERE log_id = $1 "
                            "AND log_start_offset = $2")
        # $1 log id; per change: $2 base offset, $3 the data id the run read,
        # $4 new bytes (NULL: the batch goes), $5 new max timestamp; $6 the
        # bytes the partition's size moves by; $7 the last chunk (else the
        # next two are kept): $8 clean offset, $9 delete horizon. A fence:
        # one row back only when every change found its index row as read
        # (else the change is rolled back).
        self.swap = f"""
            WITH c AS MATERIALIZED (
                SELECT c.base, c.old_id, c.data, c.max_ts,
                       CASE WHEN c.data IS NOT NULL THEN nextval(
                           pg_get_serial_sequence('{s}.batch_data', 'data_id')) END AS new_id
                  FROM unnest($2::bigint[], $3::bigint[], $4::bytea[], $5::bigint[])
                       AS c(base, old_id, data, max_ts)
            ), added AS (
                INSERT INTO {s}.batch_data (log_id, data_id, data) OVERRIDING SYSTEM VALUE
                SELECT $1, new_id, data FROM c WHERE data IS NOT NULL
             RETURNING data_id
            ), rewritten AS (
                UPDATE {s}.batches b
                   SET data_id = c.new_id, size = length(c.data), max_timestamp = c.max_ts,
                       shifted = false
                  FROM c
                 WHERE b.log_id = $1 AND b.base_offset = c.base AND b.data_id = c.old_id
                   AND c.data IS NOT NULL
             RETURNING c.old_id
            ), dropped AS (
                DELETE FROM {s}.batches b USING c
                 WHERE b.log_id = $1 AND b.base_offset = c.base AND b.data_id = c.old_id
                   AND c.data IS NULL
             RETURNING b.data_id AS old_id
            ), gone AS (
                SELECT old_id FROM rewritten UNION ALL SELECT old_id FROM dropped
            ), freed AS (
                DELETE FROM {s}.batch_data d USING gone
                 WHERE d.log_id = $1 AND d.data_id = gone.old_id
             RETURNING d.data_id
            ), moved AS (
                UPDATE {s}.partitions p
                   SET size_bytes = p.size_bytes + $6,
                       clean_offset = CASE WHEN $7 THEN $8 ELSE p.clean_offset END,
                       delete_horizon = CASE WHEN $7 THEN $9 ELSE p.delete_horizon END
                 WHERE p.log_id = $1
             RETURNING p.log_id
            )
            SELECT 1 FROM moved
             WHERE (SELECT count(*) FROM gone) = cardinality($2::bigint[])
               AND (SELECT count(*) FROM freed) = cardinality($2::bigint[])
               AND (SELECT count(*) FROM added) = (SELECT count(*) FROM c
                                                   WHERE data IS NOT NULL)"""


def data_id(entry: bytes) -> int:
    return int(_DATA_ID.unpack(entry)[0])


class PgBatches:
    """``tablets.compaction.BatchesInOrder`` over a partition's rows: read on
    the cleaner's thread, in pages fetched on the event loop (asyncpg's
    connections belong to it). The entry is the bytes' ``data_id``."""

    def __init__(self, pool: asyncpg.Pool, sql: CompactionSql, log_id: int,
                 loop: asyncio.AbstractEventLoop, stop: threading.Event) -> None:
        self.pool, self.sql, self.log_id = pool, sql, log_id
        self.loop, self.stop = loop, stop

    async def _page(self, start: int, end: int) -> list[Any]:
        async with self.pool.acquire() as conn:
            return list(await conn.fetch(self.sql.page, self.log_id, start, end, PAGE_BATCHES))

    def batches(self, start: int, end: int) -> Iterator[tuple[bytes, int, bytes]]:
        at = start
        while at < end:
            if self.stop.is_set():
                raise Aborted("the cleaner is stopping")
            future = asyncio.run_coroutine_threadsafe(self._page(at, end), self.loop)
            rows = future.result(PAGE_WAIT_SECONDS)
            if not rows:
                return
            for row in rows:
                data: bytes = row["data"]
                if row["shifted"]:  # a committed transaction's batch: its offsets patched
                    data = _INT64.pack(row["base_offset"]) + data[8:]
                yield _DATA_ID.pack(row["data_id"]), int(row["size"]), data
            at = int(rows[-1]["last_offset"]) + 1


class PgCompactedLog:
    """One partition's compaction, as its leader runs it."""

    def __init__(self, log: PgPartitionLog, sql: CompactionSql) -> None:
        self.log = log
        self.sql = sql
        self.status = CompactionStatus()
        self.clean_end = 0
        self.next_horizon: int | None = None
        self.loaded_epoch: int | None = None  # the leader epoch the state was read under
        # The segments rebuilt for the last check, and up to where the index
        # rows are replayed into them: a check replays only the rows since,
        # until what they were built from changes (a run's swap, a
        # truncation, a new leadership, segment settings).
        self._built: tuple[tuple[int, ...], Segments[None], int] | None = None

    async def load(self) -> None:
        """The state as PostgreSQL has it, once per leadership of this gateway."""
        log = self.log
        if self.loaded_epoch == log.leader_epoch:
            return
        async with log.context.pool.acquire() as conn:
            row = await conn.fetchrow(self.sql.state, log.log_id)
        if row is None:
            return
        self.clean_end = int(row["clean_offset"])
        horizon = row["delete_horizon"]
        self.next_horizon = None if horizon is None else int(horizon)
        self.loaded_epoch = log.leader_epoch

    async def cleanable(self, now_ms: int) -> Cleanable | None:
        """What a compaction could clean now; None unless the topic is compacted."""
        log = self.log
        settings = log.settings()
        config = settings.compaction
        if config is None or log.deleted or log.fenced:
            return None
        await self.load()
        first_dirty = self.clean_end
        if not log.log_start_offset <= first_dirty <= log.log_end_offset:
            first_dirty = log.log_start_offset  # truncated past it (compact,delete)
        hw = log.high_watermark
        segment_ms = min(settings.segment_ms, config.max_compaction_lag_ms)
        key = (log.leader_epoch, log.log_start_offset, first_dirty, settings.segment_bytes,
               segment_ms)
        fresh = self._built is None or self._built[0] != key
        if fresh or self._built is None:
            self._built = (key, Segments(_NoPersistence()), first_dirty)
        _key, segments, at = self._built
        async with log.context.pool.acquire() as conn:
            if fresh:  # the clean section as one segment
                clean = int(await conn.fetchval(self.sql.clean_bytes, log.log_id, first_dirty))
                if clean:
                    segments.closed.append(Segment(log.log_start_offset, clean, NO_TIMESTAMP,
                                                   NO_TIMESTAMP))
                segments.active = Segment(first_dirty, 0, NO_TIMESTAMP, NO_TIMESTAMP)
            while at < hw:  # the index rows not yet replayed
                rows = await conn.fetch(self.sql.dirty_index, log.log_id, at, hw, INDEX_PAGE)
                for row in rows:
                    segments.add(int(row["base_offset"]), int(row["size"]),
                                 int(row["max_timestamp"]), settings.segment_bytes,
                                 segment_ms, True, None)
                if len(rows) < INDEX_PAGE:
                    at = hw
                    break
                at = int(rows[-1]["base_offset"]) + 1
        self._built = (key, segments, at)
        found = segments.cleanable(first_dirty, hw, now_ms, config.min_compaction_lag_ms)
        self.status.cleanable_bytes = found.cleanable_bytes
        self.status.dirty_ratio = found.ratio
        self.status.dirty_since_ms = segments.first_timestamp_at(first_dirty)
        return found

    async def plan(self, now_ms: int, force: bool = False) -> Plan | None:
        """The next run, if one is due (or ``force``d: due or not)."""
        log = self.log
        config = log.settings().compaction
        found = await self.cleanable(now_ms)
        if config is None or found is None or self.status.failure is not None:
            return None
        return due_plan(found, config, log.log_start_offset, now_ms, self.next_horizon, force)

    async def apply(self, chunk: Chunk, plan: Plan) -> bool:
        """Swap one chunk in (one PostgreSQL transaction); False (nothing
        changed) if the run must stop. ``NotLeader`` if the epoch moved."""
        log = self.log
        if log.deleted or log.fenced or log.log_start_offset != plan.log_start:
            return False
        changes = chunk.changes
        moved = sum((0 if c.data is None else len(c.data)) - c.old_size for c in changes)
        change = log.writer.begin()
        log.fence_epoch(change, " (compaction stopped)")
        change.fence(self.sql.start_fence, log.log_id, plan.log_start,
                     refused=lambda: Stopped(f"{log.name}: the log start moved under the run"))
        change.fence(self.sql.swap, log.log_id, [c.offset for c in changes],
                     [data_id(c.entry) for c in changes], [c.data for c in changes],
                     [0 if c.data is None else batch_header.max_timestamp_of(c.data)
                      for c in changes],
                     moved, chunk.last, chunk.clean_end, chunk.next_horizon,
                     refused=lambda: Stopped(f"{log.name}: a batch changed under the run"))
        self._built = None  # sizes in the dirty section may change
        try:
            await log.writer.commit(change)
        except Stopped:
            return False
        except OutcomeUnknown:
            # The chunk may have landed: the partition's row (its size) is
            # reread, and the compaction state with the next check.
            self.loaded_epoch = None
            log.in_doubt()
            raise
        log.size_bytes = max(0, log.size_bytes + moved)
        log.tail.drop_before(chunk.index_to)  # the tail may hold batches rewritten
        self.status.bytes_reclaimed -= moved
        if chunk.last:
            self.clean_end = chunk.clean_end
            self.next_horizon = chunk.next_horizon
            self.status.runs += 1
        return True

