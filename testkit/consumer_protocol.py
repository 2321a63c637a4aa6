"""The "consumer" protocol's opaque bytes, written: what a Java consumer puts in
JoinGroup's metadata and SyncGroup's assignments (v0, no user data). The
gateway only reads them (kafka_gateway/groups/consumer_protocol.py)."""

from __future__ import annotations

import struct

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


def encode_subscription(topics: list[str], version: int = 0) -> bytes:
    """A v0 subscription (no user data)."""
    out = [_I16.pack(version), _I32.pack(len(topics))]
    for topic in topics:
        out += [_I16.pack(len(topic.encode())), topic.encode()]
    out.append(_I32.pack(-1))
    return b"".join(out)


def encode_assignment(partitions: dict[str, list[int]]) -> bytes:
    """A v0 assignment (no user data)."""
    out = [_I16.pack(0), _I32.pack(len(partitions))]
    for topic, indexes in partitions.items():
        out += [_I16.pack(len(topic.encode())), topic.encode(), _I32.pack(len(indexes))]
        out += [_I32.pack(i) for i in indexes]
    out.append(_I32.pack(-1))
    return b"".join(out)
