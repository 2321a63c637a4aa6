"""Important consumers on PostgreSQL: retention never deletes what a named
group has not read (the embedded engine's ``tablets/important.py``, whose
docstring has the rules; the same here).

A retention pass of the PostgreSQL engine asks ``hold_back`` where the log
start may go: retention.ms and retention.bytes say ``due``; each important
group holds it at its committed offset (``PgConsumerOffsets``), or at the log
start where it never committed, unless its offsets were deleted (released).
With ``gateway.important.consumer.max.bytes`` (>= 0) and the partition above
it, retention passes the groups as far as needed to bring it back to that
size, never further than ``due``; each such pass is logged as a warning and
counted per group.

Each pass records, per group, the bytes and age of the batches it held back
(retention was due for them but they stay). Where the embedded engine walks
its index once and keeps the walk (``_Scanned``), PostgreSQL answers from
``batches``' primary key in one query per pass. ``report`` gives the seam's
``ImportantGroup`` rows with the live lag.

The partition is given as a ``RetentionView`` (plain values), so the engine's
partition log and its topic settings stay the engine's.
"""

from __future__ import annotations

from tablets.important_holds import Held, ImportantHolds, OffsetsView, RetentionView

from .migrate import Connection, quoted
from .schema import DEFAULT_SCHEMA


class PgImportantConsumers(ImportantHolds):
    def __init__(self, offsets: OffsetsView, schema: str = DEFAULT_SCHEMA) -> None:
        super().__init__(offsets)
        s = quoted(schema)
        # The first batch to keep so that what remains is still at least the
        # ceiling (Kafka's retention.bytes rule: tablets.truncation.start_for_size).
        self._sql_start_for_size = (
            "SELECT base_offset FROM (SELECT base_offset, sum(size) OVER (ORDER BY base_offset) "
            f"AS running FROM {s}.batches WHERE log_id = $1) b "
            "WHERE running > $2 OR base_offset >= $3 ORDER BY base_offset LIMIT 1")
        # Per group offset: the bytes of the batches with a last offset at or
        # past it and before due, and the max timestamp of the first of them.
        self._sql_held = (
            "SELECT g.o AS o, "
            f"(SELECT coalesce(sum(size), 0) FROM {s}.batches "
            " WHERE log_id = $1 AND base_offset < $2 AND last_offset >= g.o "
            " AND last_offset < $2) AS held, "
            f"(SELECT max_timestamp FROM {s}.batches "
            " WHERE log_id = $1 AND base_offset < $2 AND last_offset >= g.o "
            " AND last_offset < $2 ORDER BY base_offset LIMIT 1) AS oldest "
            "FROM unnest($3::bigint[]) AS g(o)")

    async def hold_back(self, conn: Connection, part: RetentionView, due: int,
                        now_ms: int) -> int:
        """One retention pass of one partition: the log start offset it may
        move to (``due`` when nothing holds it), and what each group holds."""
        holds = self.start_pass(part)
        floor = min(holds.values(), default=due)
        if floor >= due:
            return due
        allowed = None
        if self.over_ceiling(part):
            first = await conn.fetchval(self._sql_start_for_size, part.log_id,
                                        part.size_bytes - part.max_bytes, part.high_watermark)
            allowed = part.high_watermark if first is None else int(first)
        new_start = self.limit(due, floor, allowed)
        await self._record(conn, part, holds, due, new_start, now_ms)
        self.passed(part, holds, new_start, f"{part.topic}-{part.partition}")
        return new_start

    async def _record(self, conn: Connection, part: RetentionView,
                      holds: dict[str, int], due: int, new_start: int, now_ms: int) -> None:
        """Remember what each group holds back: batches that stay (last offset
        at or past ``new_start``) though retention is due for them (last offset
        before ``due``), and that the group has not wholly committed."""
        starts = {group: max(offset, new_start) for group, offset in holds.items()}
        rows = await conn.fetch(self._sql_held, part.log_id, due, sorted(set(starts.values())))
        by_offset = {int(r["o"]): (int(r["held"]), r["oldest"]) for r in rows}
        held = {}
        for group, start in starts.items():
            size, oldest = by_offset[start]
            held[group] = Held(size, 0 if oldest is None else max(now_ms - int(oldest), 0))
        self.remember(part, held)
