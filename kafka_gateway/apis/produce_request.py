"""The Produce request, decoded by hand: record sets stay views of the frame.

Measured: kio's reader copies every record set into a new bytes object and
builds a dataclass per partition; on the produce path that copy was the one
the gateway could avoid (the batch is copied once anyway, when its offset is
stamped). This reads v0-9 (Kafka 3.4's range: v0-2 have no transactional id,
v9 is flexible) into plain tuples with the attribute names kio uses, so the
handler reads either alike. A test checks it against kio on the same bytes.

It reads with reader.py's ``Reader``: every read is bounded by the frame,
and no list is sized from a declared count (items are appended as they are
read), so this reader needs none of the checks body_bounds.py runs before
kio. A count larger than the bytes left, or a null topic or partition array
(their schemas have none), fails the parse as in Kafka.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from ..reader import MalformedRequest, Reader, read_uvarint, skip_tagged_fields


class PartitionProduceData(NamedTuple):
    index: int  # type: ignore[assignment]  # kio's name; shadows tuple.index
    records: memoryview | None


class TopicProduceData(NamedTuple):
    name: str
    partition_data: list[PartitionProduceData]


class ProduceRequest(NamedTuple):
    transactional_id: str | None
    acks: int
    timeout_ms: int
    topic_data: list[TopicProduceData]


_INDEX_SIZE = struct.Struct(">ii")
_I32 = struct.Struct(">i")


def _partitions(buf: memoryview, pos: int, count: int,
                out: list[PartitionProduceData]) -> int:
    """The partitions of a topic in a non-flexible version, appended to
    ``out``: ``Reader``'s reads inlined, one ``struct`` call for each (index,
    size) pair, as many small batches make this a per-batch cost. Returns the
    position after them."""
    end = len(buf)
    unpack = _INDEX_SIZE.unpack_from
    append = out.append
    for _ in range(count):
        index, size = unpack(buf, pos)
        pos += 8
        if size < 0:
            append(PartitionProduceData(index, None))
            continue
        if pos + size > end:
            raise MalformedRequest("field runs past the end of the frame")
        append(PartitionProduceData(index, buf[pos : pos + size]))
        pos += size
    return pos


def _flexible_partitions(buf: memoryview, pos: int, count: int,
                         out: list[PartitionProduceData]) -> int:
    """``_partitions`` for v9 (what librdkafka 2.x sends): each partition's index,
    its records' compact length (a varint) and its tagged fields, one-byte varints
    read inline (``read_uvarint`` for the rest, as ``Reader`` does)."""
    end = len(buf)
    unpack = _I32.unpack_from
    append = out.append
    for _ in range(count):
        (index,) = unpack(buf, pos)
        pos += 4
        size = buf[pos]
        if size < 0x80:
            pos += 1
        else:
            size, pos = read_uvarint(buf, pos)
        size -= 1
        if size < 0:
            append(PartitionProduceData(index, None))
        else:
            if pos + size > end:
                raise MalformedRequest("field runs past the end of the frame")
            append(PartitionProduceData(index, buf[pos : pos + size]))
            pos += size
        if buf[pos] == 0:  # no tagged fields: nearly always
            pos += 1
        else:
            pos = skip_tagged_fields(buf, pos)
    return pos


def decode(frame: memoryview | bytes, pos: int, version: int,
           max_items: int = -1) -> ProduceRequest:
    """The body of a Produce request at ``version`` (0-9), starting at ``pos``,
    with at most ``max_items`` topics and partitions in all (-1: any number;
    ``gateway.request.max.array.items``, as body_bounds.py checks for the others)."""
    reader = Reader(frame, pos, flexible=version >= 9)
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
            partitions: list[PartitionProduceData] = []
            count = counted(reader.count("TopicProduceData.partition_data"))
            if version >= 9:
                reader.pos = _flexible_partitions(reader.buf, reader.pos, count, partitions)
            else:
                reader.pos = _partitions(reader.buf, reader.pos, count, partitions)
            topics.append(TopicProduceData(name, partitions))
            reader.skip_tagged_fields()
        reader.skip_tagged_fields()
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise MalformedRequest(f"cannot decode ProduceRequest v{version}: {exc}") from exc
    return ProduceRequest(transactional_id, acks, timeout_ms, topics)
