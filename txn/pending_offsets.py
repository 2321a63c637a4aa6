"""Offsets that open transactions have staged but not committed yet, per group.

TxnOffsetCommit stages a group's offsets in the open transaction; they are
written with its commit (``commit.py``). Until it ends, OffsetFetch with
``require_stable`` answers UNSTABLE_OFFSET_COMMIT for those partitions
(KIP-447), DeleteGroups refuses the group (NON_EMPTY_GROUP) and offset expiry
leaves them alone: the protocol layer asks here (``is_pending``,
``has_pending``). Kept in memory only: at start-up the coordinator holds the
offsets of every open transaction it loads again.

Counted per holder: two open transactions may stage the same partition of a
group, and it stays pending until both ended.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from tablets.seam import TopicPartition


class PendingOffsets:
    __slots__ = ("_groups",)

    def __init__(self) -> None:
        self._groups: dict[str, Counter[TopicPartition]] = {}

    def hold(self, group: str, partitions: Iterable[TopicPartition]) -> None:
        """An open transaction staged offsets of these partitions of ``group``.

        ``partitions`` may be a mapping keyed by partition: only its keys count
        (``Counter.update`` would add a mapping's values as counts).
        """
        pending = self._groups.setdefault(group, Counter())
        for tp in partitions:
            pending[tp] += 1

    def release(self, group: str, partitions: Iterable[TopicPartition]) -> None:
        """The transaction holding these offsets committed or aborted."""
        pending = self._groups.get(group)
        if pending is None:
            return
        for tp in partitions:  # keys only, as in hold
            pending[tp] -= 1
        for tp in [tp for tp, n in pending.items() if n <= 0]:
            del pending[tp]
        if not pending:
            del self._groups[group]

    def has_pending(self, group: str) -> bool:
        """Whether an open transaction will commit offsets of ``group``."""
        return bool(self._groups.get(group))

    def is_pending(self, group: str, topic: str, partition: int) -> bool:
        """Whether an open transaction will commit this partition's offset of ``group``."""
        pending = self._groups.get(group)
        return pending is not None and pending[(topic, partition)] > 0
