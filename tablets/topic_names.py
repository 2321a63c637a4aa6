"""Kafka's limits on a topic's name and partition count (``Topic.validate``,
the controller's partition cap), shared by both engines' catalogs and the
protocol layer's early name checks."""

from __future__ import annotations

import re

from .errors import InvalidTopicName

_LEGAL_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_NAME = 249
MAX_PARTITIONS = 10_000


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
