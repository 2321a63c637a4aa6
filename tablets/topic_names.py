"""Kafka's limits on a topic's name and partition count (``Topic.validate``,
the controller's partition cap), shared by both engines' catalogs and the
protocol layer's early name checks."""

from __future__ import annotations

import re
from collections.abc import Callable

from .errors import (
    InvalidPartitions,
    InvalidReplicationFactor,
    InvalidTopicName,
    TopicAlreadyExists,
)
from .topic_config import validate_all

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


def check_new_topic(name: str, partitions: int, replication_factor: int,
                    configs: dict[str, str | None], *, exists: Callable[[str], bool],
                    colliding: Callable[[str], str | None],
                    check_configs: Callable[[dict[str, str]], None] | None = None,
                    ) -> dict[str, str]:
    """Every check of a new topic, in the order Kafka's controller makes them;
    returns the config overrides as they are stored. ``colliding``: the name
    of an existing topic with the same collision key, if any;
    ``check_configs``: an engine's own refusal of the stored overrides."""
    check_topic_name(name)
    if exists(name):
        raise TopicAlreadyExists(f"Topic '{name}' already exists.")
    other = colliding(collision_key(name))
    if other is not None:
        raise InvalidTopicName(f"Topic '{name}' collides with existing topic: {other}")
    stored = validate_all(configs)
    if check_configs is not None:
        check_configs(stored)
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise InvalidPartitions(
            f"Number of partitions must be between 1 and {MAX_PARTITIONS}, got {partitions}")
    if replication_factor not in (-1, 1):
        raise InvalidReplicationFactor(
            f"Replication factor {replication_factor} is larger than the 1 available broker")
    return stored
