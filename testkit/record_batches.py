"""Record batches with real records: built (any codec, any timestamps) and read back.

    batch = encode_batch([Record(b"v0"), Record(b"v1", timestamp_delta=5)],
                         base_timestamp=now, codec=GZIP)
    decode_batches(fetched_bytes)   # -> [{"base_offset": .., "records": [{..}, ..]}, ..]

For the differential tests: the same bytes go to Apache Kafka and to the
gateway, and what comes back is decoded into plain fields so the two can be
compared one by one. Compression is framed as the Java client frames it
(xerial snappy, LZ4 frames), so Kafka accepts every batch as it would one of
its own clients'.
"""

from __future__ import annotations

import gzip
import struct
from dataclasses import dataclass
from typing import Any

import cramjam
import lz4.frame

from tablets.batch import ATTR_COMPRESSION_MASK, HEADER_SIZE, build_batch

from .batches import varint

NONE, GZIP, SNAPPY, LZ4, ZSTD = range(5)
CODECS = {"none": NONE, "gzip": GZIP, "snappy": SNAPPY, "lz4": LZ4, "zstd": ZSTD}

_XERIAL_HEADER = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK = 32 * 1024


@dataclass(frozen=True, slots=True)
class Record:
    value: bytes | None
    key: bytes | None = None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    timestamp_delta: int = 0


def _field(data: bytes | None) -> bytes:
    return varint(-1) if data is None else varint(len(data)) + data


def encode_records(records: list[Record]) -> bytes:
    out = bytearray()
    for delta, record in enumerate(records):
        body = bytearray(b"\x00")  # record attributes
        body += varint(record.timestamp_delta) + varint(delta)
        body += _field(record.key) + _field(record.value)
        body += varint(len(record.headers))
        for name, value in record.headers:
            body += _field(name.encode()) + _field(value)
        out += varint(len(body)) + body
    return bytes(out)


def compress(codec: int, data: bytes) -> bytes:
    if codec == NONE:
        return data
    if codec == GZIP:
        return gzip.compress(data)
    if codec == SNAPPY:
        blocks = (data[i:i + _XERIAL_BLOCK] for i in range(0, len(data), _XERIAL_BLOCK))
        out = bytearray(_XERIAL_HEADER)
        for block in blocks:
            packed = bytes(cramjam.snappy.compress_raw(block))
            out += struct.pack(">i", len(packed)) + packed
        return bytes(out)
    if codec == LZ4:
        return lz4.frame.compress(data, block_linked=False, store_size=False)
    if codec == ZSTD:
        return bytes(cramjam.zstd.compress(data))
    raise ValueError(f"unknown codec {codec}")


def decompress(codec: int, data: bytes) -> bytes:
    if codec == NONE:
        return data
    if codec == GZIP:
        return gzip.decompress(data)
    if codec == SNAPPY:
        if not data.startswith(_XERIAL_HEADER[:8]):
            return bytes(cramjam.snappy.decompress_raw(data))
        out, pos = bytearray(), 16
        while pos < len(data):
            (size,) = struct.unpack_from(">i", data, pos)
            out += bytes(cramjam.snappy.decompress_raw(data[pos + 4:pos + 4 + size]))
            pos += 4 + size
        return bytes(out)
    if codec == LZ4:
        return lz4.frame.decompress(data)
    if codec == ZSTD:
        return bytes(cramjam.zstd.decompress(data))
    raise ValueError(f"unknown codec {codec}")


def encode_batch(records: list[Record], base_timestamp: int, codec: int = NONE,
                 attributes: int = 0) -> bytes:
    """One v2 batch with a correct CRC; the max timestamp is the records' largest."""
    max_timestamp = base_timestamp + max(r.timestamp_delta for r in records)
    return build_batch(
        compress(codec, encode_records(records)),
        record_count=len(records),
        base_timestamp=base_timestamp,
        max_timestamp=max_timestamp,
        attributes=attributes | codec,
    )


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def varint(self) -> int:
        shift = raw = 0
        while True:
            byte = self.data[self.pos]
            self.pos += 1
            raw |= (byte & 0x7F) << shift
            if byte < 0x80:
                return (raw >> 1) ^ -(raw & 1)
            shift += 7

    def field(self) -> bytes | None:
        size = self.varint()
        if size < 0:
            return None
        value = self.data[self.pos:self.pos + size]
        self.pos += size
        return value


_HEADER = struct.Struct(">qiibIhiqqqhii")
_HEADER_NAMES = ("base_offset", "batch_length", "partition_leader_epoch", "magic", "crc",
                 "attributes", "last_offset_delta", "base_timestamp", "max_timestamp",
                 "producer_id", "producer_epoch", "base_sequence", "record_count")


def decode_batches(data: bytes) -> list[dict[str, Any]]:
    """Every whole batch in a Fetch response's records, header fields and records.

    A partial batch at the end (the partition byte limit cut it) is reported
    as ``{"partial_bytes": n}``, since both brokers may return one.
    """
    out: list[dict[str, Any]] = []
    pos = 0
    while pos < len(data):
        if len(data) - pos < HEADER_SIZE:
            out.append({"partial_bytes": len(data) - pos})
            break
        header = dict(zip(_HEADER_NAMES, _HEADER.unpack_from(data, pos), strict=True))
        end = pos + 12 + header["batch_length"]
        if end > len(data):
            out.append({"partial_bytes": len(data) - pos})
            break
        codec = header["attributes"] & ATTR_COMPRESSION_MASK
        reader = _Reader(decompress(codec, data[pos + HEADER_SIZE:end]))
        records = []
        for _ in range(header["record_count"]):
            reader.varint()  # record length
            record: dict[str, Any] = {"attributes": reader.data[reader.pos]}
            reader.pos += 1
            record["timestamp_delta"] = reader.varint()
            record["offset_delta"] = reader.varint()
            record["key"] = reader.field()
            record["value"] = reader.field()
            record["headers"] = [
                (reader.field(), reader.field()) for _ in range(reader.varint())
            ]
            records.append(record)
        header["records"] = records
        out.append(header)
        pos = end
    return out
