"""Reading the "consumer" protocol's opaque bytes (ConsumerProtocolSubscription
and ConsumerProtocolAssignment, every version).

The coordinator treats member metadata and assignments as bytes, like Kafka;
it looks inside only to know which topics a group subscribes to (OffsetDelete,
offset expiry) and which partitions each member holds (describe, lag). Every
version starts with the fields read here, so later versions parse too.
"""

from __future__ import annotations

import struct

PROTOCOL_TYPE = "consumer"

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def _take(self, size: int) -> bytes:
        if size < 0 or self.pos + size > len(self.data):
            raise ValueError("truncated consumer protocol data")
        chunk = self.data[self.pos : self.pos + size]
        self.pos += size
        return chunk

    def i16(self) -> int:
        return _I16.unpack(self._take(2))[0]

    def i32(self) -> int:
        return _I32.unpack(self._take(4))[0]

    def string(self) -> str:
        return self._take(self.i16()).decode()

    def count(self) -> int:
        return max(self.i32(), 0)  # -1 (null array) reads as empty


def subscribed_topics(metadata: bytes) -> set[str] | None:
    """Topics of a ConsumerProtocolSubscription; None when it cannot be read."""
    try:
        reader = _Reader(metadata)
        reader.i16()  # version
        return {reader.string() for _ in range(reader.count())}
    except (ValueError, UnicodeDecodeError):
        return None


def assigned_partitions(assignment: bytes) -> dict[str, list[int]] | None:
    """Partitions of a ConsumerProtocolAssignment; None when it cannot be read
    (an empty assignment, as after a failed rebalance, reads as no partitions)."""
    if not assignment:
        return {}
    try:
        reader = _Reader(assignment)
        reader.i16()  # version
        out: dict[str, list[int]] = {}
        for _ in range(reader.count()):
            topic = reader.string()
            out.setdefault(topic, []).extend(reader.i32() for _ in range(reader.count()))
        return out
    except (ValueError, UnicodeDecodeError):
        return None


def encode_subscription(topics: list[str], version: int = 0) -> bytes:
    """A v0 subscription (no user data): for tests and tools."""
    out = [_I16.pack(version), _I32.pack(len(topics))]
    for topic in topics:
        out += [_I16.pack(len(topic.encode())), topic.encode()]
    out.append(_I32.pack(-1))
    return b"".join(out)


def encode_assignment(partitions: dict[str, list[int]]) -> bytes:
    """A v0 assignment (no user data): for tests and tools."""
    out = [_I16.pack(0), _I32.pack(len(partitions))]
    for topic, indexes in partitions.items():
        out += [_I16.pack(len(topic.encode())), topic.encode(), _I32.pack(len(indexes))]
        out += [_I32.pack(i) for i in indexes]
    out.append(_I32.pack(-1))
    return b"".join(out)
