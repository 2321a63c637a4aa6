"""TabletSettings: the effective topic configs a partition tablet enforces.

Its own module so that the tablet's parts (compacted_log, truncation,
txn_log, validate) can name it without importing the tablet itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from .compaction_config import CompactionConfig


@dataclass(frozen=True, slots=True)
class TabletSettings:
    """The effective configs a tablet enforces (read from the topic each time)."""

    max_message_bytes: int
    log_append_time: bool
    timestamp_difference_max_ms: int
    retention_ms: int
    retention_bytes: int
    max_producers: int = 10_000  # producer ids whose sequences a partition keeps
    topic: str = ""  # the topic's name, for messages
    # When Kafka would roll a segment: segment.bytes, and segment.ms (for a
    # compacted topic at most max.compaction.lag.ms, as in Kafka).
    segment_bytes: int = 1 << 30
    segment_ms: int = 604_800_000
    deletes: bool = True  # cleanup.policy has "delete" (DeleteRecords is allowed)
    compaction: CompactionConfig | None = None  # cleanup.policy has "compact"
    # gateway.transactional.produce.offset=lower-bound: a transactional batch
    # is answered with a lower bound of its offset instead of -1.
    txn_offset_lower_bound: bool = False
    # gateway.important.consumer.groups / .max.bytes (tablets/important.py).
    important_groups: tuple[str, ...] = ()
    important_max_bytes: int = -1
