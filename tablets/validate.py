"""What a produced record set must be before anything of it is stored.

Kafka 3.4's checks for magic 2 (ProduceRequest.validateRecords, UnifiedLog's
analyzeAndValidateRecords, LogValidator and the DefaultRecord reader), in
Kafka's order, each failure with Kafka's error:

1. ``check_header``, cheap, on the event loop:
   - the headers parse, magic 2, lengths fit (CORRUPT_MESSAGE, as before);
   - exactly one batch, base offset 0 (INVALID_RECORD);
   - no larger than max.message.bytes (MESSAGE_TOO_LARGE);
   - the CRC-32C matches (CORRUPT_MESSAGE);
   - a record count above 0 that matches the last offset delta, no control
     batch, a sequence for a producer id (INVALID_RECORD).
2. ``check_records``, which decompresses and walks every record as a stream
   (``records.walk``), never holding a key or value:
   - record lengths, varints, key/value/header lengths, no trailing bytes,
     exactly the declared count (INVALID_RECORD);
   - undecodable compressed data (CORRUPT_MESSAGE: Kafka 3.4 lets the codec's
     IOException escape as UNKNOWN_SERVER_ERROR, which no client can act on);
   - timestamps within message.timestamp.difference.max.ms of now, and no
     LogAppendTime set by the producer (INVALID_TIMESTAMP, naming each
     record at fault in record_errors, as Kafka does);
   - in a compacted topic, a key in every record (INVALID_RECORD; a record
     without one is named for that alone, and any timestamp error among
     the others makes the answer INVALID_TIMESTAMP, as in Kafka);
   - then, as Kafka's log append, no larger than segment.bytes
     (RECORD_LIST_TOO_LARGE).
   It returns the largest record timestamp, which the tablet stores as the
   batch's max timestamp, as Kafka does, whatever the producer wrote there.

Stricter than Kafka, deliberately: offset deltas must be 0, 1, 2... (Kafka
rewrites a compressed batch whose deltas are not, and stores an uncompressed
one as it is, so consumers see offsets that do not exist), and a key, value
or header-value length below -1 is refused (Kafka reads it as null, but
librdkafka consumers then fail on the batch).

A batch is checked on the event loop when that is cheap (uncompressed, at
most ``INLINE_RECORDS`` records: ~30 ns a record); otherwise on a worker
thread (the tablet keeps appends in arrival order either way).

``check_batch`` is the produce path's entry: one C call
(``_records.check_batch``) makes ``check_header``'s checks and, for a batch
checked on the event loop, ``check_records``' too, and accepts the batch or
names the first check it failed; then these Python checks run on it and
raise their error, so what is refused, and with what, is what they decide.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import batch as batch_header

try:
    from ._records import INLINE_RECORDS
    from ._records import check_batch as _check_batch
except ImportError as exc:  # built before these functions: rebuild it
    raise ImportError("tablets._records is older than tablets/_records.c: run "
                      "`pip install -e .`") from exc
from .errors import (
    InvalidRecord,
    InvalidTimestamp,
    RecordBatchTooLarge,
    RecordTooLarge,
    RejectedRecords,
)
from .records import RecordError, RecordWalker, walk

if TYPE_CHECKING:
    from .tablet_settings import TabletSettings

__all__ = ["INLINE_RECORDS", "check_batch", "check_header", "check_records", "runs_inline"]

# Record errors named in one answer: Kafka names every record, but a small
# compressed batch can declare two billion of them.
MAX_RECORD_ERRORS = 10_000
NO_LIMIT = 2**63 - 1


def check_batch(records: memoryview, settings: TabletSettings,
                now_ms: int) -> tuple[batch_header.BatchHeader, int | None]:
    """``check_header`` and, when it ``runs_inline``, ``check_records``, in one
    C call: the header and the largest record timestamp. None instead of the
    timestamp when the records are still to be checked: a batch checked off
    the event loop, or one the C call refused (``check_header`` has then
    passed, so ``check_records`` raises). Raises what ``check_header`` raises."""
    checked = _check_batch(records, batch_header.BatchHeader, settings.max_message_bytes,
                           settings.segment_bytes, settings.timestamp_difference_max_ms,
                           now_ms, settings.log_append_time, settings.compaction is not None)
    if isinstance(checked, tuple):
        return checked
    # Refused (``checked`` names the check): the Python checks name the error.
    return check_header(records, settings), None


def check_header(records: memoryview, settings: TabletSettings) -> batch_header.BatchHeader:
    """The batch-level checks; returns the record set's one batch header."""
    headers = batch_header.parse_batches(records, verify_crc=False)
    if len(headers) != 1:
        raise InvalidRecord(
            f"a record set must hold exactly one record batch, this one holds {len(headers)}"
        )
    [header] = headers
    if header.base_offset != 0:
        raise InvalidRecord(
            f"The baseOffset of the record batch should be 0, but it is {header.base_offset}"
        )
    if header.size > settings.max_message_bytes:
        raise RecordTooLarge(
            f"batch of {header.size} bytes exceeds max.message.bytes="
            f"{settings.max_message_bytes}"
        )
    batch_header.check_crc(records, header)
    last = header.last_offset_delta
    if last < 0:
        raise InvalidRecord(f"Batch has an invalid offset range: [0, {last}]")
    if header.record_count <= 0:
        raise InvalidRecord(f"Invalid reported count for record batch: {header.record_count}")
    if header.record_count != last + 1:
        raise InvalidRecord(
            f"Inconsistent batch offset range [0, {last}] and count of records "
            f"{header.record_count}"
        )
    if header.is_control:
        raise InvalidRecord("Clients are not allowed to write control records")
    if header.producer_id >= 0 and header.base_sequence < 0:
        raise InvalidRecord(
            f"Invalid sequence number {header.base_sequence} in record batch with producerId "
            f"{header.producer_id}"
        )
    return header


def runs_inline(header: batch_header.BatchHeader) -> bool:
    """Whether ``check_records`` is cheap enough for the event loop."""
    return header.compression == 0 and header.record_count <= INLINE_RECORDS


def check_records(
    records: memoryview, header: batch_header.BatchHeader, settings: TabletSettings, now_ms: int,
    partition: str = "",
) -> int:
    """The record-level checks; returns the largest record timestamp (-1 if none).

    ``partition`` names the topic partition in messages, as Kafka's do.
    Thread-safe: reads only its arguments.
    """
    producer_log_append_time = bool(header.attributes & batch_header.ATTR_TIMESTAMP_TYPE)
    window = _timestamp_window(settings, now_ms)
    walker = RecordWalker(
        header.record_count,
        header.base_timestamp,
        contiguous=True,
        timestamp_range=None if producer_log_append_time else window,
        # No more errors than records: the walker allocates room for
        # max_errors up front, which cost a small batch more than its walk.
        max_errors=min(MAX_RECORD_ERRORS, header.record_count),
        release_gil=not runs_inline(header),  # then this runs on a worker thread
        require_keys=settings.compaction is not None,
    )
    try:
        walk(records, header, walker)
    except RecordError as exc:
        raise InvalidRecord(f"invalid record batch: {exc}") from None
    keyless = [(index, f"Compacted topic cannot accept message without key in topic partition "
                       f"{partition}.") for index in walker.keyless]
    if producer_log_append_time:
        raise _log_append_time_refused(header, window, settings, now_ms, keyless)
    if walker.bad_timestamp_count:
        limit = settings.timestamp_difference_max_ms
        raise InvalidTimestamp(
            "One or more records have been rejected due to invalid timestamp",
            sorted(keyless + [(index, _out_of_range(timestamp, index, now_ms, limit))
                              for index, timestamp in walker.bad_timestamps])[:MAX_RECORD_ERRORS],
        )
    if walker.keyless_count:
        raise _keyless_refused(walker.keyless_count, keyless)
    if header.size > settings.segment_bytes:
        raise RecordBatchTooLarge(
            f"Message batch size is {header.size} bytes in append to partition {partition}, "
            f"which exceeds the maximum configured segment size of {settings.segment_bytes}.")
    return walker.max_timestamp


def _keyless_refused(count: int, keyless: list[tuple[int, str]]) -> InvalidRecord:
    shown = ", ".join(f"RecordError(batchIndex={index}, message='{message}')"
                      for index, message in keyless[:3])
    return InvalidRecord(
        f"One or more records have been rejected due to {count} record errors in total, and "
        f"only showing the first three errors at most: [{shown}]", keyless)


def _timestamp_window(settings: TabletSettings, now_ms: int) -> tuple[int, int] | None:
    """The record timestamps a CreateTime topic accepts, or None for any."""
    limit = settings.timestamp_difference_max_ms
    if settings.log_append_time or limit >= NO_LIMIT:
        return None
    return max(now_ms - limit, -(2**63)), min(now_ms + limit, NO_LIMIT)


def _out_of_range(timestamp: int, index: int, now_ms: int, limit: int) -> str:
    return (
        f"Timestamp {timestamp} of message with offset {index} is out of range. The timestamp "
        f"should be within [{now_ms - limit}, {now_ms + limit}]"
    )


def _log_append_time_refused(
    header: batch_header.BatchHeader, window: tuple[int, int] | None, settings: TabletSettings,
    now_ms: int, keyless: list[tuple[int, str]],
) -> RejectedRecords:
    """Kafka refuses every record of a batch whose producer set LogAppendTime
    (each record's timestamp is then the batch's max timestamp), but names a
    record without a key, in a compacted topic, for its key alone."""
    timestamp = header.max_timestamp
    out_of_range = window is not None and timestamp != -1 and not (
        window[0] <= timestamp <= window[1]
    )
    named = dict(keyless)
    errors = [
        (index, named.get(index) or (
            _out_of_range(timestamp, index, now_ms, settings.timestamp_difference_max_ms)
            if out_of_range else
            f"Invalid timestamp type in message with offset {index}. Producer should not set "
            "timestamp type to LogAppendTime."))
        for index in range(min(header.record_count, MAX_RECORD_ERRORS))
    ]
    if len(keyless) == header.record_count:
        return _keyless_refused(len(keyless), keyless)
    return InvalidTimestamp("One or more records have been rejected due to invalid timestamp",
                            errors)
