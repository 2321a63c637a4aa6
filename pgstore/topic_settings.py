"""What a topic's configs mean to the PostgreSQL store.

``topic_settings`` makes the ``TabletSettings`` (engine-free, shared with
the RocksDB engine) an append, ``tablets.validate`` and retention read from
a topic's effective configs. Kafka's checks of a new topic's name and
partition count are both engines' (``tablets.topic_names``).

A compacted topic (``cleanup.policy`` with ``compact``) has its
``CompactionConfig``: its partitions refuse records without a key
(``tablets.validate``) and the log cleaner compacts them (``pgstore.cleaner``).
"""

from __future__ import annotations

from tablets.compaction_config import CompactionConfig
from tablets.config_parsing import parse_list
from tablets.tablet_settings import TabletSettings
from tablets.topic_config import IMPORTANT_GROUPS, IMPORTANT_MAX_BYTES


def topic_settings(topic: str, values: dict[str, str], max_producers: int) -> TabletSettings:
    """What a topic's effective configs (``tablets.topic_config.effective``)
    mean to its partitions: the fields ``tablets.validate`` and retention read."""
    deletes = "delete" in policies(values)
    compaction = CompactionConfig.of(values)
    segment_ms = int(values["segment.ms"])
    if compaction is not None:  # as Kafka and the embedded engine roll a compacted log
        segment_ms = min(segment_ms, compaction.max_compaction_lag_ms)
    return TabletSettings(
        topic=topic,
        max_message_bytes=int(values["max.message.bytes"]),
        log_append_time=values["message.timestamp.type"] == "LogAppendTime",
        timestamp_difference_max_ms=int(values["message.timestamp.difference.max.ms"]),
        segment_bytes=int(values["segment.bytes"]),
        segment_ms=segment_ms,
        retention_ms=int(values["retention.ms"]) if deletes else -1,
        retention_bytes=int(values["retention.bytes"]) if deletes else -1,
        deletes=deletes,
        max_producers=max_producers,
        compaction=compaction,
        important_groups=tuple(parse_list(values[IMPORTANT_GROUPS])),
        important_max_bytes=int(values[IMPORTANT_MAX_BYTES]),
    )


def policies(values: dict[str, str]) -> list[str]:
    return [p.strip() for p in parse_list(values["cleanup.policy"])]

