"""The tablet's side of compaction: when a run is due, and swapping its
chunks into the log (``CompactedLog``, a collaborator the tablet holds as
``tablet.compaction``; the cleaner calls ``plan``, ``apply`` and
``finish_run``, and reads ``status``). It reads and writes the tablet's state
through ``CompactedTablet``, the narrow view it is constructed with.

A run is due, as in Kafka 3.4, when the dirty section's share of the log's
bytes passes min.cleanable.dirty.ratio, or when the oldest dirty segment's
first batch is older than max.compaction.lag.ms; and also (sooner than
Kafka, which waits for new dirty data) once a delete horizon it stamped has
passed, so tombstones go soon after delete.retention.ms.

Each chunk of a run (``compaction.Chunk``) is swapped in with one WriteBatch,
on the event loop, under the log lock (so retention and DeleteRecords never
interleave with it): the re-encoded batches appended to the run's own new
segment file (written before the WriteBatch lands, never over old bytes),
the changed entries, the old batches counted out of their files (a file
with nothing live left is deleted once the swap is durable), the time index
of the chunk's range rebuilt from the batches kept, the segments' sizes, the
partition meta. In memory, the same changes
at once, before the next await: the in-memory tail and read-ahead drop the
batches of the range (readers then read the store, which holds the old
entries until the write lands and the new ones after), the time index is
spliced, the byte count shrinks. If the log start moved since the run
began (retention or DeleteRecords ran between two chunks), the run stops.
"""

from __future__ import annotations

import asyncio
from array import array
from bisect import bisect_left
from typing import TYPE_CHECKING, Protocol

from . import keys, log_entry
from .compaction import Chunk, Plan, due_plan
from .rocks_store import Ops
from .seam import CompactionStatus
from .segment_rules import Cleanable

if TYPE_CHECKING:
    from collections.abc import Callable

    from .in_memory_batches import InMemoryBatches
    from .segment_files import PartitionFiles, SegmentFile
    from .segment_rules import Segments
    from .store import GroupCommitWriter
    from .tablet_settings import TabletSettings

_TIMESTAMP_FLOOR = -(2**63)


class CompactedTablet(Protocol):
    """The tablet state compaction reads and writes."""

    prefix: bytes
    meta_key: bytes
    log_start_offset: int
    log_end_offset: int
    high_watermark: int
    size_bytes: int
    deleted: bool
    clean_end: int
    segments: Segments[Ops]
    files: PartitionFiles
    writer: GroupCommitWriter
    settings: Callable[[], TabletSettings]
    log_lock: asyncio.Lock
    _tail: InMemoryBatches
    _ts_offsets: array[int]
    _ts_values: array[int]

    def meta(self) -> bytes: ...


class CompactedLog:
    def __init__(self, log: CompactedTablet) -> None:
        self.log = log
        self.status = CompactionStatus()
        self.next_horizon: int | None = None  # the earliest delete horizon stamped
        self._run_file: SegmentFile | None = None  # the new file of the run under way

    def cleanable(self, now_ms: int) -> Cleanable | None:
        """What a compaction could clean now; None unless the topic is compacted."""
        log = self.log
        config = log.settings().compaction
        if config is None or log.deleted:
            return None
        first_dirty = log.clean_end
        if not log.log_start_offset <= first_dirty <= log.log_end_offset:
            first_dirty = log.log_start_offset  # truncated past it (compact,delete)
        found = log.segments.cleanable(first_dirty, log.high_watermark, now_ms,
                                       config.min_compaction_lag_ms)
        self.status.cleanable_bytes = found.cleanable_bytes
        self.status.dirty_ratio = found.ratio
        self.status.dirty_since_ms = (log.segments.first_timestamp_at(first_dirty)
                                      if first_dirty < log.log_end_offset else -1)
        return found

    def plan(self, now_ms: int, force: bool = False) -> Plan | None:
        """The next run, if one is due (or ``force``d: due or not)."""
        log = self.log
        config = log.settings().compaction
        found = self.cleanable(now_ms)
        if config is None or found is None or self.status.failure is not None:
            return None
        return due_plan(found, config, log.log_start_offset, now_ms, self.next_horizon, force)

    async def apply(self, chunk: Chunk, plan: Plan) -> bool:
        """Swap one chunk in; False (nothing changed) if the run must stop."""
        log = self.log
        async with log.log_lock:
            if log.deleted or log.log_start_offset != plan.log_start:
                self._end_run_file(Ops(), submit=True)
                return False
            ops = Ops()
            resized = []
            for change in chunk.changes:
                key = keys.offset_key(keys.LOG, log.prefix, change.offset)
                if change.data is None:
                    ops.delete(key)
                else:
                    if self._run_file is None:
                        self._run_file = log.files.new_file(ops, plan.now_ms)
                    position = log.files.write_to(self._run_file, change.data, ops)
                    ops.put(key, log_entry.file_entry(change.data, change.offset,
                                                      self._run_file.no, position, False))
                if log_entry.is_file(change.entry):
                    log.files.release(change.entry, ops)
                resized.append((change.offset,
                                (len(change.data) if change.data else 0) - change.old_size))
            log.size_bytes = max(0, log.size_bytes + sum(d for _o, d in resized))
            log.segments.resize(resized)
            self._splice_index(chunk, ops)
            if chunk.last:
                self._end_run_file(ops)
                log.clean_end = chunk.clean_end
                log.segments.merge_clean(chunk.clean_end, log.settings().segment_bytes)
                self.next_horizon = chunk.next_horizon
                self.status.runs += 1
            log.segments.flush(ops)
            self.status.bytes_reclaimed -= sum(d for _o, d in resized)
            ops.put(log.meta_key, log.meta())
            self._forget_cached(chunk.index_to)
            await log.writer.submit(ops)
        return True

    def finish_run(self) -> None:
        """A run ended (done, stopped or failed): its file takes no more batches."""
        self._end_run_file(Ops(), submit=True)

    def _end_run_file(self, ops: Ops, submit: bool = False) -> None:
        """The run's file takes no more batches (deleted if nothing in it is live)."""
        log = self.log
        if self._run_file is not None:
            log.files.done_writing(self._run_file, ops)
            self._run_file = None
            if submit:
                log.writer.submit(ops)

    def _forget_cached(self, end: int) -> None:
        """Drop the in-memory copies of batches below ``end`` (they may have changed)."""
        self.log._tail.drop_before(end)

    def _splice_index(self, chunk: Chunk, ops: Ops) -> None:
        """Rebuild the time index over [index_from, index_to) from the batches kept.

        The index holds (offset, running max timestamp) where the running max
        grows; retention relies on every batch before an entry's successor
        being no newer than the entry. Kept batches may be older than before,
        so the entry covering the range's end is carried to the end when the
        rebuilt maximum falls below it: the batches after the range may be as
        new as that.
        """
        log = self.log
        offsets, values = log._ts_offsets, log._ts_values
        start, end = chunk.index_from, chunk.index_to
        first, last = bisect_left(offsets, start), bisect_left(offsets, end)
        running = values[first - 1] if first else _TIMESTAMP_FLOOR
        covering = values[last - 1] if last else None
        new_offsets, new_values = array("q"), array("q")
        for base, timestamp in zip(chunk.bases, chunk.maxima, strict=True):
            if timestamp > running:
                new_offsets.append(base)
                new_values.append(timestamp)
                running = timestamp
        at_end = last < len(offsets) and offsets[last] == end
        if covering is not None and covering > running and not at_end:
            new_offsets.append(end)
            new_values.append(covering)
        ops.delete_range(keys.offset_key(keys.TIME_INDEX, log.prefix, start),
                         keys.offset_key(keys.TIME_INDEX, log.prefix, end))
        for offset, timestamp in zip(new_offsets, new_values, strict=True):
            ops.put(keys.offset_key(keys.TIME_INDEX, log.prefix, offset),
                    timestamp.to_bytes(8, "big", signed=True))
        offsets[first:last] = new_offsets
        values[first:last] = new_values
