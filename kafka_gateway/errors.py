"""Every failure mapped to a Kafka error code, in one place."""

from __future__ import annotations

import logging

from kio.schema.errors import ErrorCode

from tablets import errors as storage

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
    storage.InvalidTimestamp: ErrorCode.invalid_timestamp,
    storage.OffsetOutOfRange: ErrorCode.offset_out_of_range,
    storage.UnsupportedMagic: ErrorCode.unsupported_for_message_format,
    storage.InvalidRecordBatch: ErrorCode.corrupt_message,
    storage.InvalidRecord: ErrorCode.invalid_record,
    storage.UnsupportedRecordKind: ErrorCode.invalid_txn_state,
    storage.StorageError: ErrorCode.kafka_storage_error,
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


def error_message(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def record_errors(exc: BaseException) -> tuple[tuple[int, str], ...]:
    """(index in its batch, message) of each record a rejected batch was refused for."""
    if isinstance(exc, storage.RejectedRecords):
        return exc.record_errors
    return ()
