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

import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import asyncpg

from tablets.seam import CommittedOffset, ImportantGroup

from .migrate import quoted
from .schema import DEFAULT_SCHEMA

log = logging.getLogger(__name__)

GroupKey = tuple[str, int, str]  # topic, partition, group


class OffsetsView(Protocol):
    """What the holds read of the committed offsets (``PgConsumerOffsets``)."""

    def committed(self, group: str, topic: str, partition: int) -> CommittedOffset | None: ...
    def is_released(self, group: str, topic: str, partition: int) -> bool: ...


@dataclass(frozen=True, slots=True)
class RetentionView:
    """One partition as a retention pass (and the report) sees it."""

    topic: str
    partition: int
    log_id: int  # its row in ``partitions``
    log_start_offset: int
    high_watermark: int
    size_bytes: int
    important_groups: tuple[str, ...]  # gateway.important.consumer.groups
    deletes: bool  # cleanup.policy has delete: retention runs
    max_bytes: int = -1  # gateway.important.consumer.max.bytes (-1: no ceiling)
    deleted: bool = False  # its topic was deleted


@dataclass(frozen=True, slots=True)
class Held:
    """What one important group held back on one partition at the last pass."""

    bytes: int  # batches retention would have deleted but kept for this group
    age_ms: int  # now - max timestamp of the oldest such batch (0: holds nothing)


class PgImportantConsumers:
    def __init__(self, offsets: OffsetsView, schema: str = DEFAULT_SCHEMA) -> None:
        self.offsets = offsets
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
        # (topic, partition) -> group -> what it held at the last pass.
        self._held: dict[tuple[str, int], dict[str, Held]] = {}
        self.passes: Counter[GroupKey] = Counter()
        self.records_passed: Counter[GroupKey] = Counter()

    def holds(self, part: RetentionView) -> dict[str, int]:
        """Group -> the offset it holds this partition's retention at (the
        groups that hold nothing left out)."""
        if not part.deletes:
            return {}
        out = {}
        for group in part.important_groups:
            committed = self.offsets.committed(group, part.topic, part.partition)
            if committed is not None:
                out[group] = max(committed.offset, part.log_start_offset)
            elif not self.offsets.is_released(group, part.topic, part.partition):
                out[group] = part.log_start_offset
        return out

    async def hold_back(self, conn: asyncpg.Connection, part: RetentionView, due: int,
                        now_ms: int) -> int:
        """One retention pass of one partition: the log start offset it may
        move to (``due`` when nothing holds it), and what each group holds."""
        holds = self.holds(part)
        # Rebuilt below: a group no longer named (or holding nothing) leaves.
        self._held.pop((part.topic, part.partition), None)
        floor = min(holds.values(), default=due)
        if floor >= due:
            return due
        new_start = floor
        ceiling = part.max_bytes
        if ceiling >= 0 and part.size_bytes > ceiling:
            allowed = await conn.fetchval(self._sql_start_for_size, part.log_id,
                                          part.size_bytes - ceiling, part.high_watermark)
            allowed = part.high_watermark if allowed is None else int(allowed)
            new_start = min(due, max(floor, allowed))
        await self._record(conn, part, holds, due, new_start, now_ms)
        for group, offset in holds.items():
            if offset < new_start:
                self._passed(part, group, offset, new_start, ceiling)
        return new_start

    async def _record(self, conn: asyncpg.Connection, part: RetentionView,
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
        self._held[(part.topic, part.partition)] = held

    def _passed(self, part: RetentionView, group: str, offset: int, new_start: int,
                ceiling: int) -> None:
        key = (part.topic, part.partition, group)
        self.passes[key] += 1
        self.records_passed[key] += new_start - offset
        log.warning(
            "retention passed important consumer group %s on %s-%d: offsets %d..%d deleted "
            "before it committed them (the partition held %d bytes, over "
            "gateway.important.consumer.max.bytes=%d)",
            group, part.topic, part.partition, offset, new_start - 1, part.size_bytes, ceiling)

    def forget(self, topic: str) -> None:
        """A deleted topic: its figures go (a topic re-created under the name starts anew)."""
        for held in [k for k in self._held if k[0] == topic]:
            del self._held[held]
        for counter in (self.passes, self.records_passed):
            for key in [k for k in counter if k[0] == topic]:
                del counter[key]

    def report(self, parts: Iterable[RetentionView]) -> list[ImportantGroup]:
        """Every important group of every partition: live lag, and what the
        last retention pass saw it hold back."""
        out = []
        for part in parts:
            if part.deleted or not part.important_groups:
                continue
            for group in part.important_groups:
                key = (part.topic, part.partition, group)
                committed = self.offsets.committed(group, part.topic, part.partition)
                released = committed is None and self.offsets.is_released(
                    group, part.topic, part.partition)
                position = committed.offset if committed is not None else part.log_start_offset
                lag = 0 if released else max(0, part.high_watermark
                                              - max(position, part.log_start_offset))
                held = self._held.get(key[:2], {}).get(group, Held(0, 0))
                out.append(ImportantGroup(
                    part.topic, part.partition, group,
                    committed.offset if committed is not None else None, released, lag,
                    held.bytes, held.age_ms, self.passes[key], self.records_passed[key]))
        return out
