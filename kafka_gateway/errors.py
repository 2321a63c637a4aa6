"""Every failure mapped to a Kafka error code, in one place."""

from __future__ import annotations

import logging

from kio.schema.errors import ErrorCode

from tablets import errors as storage
from txn import errors as txn

log = logging.getLogger(__name__)


class KafkaError(Exception):
    """A failure raised by the protocol layer with its code chosen already."""

    def __init__(self, code: ErrorCode, message: str | None = None) -> None:
        super().__init__(message or code.name)
        self.code = code
        self.message = message


_BY_TYPE: dict[type[BaseException], ErrorCode] = {
    storage.UnknownTopic: ErrorCode.unknown_topic_or_partition,
    storage.UnknownPartition: ErrorCode.unknown_topic_or_partition,
    storage.TopicAlreadyExists: ErrorCode.topic_already_exists,
    storage.InvalidPartitions: ErrorCode.invalid_partitions,
    storage.InvalidReplicationFactor: ErrorCode.invalid_replication_factor,
    storage.InvalidTopicName: ErrorCode.invalid_topic_exception,
    storage.InvalidConfig: ErrorCode.invalid_config,
    storage.RecordTooLarge: ErrorCode.message_too_large,
    storage.RecordBatchTooLarge: ErrorCode.record_list_too_large,
    storage.InvalidTimestamp: ErrorCode.invalid_timestamp,
    storage.OffsetOutOfRange: ErrorCode.offset_out_of_range,
    storage.UnsupportedMagic: ErrorCode.unsupported_for_message_format,
    storage.InvalidRecordBatch: ErrorCode.corrupt_message,
    storage.InvalidRecord: ErrorCode.invalid_record,
    storage.UnsupportedRecordKind: ErrorCode.invalid_txn_state,
    storage.PolicyViolation: ErrorCode.policy_violation,
    # Transactional batches refused (txn.TxnDoomed: a pending-bytes limit):
    # abortable in every client, never split and retried (docs/transactions.md).
    storage.BatchRefused: ErrorCode.policy_violation,
    storage.StorageError: ErrorCode.kafka_storage_error,
    storage.InvalidProducerEpoch: ErrorCode.invalid_producer_epoch,
    storage.OutOfOrderSequence: ErrorCode.out_of_order_sequence_number,
    storage.UnknownProducerId: ErrorCode.unknown_producer_id,
    txn.ProducerFenced: ErrorCode.producer_fenced,
    txn.InvalidProducerIdMapping: ErrorCode.invalid_producer_id_mapping,
    txn.InvalidTxnState: ErrorCode.invalid_txn_state,
    txn.InvalidTransactionTimeout: ErrorCode.invalid_transaction_timeout,
    txn.ConcurrentTransactions: ErrorCode.concurrent_transactions,
    txn.TransactionalIdNotFound: ErrorCode.transactional_id_not_found,
    # Per API, the code each client treats as "abort and go on": see
    # txn_error_code and docs/transactions.md.
    txn.TxnConflict: ErrorCode.unknown_producer_id,
}


def error_code(exc: BaseException) -> ErrorCode:
    """The protocol's code for an exception raised while serving a request."""
    if isinstance(exc, KafkaError):
        return exc.code
    for cls in type(exc).__mro__:
        code = _BY_TYPE.get(cls)
        if code is not None:
            return code
    log.exception("unexpected error while serving a request", exc_info=exc)
    return ErrorCode.unknown_server_error


def txn_error_code(exc: BaseException, version: int, fenced_since: int | None) -> ErrorCode:
    """The code of a transactional request's failure at this request version.

    PRODUCER_FENCED exists from KIP-588's versions on (``fenced_since``);
    before them, and where ``fenced_since`` is None (Produce, TxnOffsetCommit,
    whose clients know only INVALID_PRODUCER_EPOCH as fatal), a fenced
    producer gets INVALID_PRODUCER_EPOCH.
    """
    code = error_code(exc)
    if code is ErrorCode.producer_fenced and (fenced_since is None or version < fenced_since):
        return ErrorCode.invalid_producer_epoch
    return code


def error_message(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def record_errors(exc: BaseException) -> tuple[tuple[int, str], ...]:
    """(index in its batch, message) of each record a rejected batch was refused for."""
    if isinstance(exc, storage.RejectedRecords):
        return exc.record_errors
    return ()
