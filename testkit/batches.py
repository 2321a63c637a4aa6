"""Record batches built byte by byte, for tests that need exact bytes."""

from __future__ import annotations

from kafka_gateway.codec import encode_uvarint
from tablets.batch import build_batch


def varint(value: int) -> bytes:
    """A zigzag varint, as record fields use."""
    return encode_uvarint((value << 1) ^ (value >> 63))


def encode_records(values: list[bytes | None], key: bytes | None = None) -> bytes:
    """Uncompressed records with offset deltas 0.. and timestamp delta 0."""
    records = bytearray()
    for delta, value in enumerate(values):
        body = bytearray(b"\x00")  # record attributes
        body += varint(0) + varint(delta)  # timestamp delta, offset delta
        body += varint(-1) if key is None else varint(len(key)) + key
        body += varint(-1) if value is None else varint(len(value)) + value
        body += varint(0)  # no headers
        records += varint(len(body)) + body
    return bytes(records)


def make_batch(
    values: list[bytes | None],
    key: bytes | None = None,
    base_timestamp: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    attributes: int = 0,
) -> bytes:
    """An uncompressed v2 record batch with a correct CRC-32C."""
    return build_batch(
        encode_records(values, key),
        record_count=len(values),
        base_timestamp=base_timestamp,
        max_timestamp=base_timestamp,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        attributes=attributes,
    )
