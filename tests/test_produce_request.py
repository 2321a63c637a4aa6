"""The hand-written Produce request reader agrees with kio on the same bytes."""

from __future__ import annotations

import datetime

import pytest
from kio.index import load_payload_module
from kio.static.constants import EntityType
from kio.static.primitive import Records, i32Timedelta

from kafka_gateway.apis import produce_request
from kafka_gateway.codec import ChunkWriter, MalformedRequest, entity_writer_for
from testkit.batches import make_batch


def kio_bytes(version: int, transactional_id: str | None, batches: list[bytes | None]) -> bytes:
    schema = load_payload_module(0, version, EntityType.request)
    body = schema.ProduceRequest(
        transactional_id=transactional_id, acks=-1,
        timeout=i32Timedelta.parse(datetime.timedelta(milliseconds=1500)),
        topic_data=(
            schema.TopicProduceData(name="orders", partition_data=tuple(
                schema.PartitionProduceData(index=i, records=None if b is None else Records(b))
                for i, b in enumerate(batches))),
            schema.TopicProduceData(name="audit", partition_data=()),
        ),
    )
    out = ChunkWriter()
    entity_writer_for(type(body))(out, body)
    return b"".join(out.chunks)


@pytest.mark.parametrize("version", range(3, 10))
def test_reads_what_kio_writes(version):
    batches = [make_batch([b"a", b"b"]), None, make_batch([b"c"])]
    frame = b"HEAD" + kio_bytes(version, "tx-1", batches)
    request = produce_request.decode(memoryview(frame), 4, version)
    assert (request.transactional_id, request.acks, request.timeout_ms) == ("tx-1", -1, 1500)
    [orders, audit] = request.topic_data
    assert orders.name == "orders" and audit == ("audit", [])
    assert [p.index for p in orders.partition_data] == [0, 1, 2]
    got = [None if p.records is None else bytes(p.records) for p in orders.partition_data]
    assert got == batches


def test_versions_before_3_have_no_transactional_id():
    v3 = kio_bytes(3, None, [make_batch([b"x"])])
    v2 = v3[2:]  # v3 less its null transactional id
    request = produce_request.decode(v2, 0, 2)
    assert request.transactional_id is None
    assert bytes(request.topic_data[0].partition_data[0].records) == make_batch([b"x"])


@pytest.mark.parametrize("cut", [1, 5, 12, 30])
def test_truncated_requests_are_malformed(cut):
    frame = kio_bytes(9, None, [make_batch([b"x" * 50])])
    with pytest.raises(MalformedRequest):
        produce_request.decode(frame[:-cut], 0, 9)


def test_array_items_are_capped_as_for_the_other_apis():
    """gateway.request.max.array.items counts topics and partitions: here 2 + 5."""
    frame = kio_bytes(9, None, [None] * 5)
    assert len(produce_request.decode(frame, 0, 9, max_items=7).topic_data) == 2
    with pytest.raises(MalformedRequest, match=r"gateway\.request\.max\.array\.items"):
        produce_request.decode(frame, 0, 9, max_items=6)


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def test_v9_partitions_with_long_lengths_and_tagged_fields():
    """v9's partitions are read inline (one-byte varints): a length of two varint
    bytes, a partition's tagged fields and a null record set are read as Reader would."""
    batch = make_batch([b"v" * 300])  # its compact length takes two varint bytes
    body = (b"\x00" + (-1).to_bytes(2, "big", signed=True) + (1500).to_bytes(4, "big")
            + _uvarint(2) + _uvarint(2) + b"t" + _uvarint(3)
            + (0).to_bytes(4, "big") + _uvarint(len(batch) + 1) + batch
            + b"\x01" + b"\x00" + b"\x02" + b"xy"  # one tagged field (tag 0, 2 bytes)
            + (1).to_bytes(4, "big") + b"\x00" + b"\x00"  # null records, no tagged fields
            + b"\x00" + b"\x00")
    request = produce_request.decode(memoryview(body), 0, 9)
    [topic] = request.topic_data
    assert topic.name == "t"
    assert [(p.index, None if p.records is None else bytes(p.records))
            for p in topic.partition_data] == [(0, batch), (1, None)]
    for cut in range(1, len(body) - 1, 7):
        with pytest.raises(MalformedRequest):
            produce_request.decode(memoryview(body[:cut]), 0, 9)
