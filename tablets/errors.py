"""Storage-level errors, in storage terms.

The gateway maps each to a Kafka error code in one place
(``kafka_gateway.errors``); the storage layer never sees protocol codes.
"""

from __future__ import annotations

from collections.abc import Sequence

from .batch import InvalidRecordBatch, UnsupportedMagic
from .topic_config import InvalidConfig


class StorageError(RuntimeError):
    """A write to the store failed: nothing of that change is acknowledged."""


class ChangeRefused(StorageError):
    """A compare-and-set inside a change refused it (a row another gateway
    moved): nothing of the change was written."""


class CounterMoved(ChangeRefused):
    """Another gateway set a counter (``set_counter``) since this one read it:
    nothing of the change was written. The engine's view of the counter is
    the stored one now, so a new change allocating from it can succeed."""


class CommitRefused(ChangeRefused):
    """A transaction's commit was refused by a compare-and-set inside it (its
    offsets' rows moved since they were read): nothing of it was written, and
    the coordinator aborts the transaction instead."""


class TxnStateMismatch(StorageError):
    """Offsets staged for a transaction another gateway coordinates were
    refused: its stored state (``state``, the coordinator's encoding; None:
    no such transactional id) is not an open transaction of that producer id
    and epoch to which AddOffsetsToTxn added the group. Nothing was staged."""

    def __init__(self, message: str, state: bytes | None) -> None:
        super().__init__(message)
        self.state = state


class OffsetBehind(StorageError):
    """Offsets staged for a transaction another gateway coordinates were
    refused: one is below the partition's committed offset (that range was
    processed already). Nothing was staged."""


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


class RecordBatchTooLarge(TabletError):
    """A batch larger than the topic's segment.bytes (Kafka cannot fit it in a
    segment, and refuses it: RECORD_LIST_TOO_LARGE)."""


class RejectedRecords(TabletError):
    """A batch refused for what its records hold. Kafka names the records at
    fault by their index in the batch (Produce's record_errors)."""

    def __init__(self, message: str, record_errors: Sequence[tuple[int, str]] = ()) -> None:
        super().__init__(message)
        self.record_errors = tuple(record_errors)


class InvalidRecord(RejectedRecords):
    """A batch Kafka's LogValidator refuses: counts, offsets or record structure."""


class InvalidTimestamp(RejectedRecords):
    pass


class OffsetOutOfRange(TabletError):
    pass


class PolicyViolation(TabletError):
    """A request the topic's cleanup.policy does not allow (DeleteRecords
    without "delete")."""


class BatchRefused(TabletError):
    """A transactional batch its transaction refused (a limit; the transaction
    can only abort), or a retry of one: nothing of it is stored."""


class UnsupportedRecordKind(TabletError):
    """Transactional or control batches where this node does not take them."""


class NotLeader(TabletError):
    """This node no longer leads the partition: its leader epoch moved (another
    gateway claimed it). Nothing of the refused write was stored; clients
    refresh their metadata and go on (NOT_LEADER_OR_FOLLOWER)."""


class CoordinatorMoved(TabletError):
    """This node no longer coordinates the group: its coordinator slot's epoch
    moved (another gateway took it), or it never held it. Nothing of the
    refused write was stored; clients look for the coordinator again
    (NOT_COORDINATOR)."""


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
    "InvalidRecord",
    "InvalidRecordBatch",
    "InvalidReplicationFactor",
    "InvalidTimestamp",
    "InvalidTopicName",
    "NotLeader",
    "OffsetOutOfRange",
    "OutOfOrderSequence",
    "PolicyViolation",
    "RecordBatchTooLarge",
    "RecordTooLarge",
    "RejectedRecords",
    "StorageError",
    "TabletError",
    "TopicAlreadyExists",
    "UnknownPartition",
    "UnknownProducerId",
    "UnknownTopic",
    "UnsupportedMagic",
    "UnsupportedRecordKind",
]
