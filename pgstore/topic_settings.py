"""What a topic's configs mean to the PostgreSQL store, and Kafka's checks of a
new topic's name.

``topic_settings`` makes the ``TabletSettings`` (engine-free, shared with
the RocksDB engine) an append, ``tablets.validate`` and retention read from
a topic's effective configs. ``check_topic_name`` and
``collision_key`` mirror ``tablets.topic_catalog``'s (Kafka's Topic.validate
and Topic.hasCollision), which lives in the RocksDB engine's catalog.

Compacted topics (``cleanup.policy`` with ``compact``) are not available on
this store yet: ``refuse_compaction`` answers INVALID_CONFIG at create and
alter, so nothing relies on a cleaner that does not run.
"""

from __future__ import annotations

import re

from tablets.config_parsing import parse_list
from tablets.errors import InvalidConfig, InvalidTopicName
from tablets.tablet_settings import TabletSettings
from tablets.topic_config import IMPORTANT_GROUPS, IMPORTANT_MAX_BYTES

_LEGAL_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_NAME = 249
MAX_PARTITIONS = 10_000


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


def check_topic_name(name: str) -> None:
    """Kafka's topic name rules (Topic.validate)."""
    if not name:
        raise InvalidTopicName("Topic name is illegal, it can't be empty")
    if name in (".", ".."):
        raise InvalidTopicName("Topic name cannot be \".\" or \"..\"")
    if len(name) > MAX_TOPIC_NAME:
        raise InvalidTopicName(
            f"Topic name is illegal, it can't be longer than {MAX_TOPIC_NAME} characters")
    if not _LEGAL_NAME.match(name):
        raise InvalidTopicName(
            f"Topic name {name!r} is illegal, it contains a character other than ASCII "
            "alphanumerics, '.', '_' and '-'")


def collision_key(name: str) -> str:
    """Kafka's metric names turn '.' into '_': two topics whose names then
    match would collide (Topic.hasCollision), so the second is refused."""
    return name.replace(".", "_")
