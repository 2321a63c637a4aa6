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


# ------------------------------------------------- idempotent producers


class InvalidProducerEpoch(TabletError):
    """A batch from an epoch older than the producer's current one."""


class OutOfOrderSequence(TabletError):
    """A batch that neither continues the producer's sequence nor repeats a recent one."""


class UnknownProducerId(TabletError):
    """A producer this partition has forgotten, continuing mid-sequence."""


__all__ = [
    "InvalidConfig",
    "InvalidPartitions",
    "InvalidProducerEpoch",
    "InvalidRecordBatch",
    "InvalidReplicationFactor",
    "InvalidTimestamp",
    "InvalidTopicName",
    "OffsetOutOfRange",
    "OutOfOrderSequence",
    "RecordTooLarge",
    "StorageError",
    "TabletError",
    "TopicAlreadyExists",
    "UnknownPartition",
    "UnknownProducerId",
    "UnknownTopic",
    "UnsupportedMagic",
    "UnsupportedRecordKind",
]
