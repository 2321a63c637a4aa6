"""Record-level reading of one batch, for the few features that truly need it.

Produce and fetch never come here. ListOffsets by timestamp does: Kafka answers
with the first *record* whose timestamp is at or after the target, and the
batch header only bounds the answer to one batch. This module decompresses
that one batch and walks its records' varint headers.
"""

from __future__ import annotations

import gzip
import struct
from collections.abc import Iterator

import cramjam

from .batch import ATTR_COMPRESSION_MASK, ATTR_TIMESTAMP_TYPE, HEADER_SIZE

_XERIAL_MAGIC = b"\x82SNAPPY\x00"


def _decompress(codec: int, data: bytes) -> bytes:
    if codec == 0:
        return data
    if codec == 1:
        return gzip.decompress(data)
    if codec == 2:
        return _snappy(data)
    if codec == 3:
        return bytes(cramjam.lz4.decompress(data))
    if codec == 4:
        return bytes(cramjam.zstd.decompress(data))
    raise ValueError(f"unknown compression codec {codec}")


def _snappy(data: bytes) -> bytes:
    # The Java client and librdkafka frame snappy the xerial way; others send raw.
    if not data.startswith(_XERIAL_MAGIC):
        return bytes(cramjam.snappy.decompress_raw(data))
    out = []
    pos = 16
    while pos < len(data):
        (length,) = struct.unpack_from(">i", data, pos)
        out.append(bytes(cramjam.snappy.decompress_raw(data[pos + 4 : pos + 4 + length])))
        pos += 4 + length
    return b"".join(out)


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = 0
    raw = 0
    while True:
        byte = buf[pos]
        pos += 1
        raw |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7


def record_timestamps(batch: bytes) -> Iterator[tuple[int, int]]:
    """Yield (offset, timestamp) for each record of a stored batch."""
    base_offset, attributes, base_timestamp, max_timestamp, count = (
        struct.unpack_from(">q", batch, 0)[0],
        struct.unpack_from(">h", batch, 21)[0],
        struct.unpack_from(">q", batch, 27)[0],
        struct.unpack_from(">q", batch, 35)[0],
        struct.unpack_from(">i", batch, 57)[0],
    )
    if attributes & ATTR_TIMESTAMP_TYPE:
        # LogAppendTime: every record carries the batch's max timestamp.
        for i in range(count):
            yield base_offset + i, max_timestamp
        return
    body = _decompress(attributes & ATTR_COMPRESSION_MASK, bytes(batch[HEADER_SIZE:]))
    pos = 0
    for _ in range(count):
        length, pos = _varint(body, pos)
        record_end = pos + length
        pos += 1  # attributes
        timestamp_delta, pos = _varint(body, pos)
        offset_delta, pos = _varint(body, pos)
        yield base_offset + offset_delta, base_timestamp + timestamp_delta
        pos = record_end
