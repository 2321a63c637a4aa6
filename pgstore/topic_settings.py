"""What a topic's configs mean to the PostgreSQL store.

``topic_settings`` makes the ``TabletSettings`` (engine-free, shared with
the RocksDB engine) an append, ``tablets.validate`` and retention read from
a topic's effective configs. Kafka's checks of a new topic's name and
partition count are both engines' (``tablets.topic_names``).

Compacted topics (``cleanup.policy`` with ``compact``) are not available on
this store yet: ``refuse_compaction`` answers INVALID_CONFIG at create and
alter, so nothing relies on a cleaner that does not run.
"""

from __future__ import annotations

from tablets.config_parsing import parse_list
from tablets.errors import InvalidConfig
from tablets.tablet_settings import TabletSettings
from tablets.topic_config import IMPORTANT_GROUPS, IMPORTANT_MAX_BYTES


def topic_settings(topic: str, values: dict[str, str], max_producers: int) -> TabletSettings:
    """What a topic's effective configs (``tablets.topic_config.effective``)
    mean to its partitions: the fields ``tablets.validate`` and retention read."""
    deletes = "delete" in policies(values)
    return TabletSettings(
        topic=topic,
        max_message_bytes=int(values["max.message.bytes"]),
        log_append_time=values["message.timestamp.type"] == "LogAppendTime",
        timestamp_difference_max_ms=int(values["message.timestamp.difference.max.ms"]),
        segment_bytes=int(values["segment.bytes"]),
        segment_ms=int(values["segment.ms"]),
        retention_ms=int(values["retention.ms"]) if deletes else -1,
        retention_bytes=int(values["retention.bytes"]) if deletes else -1,
        deletes=deletes,
        max_producers=max_producers,
        compaction=None,  # never compacted here (refuse_compaction)
        important_groups=tuple(parse_list(values[IMPORTANT_GROUPS])),
        important_max_bytes=int(values[IMPORTANT_MAX_BYTES]),
    )


def policies(values: dict[str, str]) -> list[str]:
    return [p.strip() for p in parse_list(values["cleanup.policy"])]


def refuse_compaction(values: dict[str, str]) -> None:
    """INVALID_CONFIG for a compacted topic (its effective cleanup.policy)."""
    if "compact" in policies(values):
        raise InvalidConfig(
            "Invalid value compact for configuration cleanup.policy: compacted topics are not "
            "yet available on the PostgreSQL store")
