"""Record batches built byte by byte, for tests that need exact bytes, and read back.

- ``make_batch``: good batches in every codec, and the malformed ones a buggy
  or hostile producer can send (``MALFORMED``), each with a correct CRC so
  that only the record-level checks can catch it;
- ``encode_batch``/``decode_batches``: batches of ``Record``s (keys, headers,
  timestamps), and what a Fetch returns decoded into plain fields, for the
  differential tests: the same bytes go to Apache Kafka and to the gateway,
  and what comes back is compared one by one. Compression is framed as the
  Java client frames it (xerial snappy, LZ4 frames), so Kafka accepts every
  batch as it would one of its own clients'.

    batch = encode_batch([Record(b"v0"), Record(b"v1", timestamp_delta=5)],
                         base_timestamp=now, codec=GZIP)
    decode_batches(fetched_bytes)   # -> [{"base_offset": .., "records": [{..}, ..]}, ..]
"""

from __future__ import annotations

import gzip
import random
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cramjam
import lz4.frame
import zstandard

from kafka_gateway.codec import encode_uvarint
from tablets.batch import (
    ATTR_COMPRESSION_MASK,
    ATTR_CONTROL,
    ATTR_TIMESTAMP_TYPE,
    HEADER_SIZE,
    build_batch,
)

NONE, GZIP, SNAPPY, LZ4, ZSTD = range(5)
CODECS = {"gzip": GZIP, "snappy": SNAPPY, "lz4": LZ4, "zstd": ZSTD}
_XERIAL_MAGIC = b"\x82SNAPPY\x00"


def varint(value: int) -> bytes:
    """A zigzag varint, as record fields use."""
    return encode_uvarint((value << 1) ^ (value >> 63))


def encode_record(
    value: bytes | None,
    offset_delta: int,
    key: bytes | None = None,
    timestamp_delta: int = 0,
    headers: tuple[tuple[bytes, bytes | None], ...] = (),
) -> bytes:
    """One record: its length, then attributes, deltas, key, value, headers."""
    body = bytearray(b"\x00")  # record attributes
    body += varint(timestamp_delta) + varint(offset_delta)
    body += varint(-1) if key is None else varint(len(key)) + key
    body += varint(-1) if value is None else varint(len(value)) + value
    body += varint(len(headers))
    for name, header_value in headers:
        body += varint(len(name)) + name
        body += varint(-1) if header_value is None else varint(len(header_value)) + header_value
    return varint(len(body)) + bytes(body)


def encode_records(
    values: list[bytes | None], key: bytes | None = None, timestamp_deltas: list[int] | None = None
) -> bytes:
    """Records with offset deltas 0.. and (unless given) timestamp delta 0."""
    deltas = timestamp_deltas or [0] * len(values)
    return b"".join(encode_record(value, i, key, deltas[i]) for i, value in enumerate(values))


def compress(codec: int, data: bytes, xerial: bool = True) -> bytes:
    """``data`` compressed as the clients do: gzip, snappy (xerial framing, as
    the Java client, or one raw block, as librdkafka), lz4 frame, zstd."""
    if codec == GZIP:
        return gzip.compress(data)
    if codec == SNAPPY:
        if not xerial:
            return bytes(cramjam.snappy.compress_raw(data))
        out = bytearray(_XERIAL_MAGIC + struct.pack(">ii", 1, 1))
        for pos in range(0, len(data), 32 << 10):
            block = bytes(cramjam.snappy.compress_raw(data[pos : pos + (32 << 10)]))
            out += struct.pack(">i", len(block)) + block
        return bytes(out)
    if codec == LZ4:
        return lz4.frame.compress(data, block_linked=False)  # as Kafka reads them
    if codec == ZSTD:
        return zstandard.ZstdCompressor().compress(data)
    assert codec == NONE
    return data


def make_batch(
    values: list[bytes | None],
    key: bytes | None = None,
    base_timestamp: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    attributes: int = 0,
    codec: int = NONE,
    records: bytes | None = None,
    record_count: int | None = None,
    last_offset_delta: int | None = None,
    timestamp_deltas: list[int] | None = None,
    max_timestamp: int | None = None,
    base_offset: int = 0,
) -> bytes:
    """A v2 record batch with a correct CRC-32C.

    ``records`` replaces the encoded (uncompressed) records; ``record_count``
    and ``last_offset_delta`` override what the header declares.
    """
    if records is None:
        records = encode_records(values, key, timestamp_deltas)
    count = len(values) if record_count is None else record_count
    if max_timestamp is None:
        max_timestamp = base_timestamp + max(timestamp_deltas or [0])
    return build_batch(
        compress(codec, records),
        record_count=count,
        base_offset=base_offset,
        base_timestamp=base_timestamp,
        max_timestamp=max_timestamp,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        attributes=attributes | codec,
        last_offset_delta=last_offset_delta,
    )


def with_payload(codec: int, payload: bytes, record_count: int = 1, timestamp: int = 0) -> bytes:
    """A batch whose (compressed) records are exactly ``payload``."""
    return build_batch(payload, record_count=record_count, base_timestamp=timestamp,
                       max_timestamp=timestamp, attributes=codec)


@dataclass(frozen=True, slots=True)
class Record:
    value: bytes | None
    key: bytes | None = None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    timestamp_delta: int = 0


def decompress(codec: int, data: bytes) -> bytes:
    if codec == NONE:
        return data
    if codec == GZIP:
        return gzip.decompress(data)
    if codec == SNAPPY:
        if not data.startswith(_XERIAL_MAGIC):
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
    data = b"".join(
        encode_record(record.value, delta, record.key, record.timestamp_delta,
                      tuple((name.encode(), value) for name, value in record.headers))
        for delta, record in enumerate(records))
    return build_batch(
        compress(codec, data),
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


def zstd_zeros(size: int, prefix: bytes = b"", suffix: bytes = b"") -> bytes:
    """A zstd frame of ``prefix``, ``size`` zero bytes and ``suffix``, made of
    RLE blocks (4 bytes per 128 KiB): 4 GiB of zeros take 131 KB."""
    block = 128 << 10
    out = bytearray(struct.pack("<I", 0xFD2FB528) + b"\x00\x38")  # no size, 128 KiB window
    if prefix:
        out += (len(prefix) << 3).to_bytes(3, "little") + prefix  # a raw block
    while size > 0:
        n = min(block, size)
        size -= n
        out += ((n << 3) | 2).to_bytes(3, "little") + b"\x00"  # an RLE block of zeros
    out += ((len(suffix) << 3) | 1).to_bytes(3, "little") + suffix  # last block, raw
    return bytes(out)


def huge_value_batch(value_size: int, timestamp: int = 0) -> bytes:
    """A valid zstd batch of one record whose value is ``value_size`` zeros."""
    head = b"\x00" + varint(0) + varint(0) + varint(-1) + varint(value_size)
    length = len(head) + value_size + 1  # ... value, then a header count of 0
    return with_payload(ZSTD, zstd_zeros(value_size, varint(length) + head, varint(0)),
                        timestamp=timestamp)


def gzip_zeros(size: int) -> bytes:
    """gzip of ``size`` zero bytes (about 1000:1)."""
    deflater = zlib.compressobj(9, wbits=31)
    chunk = bytes(1 << 20)
    parts = [deflater.compress(chunk) for _ in range(size >> 20)]
    parts.append(deflater.compress(bytes(size & ((1 << 20) - 1))))
    parts.append(deflater.flush())
    return b"".join(parts)


def noise(size: int, seed: str) -> bytes:
    """Random-looking bytes, the same every run."""
    return random.Random(seed).randbytes(size)


def _garbage(codec: int) -> Callable[[int], bytes]:
    def build(now: int) -> bytes:
        payload = noise(200, f"garbage {codec}")
        if codec == SNAPPY:
            payload = b"\x82SNAPPY\x00" + struct.pack(">iii", 1, 1, 180) + payload[:180]
        return with_payload(codec, payload, timestamp=now)
    return build


def _truncated(codec: int) -> Callable[[int], bytes]:
    def build(now: int) -> bytes:
        records = encode_records([noise(100, f"truncated {i}") for i in range(20)])
        return with_payload(codec, compress(codec, records)[:-8], 20, now)
    return build


def _two(now: int) -> bytes:
    return make_batch([b"a"], base_timestamp=now) + make_batch([b"b"], base_timestamp=now)


# name -> builder(now_ms); expected answers are the tests' business.
MALFORMED: dict[str, Callable[[int], bytes]] = {
    **{f"garbage {name}": _garbage(codec) for name, codec in CODECS.items()},
    **{f"truncated {name}": _truncated(codec) for name, codec in CODECS.items()},
    "lz4 with linked blocks": lambda now: with_payload(  # over one 64 KiB block: linked
        LZ4, lz4.frame.compress(encode_records([b"x" * 1000] * 100), block_linked=True),
        100, now),
    "count 2^31-1, one record": lambda now: make_batch(
        [b"x"], base_timestamp=now, record_count=2**31 - 1),
    "count 1, five records": lambda now: make_batch(
        [b"a", b"b", b"c", b"d", b"e"], base_timestamp=now, record_count=1),
    "count 1, five zstd records": lambda now: make_batch(
        [b"a", b"b", b"c", b"d", b"e"], base_timestamp=now, record_count=1, codec=ZSTD),
    "count 0": lambda now: make_batch([b"x"], base_timestamp=now, record_count=0),
    "count above last offset delta": lambda now: make_batch(
        [b"x", b"y"], base_timestamp=now, last_offset_delta=0),
    "negative offset delta": lambda now: make_batch(
        [], base_timestamp=now, record_count=1, records=encode_record(b"x", -1)),
    "offset deltas 0, 2": lambda now: make_batch(
        [], base_timestamp=now, record_count=2,
        records=encode_record(b"x", 0) + encode_record(b"y", 2)),
    "offset deltas 0, 2 zstd": lambda now: make_batch(
        [], base_timestamp=now, record_count=2, codec=ZSTD,
        records=encode_record(b"x", 0) + encode_record(b"y", 2)),
    "garbage records": lambda now: make_batch(
        [], base_timestamp=now, record_count=3, records=noise(64, "records")),
    "record longer than its fields": lambda now: make_batch(
        [], base_timestamp=now, record_count=1,
        records=varint(8) + encode_record(b"x", 0)[1:] + b"\x00"),
    "record shorter than its fields": lambda now: make_batch(
        [], base_timestamp=now, record_count=1, records=varint(5) + encode_record(b"x", 0)[1:]),
    "value past the record": lambda now: make_batch(
        [], base_timestamp=now, record_count=1,
        records=varint(7) + b"\x00" + varint(0) + varint(0) + varint(-1) + varint(50) + b"ab"),
    "key length -2": lambda now: make_batch(
        [], base_timestamp=now, record_count=1,
        records=varint(6) + b"\x00" + varint(0) + varint(0) + varint(-2) + varint(-1)
        + varint(0)),
    "negative header count": lambda now: make_batch(
        [], base_timestamp=now, record_count=1,
        records=varint(6) + b"\x00" + varint(0) + varint(0) + varint(-1) + varint(-1)
        + varint(-3)),
    "varint of 6 bytes": lambda now: make_batch(
        [], base_timestamp=now, record_count=1, records=b"\x8c\x80\x80\x80\x80\x00" + bytes(6)),
    "bytes after the last record": lambda now: make_batch(
        [b"x"], base_timestamp=now, records=encode_records([b"x"]) + b"\x00\x00"),
    "zstd bomb, 4 GiB of zeros": lambda now: with_payload(ZSTD, zstd_zeros(4 << 30),
                                                           timestamp=now),
    "two batches": _two,
    "base offset 5": lambda now: make_batch([b"x"], base_timestamp=now, base_offset=5),
    "control batch": lambda now: make_batch([b"x"], base_timestamp=now, attributes=ATTR_CONTROL),
    "producer id without sequence": lambda now: make_batch(
        [b"x"], base_timestamp=now, producer_id=7, producer_epoch=0, base_sequence=-1),
    "producer sets LogAppendTime": lambda now: make_batch(
        [b"x"], base_timestamp=now, attributes=ATTR_TIMESTAMP_TYPE),
    "timestamp an hour old": lambda now: make_batch(
        [b"x", b"y"], base_timestamp=now, timestamp_deltas=[0, -3_600_000]),
}
