"""Kafka v2 record batch headers: parse, check and patch.

Storage keeps a batch as the bytes the producer sent. This module reads and
patches only the 61-byte header, which carries everything storage needs
(offset delta, timestamps, producer id, epoch and sequence, the transactional
flag). Offsets are assigned by patching ``baseOffset``, which lies outside
the CRC, so compressed batches pass through untouched. The records
themselves are checked once, at produce time, by ``validate``.

Layout (all big-endian)::

    0  baseOffset            int64     <- patched on append
    8  batchLength           int32        (bytes after this field)
    12 partitionLeaderEpoch  int32     <- patched on append
    16 magic                 int8         (must be 2)
    17 crc                   uint32       CRC-32C of bytes 21..end
    21 attributes            int16
    23 lastOffsetDelta       int32
    27 baseTimestamp         int64
    35 maxTimestamp          int64
    43 producerId            int64
    51 producerEpoch         int16
    53 baseSequence          int32
    57 recordCount           int32
    61 records...
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from crc32c import crc32c

try:
    from ._records import stamp as _stamp
except ImportError as exc:  # built before these functions: rebuild it
    raise ImportError("tablets._records is older than tablets/_records.c: run "
                      "`pip install -e .`") from exc

HEADER_SIZE = 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: bytes not counted by batchLength
CRC_START = 21

_HEADER = struct.Struct(">qiibIhiqqqhii")
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_CRC = struct.Struct(">I")
_BEFORE_CRC = struct.Struct(">qiibI")
_AFTER_CRC = struct.Struct(">hiqqqhii")

ATTR_COMPRESSION_MASK = 0x07
ATTR_TIMESTAMP_TYPE = 0x08  # set: LogAppendTime
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20
# Set by compaction (KIP-534): the base timestamp is the batch's delete
# horizon, after which its tombstones and its empty-transaction marker go.
ATTR_DELETE_HORIZON = 0x40


class InvalidRecordBatch(ValueError):
    """The bytes are not a valid v2 record batch (maps to CORRUPT_MESSAGE)."""


class UnsupportedMagic(InvalidRecordBatch):
    """A v0/v1 message set: Produce v3+ requires magic 2."""


@dataclass(slots=True)
class BatchHeader:
    """The fields of one batch header, plus where it sits in its buffer.

    Not frozen: a frozen dataclass sets each field through
    ``object.__setattr__``, which made building one cost seven times as much,
    once for every produced batch. Nothing changes a header once parsed."""

    start: int  # position of the batch in the buffer it was parsed from
    size: int  # whole batch size in bytes, header included
    base_offset: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def compression(self) -> int:
        return self.attributes & ATTR_COMPRESSION_MASK

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)


def parse_batches(data: bytes | memoryview, verify_crc: bool = True) -> list[BatchHeader]:
    """Parse and check the header of every batch in a record set.

    Raises InvalidRecordBatch on a truncated, malformed or (with
    ``verify_crc``) corrupt batch, UnsupportedMagic on the v0/v1 formats.
    """
    view = memoryview(data)
    end = len(view)
    if end == 0:
        raise InvalidRecordBatch("empty record set")
    headers: list[BatchHeader] = []
    pos = 0
    while pos < end:
        if end - pos < HEADER_SIZE:
            # A v0/v1 message set has a shorter header; report it as such.
            if end - pos >= 17 and view[pos + 16] in (0, 1):
                raise UnsupportedMagic(f"message format v{view[pos + 16]} is not supported")
            raise InvalidRecordBatch(f"truncated batch header at byte {pos}")
        (
            base_offset,
            batch_length,
            _leader_epoch,
            magic,
            _crc,
            attributes,
            last_offset_delta,
            base_timestamp,
            max_timestamp,
            producer_id,
            producer_epoch,
            base_sequence,
            record_count,
        ) = _HEADER.unpack_from(view, pos)
        if magic != 2:
            if magic in (0, 1):
                raise UnsupportedMagic(f"message format v{magic} is not supported")
            raise InvalidRecordBatch(f"unknown magic byte {magic}")
        size = batch_length + LOG_OVERHEAD
        if batch_length < HEADER_SIZE - LOG_OVERHEAD or pos + size > end:
            raise InvalidRecordBatch(f"batch length {batch_length} does not fit the record set")
        if attributes & ATTR_COMPRESSION_MASK > 4:
            raise InvalidRecordBatch(f"unknown compression codec {attributes & 7}")
        header = BatchHeader(
            pos,
            size,
            base_offset,
            attributes,
            last_offset_delta,
            base_timestamp,
            max_timestamp,
            producer_id,
            producer_epoch,
            base_sequence,
            record_count,
        )
        if verify_crc:
            check_crc(view, header)
        headers.append(header)
        pos += size
    return headers


def check_crc(view: memoryview, header: BatchHeader) -> None:
    """Raise InvalidRecordBatch unless the batch's CRC-32C matches its bytes."""
    start = header.start
    (crc,) = _CRC.unpack_from(view, start + 17)
    if crc32c(view[start + CRC_START : start + header.size]) != crc:
        raise InvalidRecordBatch("CRC-32C mismatch")


def zigzag_varint(value: int) -> bytes:
    """A signed integer as record fields encode it (zigzag, then varint)."""
    raw = (value << 1) ^ (value >> 63)
    out = bytearray()
    while raw >= 0x80:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)
    return bytes(out)


def build_batch(
    records: bytes,
    *,
    record_count: int,
    base_offset: int = 0,
    base_timestamp: int,
    max_timestamp: int,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    attributes: int = 0,
    leader_epoch: int = -1,
    last_offset_delta: int | None = None,
) -> bytes:
    """A v2 batch around already-encoded (and, per ``attributes``, compressed)
    records: the header, and the CRC-32C over attributes..end."""
    if last_offset_delta is None:
        last_offset_delta = record_count - 1
    after_crc = _AFTER_CRC.pack(
        attributes, last_offset_delta, base_timestamp, max_timestamp,
        producer_id, producer_epoch, base_sequence, record_count,
    ) + records
    length = 4 + 1 + 4 + len(after_crc)  # leader epoch, magic, crc, then the rest
    return _BEFORE_CRC.pack(base_offset, length, leader_epoch, 2, crc32c(after_crc)) + after_crc


def stamp(view: memoryview, header: BatchHeader, base_offset: int, leader_epoch: int) -> bytes:
    """Copy one batch out of a request with its offset and leader epoch set.

    One copy, no per-record work: both fields lie before the CRC'd range
    (one C call: the join of four pieces it replaced cost as much as the copy).
    """
    start = header.start
    return _stamp(view[start:] if start else view, header.size, base_offset, leader_epoch)


def set_max_timestamp(batch: bytes, timestamp_ms: int, log_append_time: bool = False) -> bytes:
    """Rewrite a batch's max timestamp (and, for a LogAppendTime topic, its
    timestamp type), with a new CRC: as Kafka does when it appends."""
    buf = bytearray(batch)
    if log_append_time:
        attributes = struct.unpack_from(">h", buf, 21)[0] | ATTR_TIMESTAMP_TYPE
        struct.pack_into(">h", buf, 21, attributes)
    struct.pack_into(">q", buf, 35, timestamp_ms)
    struct.pack_into(">I", buf, 17, crc32c(memoryview(buf)[CRC_START:]))
    return bytes(buf)


def base_offset_of(batch: bytes | memoryview) -> int:
    base: int = _INT64.unpack_from(batch, 0)[0]
    return base


def last_offset_of(batch: bytes | memoryview) -> int:
    base: int = _INT64.unpack_from(batch, 0)[0]
    delta: int = _INT32.unpack_from(batch, 23)[0]
    return base + delta


def transactional_producer(records: bytes | memoryview) -> tuple[int, int] | None:
    """(producer id, epoch) when a record set's first batch is transactional.

    Only a peek, so a Produce knows where the batches go; ``parse_batches``
    validates them all (and that a transaction's record set is only its own).
    """
    if len(records) < HEADER_SIZE:
        return None
    (attributes,) = struct.unpack_from(">h", records, 21)
    if not attributes & ATTR_TRANSACTIONAL:
        return None
    return _INT64.unpack_from(records, 43)[0], struct.unpack_from(">h", records, 51)[0]


def record_count_of(batch: bytes | memoryview) -> int:
    count: int = _INT32.unpack_from(batch, 57)[0]
    return count


def max_timestamp_of(batch: bytes | memoryview) -> int:
    timestamp: int = _INT64.unpack_from(batch, 35)[0]
    return timestamp
