"""Virtual segments: where Kafka would have rolled a partition's log files.

Engine-free: Kafka's roll rules and the segment arithmetic compaction and
retention need, over an in-memory state, with the persistence of closed
segments behind a port (``SegmentPersistence``) each storage engine
implements -- the RocksDB engine with ``S`` keys in its ``Ops``
(``tablets/segments.py``).

A partition's log is one run of batches, not files, but compaction follows
Kafka's segment rules, so it must know where Kafka's segments would be: the
*active* segment (the head of the log) is never compacted, a closed segment
whose newest record is younger than min.compaction.lag.ms is not either, and
the dirty ratio and max.compaction.lag.ms are computed over segments.

As in Kafka, an append rolls a new segment first when the active one is not
empty and the batch would take it past segment.bytes, or the batch's max
timestamp is more than segment.ms (for a compacted topic, at most
max.compaction.lag.ms) after the max timestamp of the segment's first batch.
Nothing rolls without an append.

The active segment is kept by the engine with the partition's own state
(RocksDB: its meta, written with every append anyway); a closed one is
staged through the port once, when it closes, into the append's own atomic
change. Retention and DeleteRecords drop the segments below the log start;
compaction shrinks the ones it rewrites and then merges neighbours up to
segment.bytes, as Kafka groups cleaned segments; recovery cuts the ones past
where it cut the log.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

_SEGMENT = struct.Struct(">qqq")  # size, first batch's max timestamp, largest timestamp
NO_TIMESTAMP = -1
ChangeT = TypeVar("ChangeT")
ChangeT_contra = TypeVar("ChangeT_contra", contravariant=True)


@dataclass(slots=True)
class Segment:
    base: int  # base offset of its first batch (or where it starts, while empty)
    size: int  # bytes of the batches in it (log_entry.size)
    first_ts: int  # max timestamp of its first batch: Kafka's rolling timestamp
    largest_ts: int

    def encode(self) -> bytes:
        """Engine-neutral bytes of all but its base (an engine keys by that):
        size, first and largest timestamps, big-endian int64 each."""
        return _SEGMENT.pack(self.size, self.first_ts, self.largest_ts)

    @classmethod
    def decode(cls, base: int, value: bytes) -> Segment:
        return cls(base, *_SEGMENT.unpack(value))


class SegmentPersistence(Protocol[ChangeT_contra]):
    """Where one partition's closed segments are kept: an engine's port.

    ``ChangeT_contra`` is the engine's atomic change (RocksDB: ``Ops``).
    """

    def load(self) -> Iterable[Segment]:
        """The partition's closed segments, in offset order (start-up)."""
        ...

    def stage_segment(self, change: ChangeT_contra, segment: Segment) -> None:
        """Stage a closed segment's record (new or changed) into ``change``."""
        ...

    def stage_removal(self, change: ChangeT_contra, base: int) -> None:
        """Stage the removal of the closed segment at ``base``."""
        ...

    def stage_removal_below(self, change: ChangeT_contra, base: int) -> None:
        """Stage the removal of every closed segment below ``base``."""
        ...


@dataclass(frozen=True, slots=True)
class Cleanable:
    """What compaction could do now (Kafka's LogToClean)."""

    first_dirty: int
    first_uncleanable: int
    clean_bytes: int
    cleanable_bytes: int
    earliest_dirty_ts: int  # first batch timestamp of the oldest dirty closed segment, or -1

    @property
    def ratio(self) -> float:
        total = self.clean_bytes + self.cleanable_bytes
        return self.cleanable_bytes / total if total else 0.0


class Segments(Generic[ChangeT]):
    """One partition's segments, closed ones kept through ``persistence``."""

    def __init__(self, persistence: SegmentPersistence[ChangeT]) -> None:
        self.persistence = persistence
        self.closed: list[Segment] = []
        self.active = Segment(0, 0, NO_TIMESTAMP, NO_TIMESTAMP)
        self._touched: set[int] = set()  # bases of closed segments changed, not yet written
        self._removed: set[int] = set()

    def _put(self, segment: Segment, change: ChangeT) -> None:
        self.persistence.stage_segment(change, segment)

    # ------------------------------------------------------------ state
    def load(self, active: Segment) -> None:
        """The closed segments from the port, and ``active`` as the engine kept it."""
        self.closed = list(self.persistence.load())
        self.active = active

    def _next_base(self, index: int) -> int:
        return self.closed[index + 1].base if index + 1 < len(self.closed) else self.active.base

    def _index_of(self, offset: int) -> int:
        """The closed segment holding ``offset``: -1 below the first, len() in the active."""
        if offset >= self.active.base:
            return len(self.closed)
        return bisect_right([s.base for s in self.closed], offset) - 1

    # ----------------------------------------------------------- append
    def add(self, base_offset: int, size: int, max_ts: int, segment_bytes: int,
            segment_ms: int, compacted: bool, change: ChangeT) -> None:
        """A batch appended at ``base_offset``: roll first if Kafka would.

        Only a compacted topic needs its closed segments one by one; any
        other keeps them as one (bounded memory, however small its
        segments), which compaction takes whole if the topic becomes compacted.
        """
        active = self.active
        if active.size > 0 and (active.size + size > segment_bytes
                                or max_ts - active.first_ts > segment_ms):
            if compacted or not self.closed:
                self.closed.append(active)
                self._put(active, change)
            else:
                last = self.closed[-1]
                last.size += active.size
                last.largest_ts = max(last.largest_ts, active.largest_ts)
                self._put(last, change)
            active = self.active = Segment(base_offset, 0, NO_TIMESTAMP, NO_TIMESTAMP)
        if active.size == 0:
            active.base, active.first_ts = base_offset, max_ts
        active.size += size
        active.largest_ts = max(active.largest_ts, max_ts)

    # ------------------------------------------------------ truncation
    def truncate(self, new_start: int, freed: int, change: ChangeT) -> None:
        """The batches below ``new_start`` (``freed`` bytes) were deleted."""
        dropped = 0
        count = 0
        while count < len(self.closed) and self._next_base(count) <= new_start:
            dropped += self.closed[count].size
            count += 1
        if count:
            self.persistence.stage_removal_below(change, self._next_base(count - 1))
            del self.closed[:count]
        first = self.closed[0] if self.closed else self.active
        first.size = max(0, first.size - (freed - dropped))
        if self.closed:
            self._put(first, change)

    def cut(self, end: int, size_bytes: int, change: ChangeT) -> None:
        """Recovery cut the log at ``end``, leaving ``size_bytes`` in it: the
        segments past it go, and the sizes go down by what was cut, from the
        newest segment back."""
        while self.closed and self.closed[-1].base >= end:
            self.persistence.stage_removal(change, self.closed.pop().base)
        if self.active.base >= end:
            self.active = Segment(end, 0, NO_TIMESTAMP, NO_TIMESTAMP)
        excess = sum(seg.size for seg in self.closed) + self.active.size - size_bytes
        for segment in [self.active, *reversed(self.closed)]:
            if excess <= 0:
                break
            taken = min(excess, segment.size)
            segment.size -= taken
            excess -= taken
            if segment is not self.active:
                self._put(segment, change)

    # ------------------------------------------------------ compaction
    def resize(self, changes: Iterable[tuple[int, int]]) -> None:
        """Batches at these offsets changed size by these (negative) amounts."""
        bases = [s.base for s in self.closed]
        for offset, delta in changes:
            closed = bases and offset < self.active.base
            segment = self.closed[max(bisect_right(bases, offset) - 1, 0)] if closed else (
                self.active)
            segment.size = max(0, segment.size + delta)
            if segment is not self.active:
                self._touched.add(segment.base)

    def merge_clean(self, clean_end: int, segment_bytes: int) -> None:
        """Merge neighbouring compacted segments while they fit segment.bytes
        (Kafka cleans a group of segments into one)."""
        merged: list[Segment] = []
        for index, segment in enumerate(self.closed):
            previous = merged[-1] if merged else None
            if (previous is not None and self._next_base(index) <= clean_end
                    and previous.size + segment.size <= segment_bytes):
                previous.size += segment.size
                previous.largest_ts = max(previous.largest_ts, segment.largest_ts)
                self._removed.add(segment.base)
                self._touched.add(previous.base)
            else:
                merged.append(segment)
        self.closed = merged

    def flush(self, change: ChangeT) -> None:
        """Stage what ``resize`` and ``merge_clean`` changed (once per segment:
        RocksDB's WriteBatch applies its deletes before its puts)."""
        for base in self._removed:
            self.persistence.stage_removal(change, base)
        for segment in self.closed:
            if segment.base in self._touched:
                self._put(segment, change)
        self._touched.clear()
        self._removed.clear()

    def cleanable(self, first_dirty: int, high_watermark: int, now_ms: int,
                  min_lag_ms: int) -> Cleanable:
        """Kafka's cleanableOffsets and LogToClean, over these segments.

        Nothing at or past the active segment or the high watermark is
        cleanable, nor any closed segment (or what follows it) whose largest
        timestamp is within min.compaction.lag.ms of now.
        """
        closed = self.closed
        uncleanable = min(high_watermark, self.active.base)
        first = max(self._index_of(first_dirty), 0)
        earliest = NO_TIMESTAMP
        for index in range(first, len(closed)):
            segment = closed[index]
            if segment.base >= uncleanable:
                break
            if min_lag_ms > 0 and segment.largest_ts > now_ms - min_lag_ms:
                uncleanable = segment.base
                break
            if segment.first_ts > 0 and (earliest < 0 or segment.first_ts < earliest):
                earliest = segment.first_ts
        uncleanable = max(first_dirty, uncleanable)
        # As Kafka: whole segments on each side, so a segment the dirty
        # offset falls in counts as clean and as dirty.
        clean = sum(s.size for s in closed if s.base < first_dirty)
        if self.active.base < first_dirty:
            clean += self.active.size
        floor = self._index_of(uncleanable)
        upper = closed[floor].base if 0 <= floor < len(closed) else uncleanable
        low = min(first_dirty, upper)
        cleanable = sum(s.size for i, s in enumerate(closed)
                        if s.base < upper and self._next_base(i) > low)
        return Cleanable(first_dirty, uncleanable, clean, cleanable, earliest)

    def first_timestamp_at(self, offset: int) -> int:
        """The first batch timestamp of the segment holding ``offset``."""
        index = self._index_of(offset)
        if 0 <= index < len(self.closed):
            return self.closed[index].first_ts
        return self.active.first_ts if self.active.size else NO_TIMESTAMP
