"""Reading the "consumer" protocol's opaque bytes (ConsumerProtocolSubscription
and ConsumerProtocolAssignment, every version).

The coordinator treats member metadata and assignments as bytes, like Kafka;
it looks inside only to know which topics a group subscribes to (OffsetDelete,
offset expiry) and which partitions each member holds (describe, lag). Every
version starts with the fields read here, so later versions parse too.
"""

from __future__ import annotations

import struct

from ..reader import Reader

PROTOCOL_TYPE = "consumer"
# What a truncated or garbled one raises (reader.MalformedRequest is a ValueError).
_UNREADABLE = (ValueError, struct.error, UnicodeDecodeError)


def _count(reader: Reader) -> int:
    return max(reader.int32(), 0)  # -1 (null array) reads as empty


def _string(reader: Reader) -> str:
    value = reader.string()
    if value is None:
        raise ValueError("null string in consumer protocol data")
    return value


def subscribed_topics(metadata: bytes) -> set[str] | None:
    """Topics of a ConsumerProtocolSubscription; None when it cannot be read."""
    try:
        reader = Reader(metadata, 0, flexible=False)
        reader.int16()  # version
        return {_string(reader) for _ in range(_count(reader))}
    except _UNREADABLE:
        return None


def assigned_partitions(assignment: bytes) -> dict[str, list[int]] | None:
    """Partitions of a ConsumerProtocolAssignment; None when it cannot be read
    (an empty assignment, as after a failed rebalance, reads as no partitions)."""
    if not assignment:
        return {}
    try:
        reader = Reader(assignment, 0, flexible=False)
        reader.int16()  # version
        out: dict[str, list[int]] = {}
        for _ in range(_count(reader)):
            topic = _string(reader)
            out.setdefault(topic, []).extend(reader.int32() for _ in range(_count(reader)))
        return out
    except _UNREADABLE:
        return None
