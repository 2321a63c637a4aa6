"""Important consumers' holds on retention, engine-free: the rules both
engines apply (the embedded ``tablets/important.py``, PostgreSQL's
``pgstore/important.py``), over a partition given as plain values.

``tablets/important.py``'s docstring states the rules. Here: where each
named group holds a partition's log start (``holds``), where a pass may move
it with the ``gateway.important.consumer.max.bytes`` ceiling (``limit``),
counting and logging every pass that goes past a group (``passed``), what
each group held back at the last pass (``remember``), and the report that
metrics and the console read (``report``). How the held bytes and the
ceiling's offset are read from the log is each engine's.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from .seam import CommittedOffset, ImportantGroup

log = logging.getLogger(__name__)

GroupKey = tuple[str, int, str]  # topic, partition, group


class OffsetsView(Protocol):
    """What the holds read of the committed offsets."""

    def committed(self, group: str, topic: str, partition: int) -> CommittedOffset | None: ...
    def is_released(self, group: str, topic: str, partition: int) -> bool: ...


@dataclass(frozen=True, slots=True)
class RetentionView:
    """One partition as a retention pass (and the report) sees it."""

    topic: str
    partition: int
    log_id: int  # the engine's name for the partition, where it needs one (else 0)
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


class ImportantHolds:
    def __init__(self, offsets: OffsetsView) -> None:
        self.offsets = offsets
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

    def start_pass(self, part: RetentionView) -> dict[str, int]:
        """The holds of a pass beginning; what the last one remembered goes
        (a group no longer named, or holding nothing, leaves)."""
        self._held.pop((part.topic, part.partition), None)
        return self.holds(part)

    @staticmethod
    def over_ceiling(part: RetentionView) -> bool:
        """Is the ceiling set and the partition above it (``limit`` then needs
        the offset from which the log is back within it)?"""
        return part.max_bytes >= 0 and part.size_bytes > part.max_bytes

    @staticmethod
    def limit(due: int, floor: int, allowed: int | None) -> int:
        """Where the log start goes: held at ``floor`` (the lowest hold), or
        as far as ``allowed`` (where the ceiling puts it, None: no ceiling)
        lets it, never past ``due`` (where retention puts it)."""
        return floor if allowed is None else min(due, max(floor, allowed))

    def remember(self, part: RetentionView, held: dict[str, Held]) -> None:
        self._held[(part.topic, part.partition)] = held

    def passed(self, part: RetentionView, holds: dict[str, int], new_start: int,
               name: str) -> None:
        """Count and log every group the pass went past (``name``: the
        partition, for the message)."""
        for group, offset in holds.items():
            if offset >= new_start:
                continue
            key = (part.topic, part.partition, group)
            self.passes[key] += 1
            self.records_passed[key] += new_start - offset
            log.warning(
                "retention passed important consumer group %s on %s: offsets %d..%d deleted "
                "before it committed them (the partition held %d bytes, over "
                "gateway.important.consumer.max.bytes=%d)",
                group, name, offset, new_start - 1, part.size_bytes, part.max_bytes)

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
