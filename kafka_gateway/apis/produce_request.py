"""The Produce request, decoded by hand: record sets stay views of the frame.

Measured: kio's reader copies every record set into a new bytes object and
builds a dataclass per partition; on the produce path that copy was the one
the gateway could avoid (the batch is copied once anyway, when its offset is
stamped). This reads v0-9 (Kafka 3.4's range: v0-2 have no transactional id,
v9 is flexible) into plain tuples with the attribute names kio uses, so the
handler reads either alike. A test checks it against kio on the same bytes.

Every read is bounded by the frame, and no list is sized from a declared
count (items are appended as they are read), so this reader needs none of
the checks bounds.py runs before kio. A count larger than the bytes left, or
a null topic or partition array (their schemas have none), fails the parse
as in Kafka.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from ..codec import MalformedRequest, read_uvarint

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


class PartitionProduceData(NamedTuple):
    index: int
    records: memoryview | None


class TopicProduceData(NamedTuple):
    name: str
    partition_data: list[PartitionProduceData]


class ProduceRequest(NamedTuple):
    transactional_id: str | None
    acks: int
    timeout_ms: int
    topic_data: list[TopicProduceData]


class _Reader:
    __slots__ = ("buf", "flexible", "pos")

    def __init__(self, buf: memoryview, pos: int, flexible: bool) -> None:
        self.buf = buf
        self.pos = pos
        self.flexible = flexible

    def int16(self) -> int:
        (value,) = _I16.unpack_from(self.buf, self.pos)
        self.pos += 2
        return value

    def int32(self) -> int:
        (value,) = _I32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return value

    def uvarint(self) -> int:
        value, self.pos = read_uvarint(self.buf, self.pos)
        return value

    def length(self) -> int:
        """An array, string or bytes length; -1 for null."""
        return self.uvarint() - 1 if self.flexible else self.int32()

    def count(self, what: str) -> int:
        """An array count that is neither null nor more than the bytes left."""
        count = self.length()
        if count < 0:
            raise MalformedRequest(f"{what}: array count {count} where the schema has no null")
        if count > len(self.buf) - self.pos:
            raise MalformedRequest(f"{what}: array count of {count} does not fit in the "
                                   f"{len(self.buf) - self.pos} bytes left")
        return count

    def string_length(self) -> int:
        return self.uvarint() - 1 if self.flexible else self.int16()

    def take(self, size: int) -> memoryview:
        end = self.pos + size
        if size < 0 or end > len(self.buf):
            raise MalformedRequest("field runs past the end of the frame")
        view = self.buf[self.pos : end]
        self.pos = end
        return view

    def string(self) -> str | None:
        size = self.string_length()
        return None if size < 0 else bytes(self.take(size)).decode()

    def skip_tagged_fields(self) -> None:
        if self.flexible:
            for _ in range(self.uvarint()):
                self.uvarint()
                self.take(self.uvarint())


def decode(frame: memoryview | bytes, pos: int, version: int,
           max_items: int = -1) -> ProduceRequest:
    """The body of a Produce request at ``version`` (0-9), starting at ``pos``,
    with at most ``max_items`` topics and partitions in all (-1: any number;
    ``gateway.request.max.array.items``, as bounds.py checks for the others)."""
    reader = _Reader(memoryview(frame), pos, flexible=version >= 9)
    items_left = max_items

    def counted(count: int) -> int:
        nonlocal items_left
        if max_items >= 0:
            items_left -= count
            if items_left < 0:
                raise MalformedRequest(f"ProduceRequest has more than {max_items} array items "
                                       "(gateway.request.max.array.items)")
        return count

    try:
        transactional_id = reader.string() if version >= 3 else None
        acks = reader.int16()
        timeout_ms = reader.int32()
        topics = []
        for _ in range(counted(reader.count("ProduceRequest.topic_data"))):
            name = reader.string()
            if name is None:
                raise MalformedRequest("null topic name")
            partitions = []
            for _ in range(counted(reader.count("TopicProduceData.partition_data"))):
                index = reader.int32()
                size = reader.length()
                partitions.append(
                    PartitionProduceData(index, None if size < 0 else reader.take(size))
                )
                reader.skip_tagged_fields()
            topics.append(TopicProduceData(name, partitions))
            reader.skip_tagged_fields()
        reader.skip_tagged_fields()
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise MalformedRequest(f"cannot decode ProduceRequest v{version}: {exc}") from exc
    return ProduceRequest(transactional_id, acks, timeout_ms, topics)
