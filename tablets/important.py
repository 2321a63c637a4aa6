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
it); metrics and the console read them with the live lag (``report``). The
rules are engine-free (``important_holds.py``, shared with the PostgreSQL
engine); here, the held batches are read once, as they become due
(``_Scanned``).
"""

from __future__ import annotations

import asyncio
import logging
from array import array
from bisect import bisect_left
from typing import TYPE_CHECKING

from . import batch as rb
from . import keys, log_entry
from .important_holds import Held, ImportantHolds, RetentionView
from .seam import ImportantGroup

if TYPE_CHECKING:
    from .consumer_offsets import ConsumerOffsets
    from .tablet import PartitionTablet

log = logging.getLogger(__name__)


class ImportantConsumers(ImportantHolds):
    """The rules (``important_holds.py``) over the embedded engine's tablets;
    the held batches are read once, as they become due (``_Scanned``)."""

    def __init__(self, offsets: ConsumerOffsets) -> None:
        super().__init__(offsets)
        # Partition key prefix -> the held batches read so far.
        self._scanned: dict[bytes, _Scanned] = {}

    @staticmethod
    def view(tablet: PartitionTablet) -> RetentionView:
        settings = tablet.settings()
        return RetentionView(settings.topic, tablet.partition, 0, tablet.log_start_offset,
                             tablet.high_watermark, tablet.size_bytes,
                             tuple(settings.important_groups), settings.deletes,
                             settings.important_max_bytes, tablet.deleted)

    async def retain(self, tablet: PartitionTablet, now_ms: int) -> None:
        """One retention pass of one partition, held back for its important groups."""
        due = await tablet.truncation.retention_start(now_ms)
        part = self.view(tablet)
        holds = self.start_pass(part)
        floor = min(holds.values(), default=due)
        new_start = due
        if floor < due:
            allowed = None
            if self.over_ceiling(part):
                loop = asyncio.get_running_loop()
                allowed = await loop.run_in_executor(
                    tablet.store.readers, tablet.truncation.start_for_size, part.max_bytes)
            new_start = self.limit(due, floor, allowed)
            await self._record(tablet, holds, due, new_start, now_ms)
            self.passed(part, holds, new_start, tablet.name)
        else:
            self._scanned.pop(tablet.prefix, None)  # nothing held back: nothing to keep
        await tablet.truncation.truncate_to(new_start)

    async def _record(self, tablet: PartitionTablet, holds: dict[str, int], due: int,
                      new_start: int, now_ms: int) -> None:
        """Remember what each group holds back: batches that stay (last offset
        at or past ``new_start``) though retention is due for them (last offset
        before ``due``), and that the group has not wholly committed."""
        settings = tablet.settings()
        scanned = self._scanned.get(tablet.prefix) if settings.compaction is None else None
        if scanned is None:
            scanned = self._scanned[tablet.prefix] = _Scanned()
        scanned.drop_below(new_start)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(tablet.store.readers, scanned.read, tablet, new_start, due)
        self.remember(self.view(tablet), {
            group: scanned.held_from(max(offset, new_start), due, now_ms)
            for group, offset in holds.items()})

    def forget_topic(self, topic: str, prefixes: list[bytes]) -> None:
        """A deleted topic: its figures and its partitions' reads go."""
        for prefix in prefixes:
            self._scanned.pop(prefix, None)
        self.forget(topic)

    def report_tablets(self, tablets: list[PartitionTablet]) -> list[ImportantGroup]:
        return self.report(self.view(tablet) for tablet in tablets)


class _Scanned:
    """The batches of one partition that retention passes found held back, read
    once: each pass drops those below the new log start and reads only the
    batches retention became due for since (a compacted log, whose batches
    compaction rewrites, is read again each pass). Arrays keep it at 24 bytes
    a batch."""

    def __init__(self) -> None:
        self.lasts = array("q")  # last offset of each batch, ascending
        self.totals = array("q")  # running total of their sizes
        self.stamps = array("q")  # max timestamp of each batch
        self.dropped = 0  # the running total before the first batch kept
        self.end = -1  # the next batch to read starts here (-1: at the log start)

    def drop_below(self, offset: int) -> None:
        cut = bisect_left(self.lasts, offset)
        if cut:
            self.dropped = self.totals[cut - 1]
            del self.lasts[:cut], self.totals[:cut], self.stamps[:cut]

    def read(self, tablet: PartitionTablet, new_start: int, due: int) -> None:
        """Read the batches before ``due`` not read yet (on a reader thread)."""
        floor = keys.LOG + tablet.prefix
        start = floor if self.end < 0 else keys.offset_key(keys.LOG, tablet.prefix, self.end)
        total = self.totals[-1] if self.totals else self.dropped
        for _key, entry in tablet.store.scan(start, floor + b"\xff" * 8):
            last = rb.last_offset_of(entry)
            if last >= due:
                break
            self.end = last + 1
            total += log_entry.size(entry)
            if last < new_start:
                self.dropped = total
                continue
            self.lasts.append(last)
            self.totals.append(total)
            self.stamps.append(rb.max_timestamp_of(entry))

    def held_from(self, offset: int, due: int, now_ms: int) -> Held:
        """What stays for a group at ``offset``: the batches with a last offset
        at or past it and before ``due``."""
        first, end = bisect_left(self.lasts, offset), bisect_left(self.lasts, due)
        if first >= end:
            return Held(0, 0)
        before = self.totals[first - 1] if first else self.dropped
        return Held(self.totals[end - 1] - before, max(now_ms - self.stamps[first], 0))
