"""Important consumers: retention never deletes what a named group has not read.

A topic's ``gateway.important.consumer.groups`` names consumer groups that
must see every record (YDB Topics' important consumers). On a topic whose
cleanup.policy has ``delete``, each retention pass computes where
retention.ms and retention.bytes would put a partition's log start offset,
then holds it at the lowest offset any of these groups has committed there
(``ConsumerOffsets``: plain commits, and transactional ones once their
transaction commits). A named group that never committed on the partition
holds it from its log start. A group whose offsets were deleted (DeleteGroups,
OffsetDelete: ``ConsumerOffsets.is_released``) holds nothing until it commits
again; so does a group no longer named. Both take effect at the next pass.

DeleteRecords is an operator's explicit action, not retention, and is not
held back.

Disks are finite: with ``gateway.important.consumer.max.bytes`` set (>= 0),
once a partition holds more than that, retention may pass the groups as far
as needed to bring it back to that size (never further than retention itself
would go). Every such pass is logged as a warning and counted per group
(records deleted unread).

Each pass also records, per important group and partition, the bytes and
age of what it holds back (batches retention would have deleted but kept for
it); metrics and the console read them with the live lag (``report``).
"""

from __future__ import annotations

import asyncio
import logging
from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import batch as rb
from . import keys, log_entry

if TYPE_CHECKING:
    from .consumer_offsets import ConsumerOffsets
    from .tablet import PartitionTablet

log = logging.getLogger(__name__)

GroupKey = tuple[str, int, str]  # topic, partition, group


@dataclass(frozen=True, slots=True)
class Held:
    """What one important group held back on one partition at the last pass."""

    bytes: int  # batches retention would have deleted but kept for this group
    age_ms: int  # now - max timestamp of the oldest such batch (0: holds nothing)


@dataclass(frozen=True, slots=True)
class ImportantGroup:
    """One important group on one partition, as metrics and the console show it."""

    topic: str
    partition: int
    group: str
    committed: int | None  # its committed offset; None: never committed here
    released: bool  # its offsets were deleted: it holds nothing
    lag: int  # records from its committed offset (or the log start) to the high watermark
    held_bytes: int
    held_age_ms: int
    passed: int  # retention passes that went past it (the ceiling)
    records_passed: int  # records retention deleted before it committed them


class ImportantConsumers:
    def __init__(self, offsets: ConsumerOffsets) -> None:
        self.offsets = offsets
        # (topic, partition) -> group -> what it held at the last pass.
        self._held: dict[tuple[str, int], dict[str, Held]] = {}
        self.passes: Counter[GroupKey] = Counter()
        self.records_passed: Counter[GroupKey] = Counter()

    def holds(self, tablet: PartitionTablet) -> dict[str, int]:
        """Group -> the offset it holds this partition's retention at (the
        groups that hold nothing left out)."""
        settings = tablet.settings()
        if not settings.deletes:
            return {}
        out = {}
        for group in settings.important_groups:
            committed = self.offsets.committed(group, settings.topic, tablet.partition)
            if committed is not None:
                out[group] = max(committed.offset, tablet.log_start_offset)
            elif not self.offsets.is_released(group, settings.topic, tablet.partition):
                out[group] = tablet.log_start_offset
        return out

    async def retain(self, tablet: PartitionTablet, now_ms: int) -> None:
        """One retention pass of one partition, held back for its important groups."""
        due = await tablet.retention_start(now_ms)
        settings = tablet.settings()
        holds = self.holds(tablet)
        # Rebuilt below: a group no longer named (or holding nothing) leaves.
        self._held.pop((settings.topic, tablet.partition), None)
        new_start = due
        floor = min(holds.values(), default=due)
        ceiling = settings.important_max_bytes
        if floor < due:
            new_start = floor
            if ceiling >= 0 and tablet.size_bytes > ceiling:
                loop = asyncio.get_running_loop()
                allowed = await loop.run_in_executor(
                    tablet.store.readers, tablet._start_for_size, ceiling)
                new_start = min(due, max(floor, allowed))
            await self._record(tablet, holds, due, new_start, now_ms)
            for group, offset in holds.items():
                if offset < new_start:
                    self._passed(tablet, group, offset, new_start, ceiling)
        await tablet.truncate_to(new_start)

    async def _record(self, tablet: PartitionTablet, holds: dict[str, int], due: int,
                      new_start: int, now_ms: int) -> None:
        """Remember what each group holds back: batches that stay (last offset
        at or past ``new_start``) though retention is due for them (last offset
        before ``due``), and that the group has not wholly committed."""
        loop = asyncio.get_running_loop()
        held = await loop.run_in_executor(tablet.store.readers, _batches, tablet, new_start, due)
        lasts = [b[0] for b in held]
        # Running byte totals from the end, so each group's share is one lookup.
        tail_bytes = [0] * (len(held) + 1)
        for i in range(len(held) - 1, -1, -1):
            tail_bytes[i] = tail_bytes[i + 1] + held[i][1]
        per_group = self._held[(tablet.settings().topic, tablet.partition)] = {}
        for group, offset in holds.items():
            first = bisect_left(lasts, max(offset, new_start))
            age = now_ms - held[first][2] if first < len(held) else 0
            per_group[group] = Held(tail_bytes[first], max(age, 0))

    def _passed(self, tablet: PartitionTablet, group: str, offset: int, new_start: int,
                ceiling: int) -> None:
        key = (tablet.settings().topic, tablet.partition, group)
        self.passes[key] += 1
        self.records_passed[key] += new_start - offset
        log.warning(
            "retention passed important consumer group %s on %s: offsets %d..%d deleted before "
            "it committed them (the partition held %d bytes, over "
            "gateway.important.consumer.max.bytes=%d)",
            group, tablet.name, offset, new_start - 1, tablet.size_bytes, ceiling)

    def forget(self, topic: str) -> None:
        """A deleted topic: its figures go (a topic re-created under the name starts anew)."""
        for key in [k for k in self._held if k[0] == topic]:
            del self._held[key]
        for counter in (self.passes, self.records_passed):
            for key in [k for k in counter if k[0] == topic]:
                del counter[key]

    def report(self, tablets: list[PartitionTablet]) -> list[ImportantGroup]:
        """Every important group of every partition: live lag, and what the
        last retention pass saw it hold back."""
        out = []
        for tablet in tablets:
            settings = tablet.settings()
            if tablet.deleted or not settings.important_groups:
                continue
            for group in settings.important_groups:
                key = (settings.topic, tablet.partition, group)
                committed = self.offsets.committed(group, settings.topic, tablet.partition)
                released = committed is None and self.offsets.is_released(
                    group, settings.topic, tablet.partition)
                position = committed.offset if committed is not None else tablet.log_start_offset
                lag = 0 if released else max(0, tablet.high_watermark
                                              - max(position, tablet.log_start_offset))
                held = self._held.get(key[:2], {}).get(group, Held(0, 0))
                out.append(ImportantGroup(
                    settings.topic, tablet.partition, group,
                    committed.offset if committed is not None else None, released, lag,
                    held.bytes, held.age_ms, self.passes[key], self.records_passed[key]))
        return out


def _batches(tablet: PartitionTablet, new_start: int, due: int) -> list[tuple[int, int, int]]:
    """(last offset, size, max timestamp) of the batches that stay though
    retention is due for them. Reads only entry headers (references too)."""
    if due <= new_start:
        return []
    floor = keys.LOG + tablet.prefix
    end = keys.offset_key(keys.LOG, tablet.prefix, due)
    out = []
    for _key, entry in tablet.store.scan(floor, end):
        last = rb.last_offset_of(entry)
        if last < new_start:
            continue
        if last >= due:
            break
        out.append((last, log_entry.size(entry), rb.max_timestamp_of(entry)))
    return out
