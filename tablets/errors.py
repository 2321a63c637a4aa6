"""Storage-level errors, in storage terms.

The gateway maps each to a Kafka error code in one place
(``kafka_gateway.errors``); the storage layer never sees protocol codes.
"""

from __future__ import annotations

from .batch import InvalidRecordBatch, UnsupportedMagic
from .store import StorageError
from .topic_config import InvalidConfig


class TabletError(Exception):
    """Base class for failures a request can be answered with."""


class UnknownTopic(TabletError):
    pass


class UnknownPartition(TabletError):
    pass


class TopicAlreadyExists(TabletError):
    pass


class InvalidPartitions(TabletError):
    pass


class InvalidReplicationFactor(TabletError):
    pass


class InvalidTopicName(TabletError):
    pass


class RecordTooLarge(TabletError):
    pass


class InvalidTimestamp(TabletError):
    pass


class OffsetOutOfRange(TabletError):
    pass


class UnsupportedRecordKind(TabletError):
    """Transactional or control batches where this node does not take them."""


__all__ = [
    "InvalidConfig",
    "InvalidPartitions",
    "InvalidRecordBatch",
    "InvalidReplicationFactor",
    "InvalidTimestamp",
    "InvalidTopicName",
    "OffsetOutOfRange",
    "RecordTooLarge",
    "StorageError",
    "TabletError",
    "TopicAlreadyExists",
    "UnknownPartition",
    "UnknownTopic",
    "UnsupportedMagic",
    "UnsupportedRecordKind",
]
