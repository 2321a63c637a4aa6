"""The one error model: every failure a request is answered with, as a Kafka error.

- One exception class per Kafka error the gateway raises (``InvalidRequest``,
  ``TopicAuthorizationFailed``, ...), each carrying its ``code`` and whether
  clients retry it (``retriable``), as aiokafka's errors do. Handlers raise
  them; ``error_class(code)`` names the class of a code known only at run time.
- The layers below do not know the protocol: the storage's and the transaction
  coordinator's exceptions (``tablets.errors``, ``txn.errors``) are mapped to
  these classes in ONE table, ``BY_TYPE``.
- Where Kafka answers one failure differently for one API (or some of its
  versions), ``OVERRIDES`` says so, once; ``error_code(exc, api_key, version)``
  applies it.
- ``EXPECTED`` is every exception this model answers with its own code. A
  handler catches those (per partition, per resource); anything else is a bug,
  left to the one broad ``except`` at the dispatch (connection.py), which counts
  it (``request_errors``) and closes the connection.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from kio.schema.errors import ErrorCode

from tablets import errors as storage
from txn import errors as txn

log = logging.getLogger(__name__)


class KafkaError(Exception):
    """A failure answered with ``code``; subclasses name one code each."""

    code: ClassVar[ErrorCode] = ErrorCode.unknown_server_error
    _by_code: ClassVar[dict[ErrorCode, type[KafkaError]]] = {}

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or self.code.name)
        self.message = message

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        assert cls.code not in KafkaError._by_code, f"two classes for {cls.code.name}"
        KafkaError._by_code[cls.code] = cls

    @property
    def retriable(self) -> bool:
        return bool(self.code.retriable)


def error_class(code: ErrorCode) -> type[KafkaError]:
    """The class of ``code`` (for a code chosen at run time: an authorization's)."""
    return KafkaError._by_code[code]


# ------------------------------------------------------- the classes raised
class UnknownServerError(KafkaError):
    code = ErrorCode.unknown_server_error


class OffsetOutOfRange(KafkaError):
    code = ErrorCode.offset_out_of_range


class CorruptMessage(KafkaError):
    code = ErrorCode.corrupt_message


class UnknownTopicOrPartition(KafkaError):
    code = ErrorCode.unknown_topic_or_partition


class MessageTooLarge(KafkaError):
    code = ErrorCode.message_too_large


class NotEnoughReplicas(KafkaError):
    code = ErrorCode.not_enough_replicas


class KafkaStorageError(KafkaError):
    code = ErrorCode.kafka_storage_error


class NotLeaderOrFollower(KafkaError):
    code = ErrorCode.not_leader_or_follower


class NotCoordinator(KafkaError):
    """Another gateway of the cluster coordinates the key (kafka_gateway/routing.py)."""

    code = ErrorCode.not_coordinator


class InvalidTopic(KafkaError):
    code = ErrorCode.invalid_topic_exception


class RecordListTooLarge(KafkaError):
    code = ErrorCode.record_list_too_large


class InvalidRequiredAcks(KafkaError):
    code = ErrorCode.invalid_required_acks


class IllegalGeneration(KafkaError):
    code = ErrorCode.illegal_generation


class InvalidTimestamp(KafkaError):
    code = ErrorCode.invalid_timestamp


class TopicAuthorizationFailed(KafkaError):
    code = ErrorCode.topic_authorization_failed


class GroupAuthorizationFailed(KafkaError):
    code = ErrorCode.group_authorization_failed


class ClusterAuthorizationFailed(KafkaError):
    code = ErrorCode.cluster_authorization_failed


class TransactionalIdAuthorizationFailed(KafkaError):
    code = ErrorCode.transactional_id_authorization_failed


class TopicAlreadyExists(KafkaError):
    code = ErrorCode.topic_already_exists


class InvalidPartitions(KafkaError):
    code = ErrorCode.invalid_partitions


class InvalidReplicationFactor(KafkaError):
    code = ErrorCode.invalid_replication_factor


class InvalidReplicaAssignment(KafkaError):
    code = ErrorCode.invalid_replica_assignment


class InvalidConfig(KafkaError):
    code = ErrorCode.invalid_config


class InvalidRequest(KafkaError):
    code = ErrorCode.invalid_request


class UnsupportedForMessageFormat(KafkaError):
    code = ErrorCode.unsupported_for_message_format


class PolicyViolation(KafkaError):
    code = ErrorCode.policy_violation


class OutOfOrderSequenceNumber(KafkaError):
    code = ErrorCode.out_of_order_sequence_number


class InvalidProducerEpoch(KafkaError):
    code = ErrorCode.invalid_producer_epoch


class InvalidTxnState(KafkaError):
    code = ErrorCode.invalid_txn_state


class InvalidProducerIdMapping(KafkaError):
    code = ErrorCode.invalid_producer_id_mapping


class InvalidTransactionTimeout(KafkaError):
    code = ErrorCode.invalid_transaction_timeout


class ConcurrentTransactions(KafkaError):
    code = ErrorCode.concurrent_transactions


class UnknownProducerId(KafkaError):
    code = ErrorCode.unknown_producer_id


class TransactionalIdNotFound(KafkaError):
    code = ErrorCode.transactional_id_not_found


class ProducerFenced(KafkaError):
    code = ErrorCode.producer_fenced


class InvalidRecord(KafkaError):
    code = ErrorCode.invalid_record


class InvalidGroupId(KafkaError):
    code = ErrorCode.invalid_group_id


class UnknownMemberId(KafkaError):
    code = ErrorCode.unknown_member_id


class CoordinatorNotAvailable(KafkaError):
    code = ErrorCode.coordinator_not_available


class FencedInstanceId(KafkaError):
    code = ErrorCode.fenced_instance_id


class RebalanceInProgress(KafkaError):
    code = ErrorCode.rebalance_in_progress


class FencedLeaderEpoch(KafkaError):
    code = ErrorCode.fenced_leader_epoch


class UnknownLeaderEpoch(KafkaError):
    code = ErrorCode.unknown_leader_epoch


class OffsetMetadataTooLarge(KafkaError):
    code = ErrorCode.offset_metadata_too_large


class GroupSubscribedToTopic(KafkaError):
    code = ErrorCode.group_subscribed_to_topic


class SecurityDisabled(KafkaError):
    code = ErrorCode.security_disabled


# ------------------------------- the layers below, mapped in this one table
BY_TYPE: dict[type[Exception], type[KafkaError]] = {
    storage.UnknownTopic: UnknownTopicOrPartition,
    storage.UnknownPartition: UnknownTopicOrPartition,
    storage.TopicAlreadyExists: TopicAlreadyExists,
    storage.InvalidPartitions: InvalidPartitions,
    storage.InvalidReplicationFactor: InvalidReplicationFactor,
    storage.InvalidTopicName: InvalidTopic,
    storage.InvalidConfig: InvalidConfig,
    storage.RecordTooLarge: MessageTooLarge,
    storage.RecordBatchTooLarge: RecordListTooLarge,
    storage.InvalidTimestamp: InvalidTimestamp,
    storage.OffsetOutOfRange: OffsetOutOfRange,
    storage.UnsupportedMagic: UnsupportedForMessageFormat,
    storage.InvalidRecordBatch: CorruptMessage,
    storage.InvalidRecord: InvalidRecord,
    storage.UnsupportedRecordKind: InvalidTxnState,
    storage.PolicyViolation: PolicyViolation,
    # Transactional batches refused (txn.TxnDoomed: a pending-bytes limit):
    # abortable in every client, never split and retried (docs/transactions.md).
    storage.BatchRefused: PolicyViolation,
    storage.StorageError: KafkaStorageError,
    # Another gateway claimed the partition (its leader epoch moved): clients
    # refresh their metadata and retry there.
    storage.NotLeader: NotLeaderOrFollower,
    # The group's coordinator slot moved to another gateway: the client asks
    # FindCoordinator again.
    storage.CoordinatorMoved: NotCoordinator,
    storage.InvalidProducerEpoch: InvalidProducerEpoch,
    storage.OutOfOrderSequence: OutOfOrderSequenceNumber,
    storage.UnknownProducerId: UnknownProducerId,
    txn.ProducerFenced: ProducerFenced,
    txn.InvalidProducerIdMapping: InvalidProducerIdMapping,
    txn.InvalidTxnState: InvalidTxnState,
    txn.InvalidTransactionTimeout: InvalidTransactionTimeout,
    txn.ConcurrentTransactions: ConcurrentTransactions,
    txn.TransactionalIdNotFound: TransactionalIdNotFound,
    # The code each client treats as "abort and go on" (docs/transactions.md);
    # TxnOffsetCommit answers otherwise (OVERRIDES).
    txn.TxnConflict: UnknownProducerId,
}

# Every exception answered with its own code; anything else is a bug.
EXPECTED: tuple[type[Exception], ...] = (KafkaError, *BY_TYPE)


# ------------------------------------------- where one API answers otherwise
PRODUCE, INIT_PRODUCER_ID, ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN, \
    TXN_OFFSET_COMMIT = 0, 22, 24, 25, 26, 28


@dataclass(frozen=True, slots=True)
class Override:
    """At ``api_key``, from ``since`` up to ``before`` (exclusive; None: every
    version), a failure of class ``raised`` (the exception itself, or the
    class it maps to) is answered with ``answer``."""

    api_key: int
    raised: type[Exception]
    answer: type[KafkaError]
    before: int | None = None
    why: str = ""

    def applies(self, api_key: int, version: int) -> bool:
        return api_key == self.api_key and (self.before is None or version < self.before)


OVERRIDES: tuple[Override, ...] = (
    # KIP-588: PRODUCER_FENCED exists from these versions on; before them, and
    # at Produce and TxnOffsetCommit (whose clients know only
    # INVALID_PRODUCER_EPOCH as fatal), a fenced producer gets INVALID_PRODUCER_EPOCH.
    Override(INIT_PRODUCER_ID, ProducerFenced, InvalidProducerEpoch, before=4, why="KIP-588"),
    Override(ADD_PARTITIONS_TO_TXN, ProducerFenced, InvalidProducerEpoch, before=2,
             why="KIP-588"),
    Override(ADD_OFFSETS_TO_TXN, ProducerFenced, InvalidProducerEpoch, before=2, why="KIP-588"),
    Override(END_TXN, ProducerFenced, InvalidProducerEpoch, before=2, why="KIP-588"),
    Override(PRODUCE, ProducerFenced, InvalidProducerEpoch, why="KIP-588: not for Produce"),
    Override(TXN_OFFSET_COMMIT, ProducerFenced, InvalidProducerEpoch,
             why="KIP-588: not for TxnOffsetCommit"),
    # A failed offset-range check at TxnOffsetCommit: ILLEGAL_GENERATION, which
    # every client treats as "abort the transaction and rejoin".
    Override(TXN_OFFSET_COMMIT, txn.TxnConflict, IllegalGeneration,
             why="abortable at TxnOffsetCommit"),
    # As Kafka 3.6+ translates a transaction verification's
    # CONCURRENT_TRANSACTIONS for Produce: NOT_ENOUGH_REPLICAS, which every
    # client retries without a metadata refresh.
    Override(PRODUCE, ConcurrentTransactions, NotEnoughReplicas, why="Kafka 3.6+ Produce"),
)


def mapped_class(exc: BaseException) -> type[KafkaError]:
    """The class ``exc`` is answered as, before any per-API override."""
    if isinstance(exc, KafkaError):
        return type(exc)
    for cls in type(exc).__mro__:
        found = BY_TYPE.get(cls)
        if found is not None:
            return found
    log.exception("unexpected error while serving a request", exc_info=exc)
    return UnknownServerError


def answer_class(exc: BaseException, api_key: int | None = None,
                 version: int = 0) -> type[KafkaError]:
    """The class of the answer to ``exc`` at this API and version (OVERRIDES applied)."""
    mapped = mapped_class(exc)
    if api_key is not None:
        for override in OVERRIDES:
            if override.applies(api_key, version) and (
                    isinstance(exc, override.raised) or issubclass(mapped, override.raised)):
                return override.answer
    return mapped


def error_code(exc: BaseException, api_key: int | None = None, version: int = 0) -> ErrorCode:
    """The protocol's code for an exception raised while serving a request."""
    return answer_class(exc, api_key, version).code


def code_of(check: Callable[..., object], *args: Any, **kwargs: Any) -> ErrorCode:
    """ErrorCode.none if ``check`` passes, else the code of the KafkaError it
    raises: where an answer holds a check's outcome as a value (a group's code
    over its partitions' answers)."""
    try:
        check(*args, **kwargs)
    except KafkaError as exc:
        return exc.code
    return ErrorCode.none


def error_message(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def record_errors(exc: BaseException) -> tuple[tuple[int, str], ...]:
    """(index in its batch, message) of each record a rejected batch was refused for."""
    if isinstance(exc, storage.RejectedRecords):
        return exc.record_errors
    return ()
