"""The storage seam (``tablets.seam``), its health and statistics values:
what ``NodeStorage`` reports for /metrics, the web console and the benchmarks.

- ``WriteStats`` (``write_stats``): the node's atomic writes -- count, bytes,
  latency, how many changes each write gathered (``GROUP_SIZE_BUCKETS``);
- ``CleanerStats`` (``cleaner_stats``), ``PartitionCompaction`` and
  ``CompactionStatus`` (``compaction_statuses``), ``RunStats`` (``compact``):
  the log cleaner, node-wide, per partition and per run;
- ``ImportantGroup`` (``important_groups``): an important consumer group's
  hold on one partition.

Plain dataclasses, engine-independent. Callers import them from
``tablets.seam``, the seam's one public entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from common.histogram import Histogram

# Changes per atomic write: how much the group commit gathers.
GROUP_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


@dataclass(slots=True)
class WriteStats:
    """The node's atomic writes, exported as metrics (and read by the benchmarks)."""

    writes: int = 0  # store writes (one per group)
    loop_writes: int = 0  # of those, written on the event loop (store.py)
    changes: int = 0  # atomic changes submitted
    fsyncs: int = 0
    bytes: int = 0
    write_seconds: float = 0.0
    write_latency: Histogram = field(default_factory=Histogram)  # seconds per write
    group_sizes: Histogram = field(default_factory=lambda: Histogram(GROUP_SIZE_BUCKETS))


@dataclass(slots=True)
class RunStats:
    keys: int = 0
    map_end: int = 0
    records_read: int = 0
    records_kept: int = 0
    bytes_read: int = 0  # by both passes
    bytes_cleaned: int = 0  # the log rewritten: from its start to where the map ended
    bytes_reclaimed: int = 0
    batches_rewritten: int = 0
    batches_dropped: int = 0
    blobs_deleted: int = 0


@dataclass(slots=True)
class CleanerStats:
    """Node-wide totals, exported as metrics."""

    runs: int = 0
    chunks: int = 0  # chunks swapped in
    bytes_read: int = 0
    bytes_reclaimed: int = 0
    failures: int = 0
    seconds: float = 0.0
    running: bool = False  # a run is under way now


@dataclass(slots=True)
class CompactionStatus:
    """One partition's compaction, for metrics."""

    runs: int = 0
    bytes_reclaimed: int = 0
    cleanable_bytes: int = 0  # as of the last check
    dirty_ratio: float = 0.0  # likewise
    dirty_since_ms: int = -1  # first batch timestamp of the oldest uncompacted segment
    failure: str | None = None  # why the last run failed: the partition is skipped


@dataclass(frozen=True, slots=True)
class PartitionCompaction:
    """One compacted partition's compaction, for metrics."""

    topic: str
    partition: int
    status: CompactionStatus
    clean_offset: int  # up to where the log is compacted


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
