"""The hand-written Produce response encoder writes exactly what kio would
(v3-9; v0-2, which kio has no schemas for, are checked on the wire by
test_produce_v0_2.py)."""

from __future__ import annotations

import datetime

import pytest
from kio.schema.errors import ErrorCode

from kafka_gateway.apis import produce_response
from kafka_gateway.apis.produce_response import PartitionAnswer
from kafka_gateway.codec import NO_THROTTLE, ChunkWriter, build, entity_writer_for, response_schema


def kio_encoding(version: int, topics: dict[str, list[PartitionAnswer]]) -> bytes:
    schema = response_schema(0, version)
    entry = getattr(schema, "BatchIndexAndErrorMessage", None)
    body = build(
        schema.ProduceResponse, throttle_time=NO_THROTTLE,
        responses=tuple(
            build(schema.TopicProduceResponse, name=name, partition_responses=tuple(
                build(schema.PartitionProduceResponse, index=p.partition,
                      error_code=ErrorCode(p.error_code), base_offset=p.base_offset,
                      log_append_time=None if p.log_append_time < 0 else
                      datetime.datetime.fromtimestamp(p.log_append_time / 1000,
                                                      tz=datetime.UTC),
                      log_start_offset=p.log_start_offset,
                      record_errors=() if entry is None else tuple(
                          build(entry, batch_index=i, batch_index_error_message=m)
                          for i, m in p.record_errors),
                      error_message=p.error_message)
                for p in parts))
            for name, parts in topics.items()),
    )
    out = ChunkWriter()
    entity_writer_for(type(body))(out, body)
    return b"".join(out.chunks)


TOPICS = {
    "orders": [
        PartitionAnswer(0, 0, 41, -1, 0),
        PartitionAnswer(3, 0, 7, 1_700_000_000_123, 5),
        PartitionAnswer(1, ErrorCode.invalid_timestamp.value, -1, -1, -1,
                        ((0, "Timestamp 1 of message with offset 0 is out of range"), (2, None)),
                        "One or more records have been rejected due to invalid timestamp"),
    ],
    "ünïcode-topic": [PartitionAnswer(0, ErrorCode.unknown_topic_or_partition.value, -1, -1, -1,
                                      (), "This server does not host this topic-partition.")],
}


@pytest.mark.parametrize("version", range(3, 10))
def test_same_bytes_as_kio(version):
    encoded = produce_response.encode(version, TOPICS)
    assert encoded.flexible == (version >= 9)
    assert b"".join(encoded.chunks) == kio_encoding(version, TOPICS)


@pytest.mark.parametrize("version", range(3, 10))
def test_an_empty_answer_is_kios_too(version):
    assert b"".join(produce_response.encode(version, {}).chunks) == kio_encoding(version, {})


def test_v0_to_2_layouts():
    """v0: index, code, offset; v1 adds the throttle time at the end; v2 the
    log append time (Kafka's ProduceResponse.json)."""
    topics = {"t": [PartitionAnswer(2, 0, 10, 1234, 0)]}
    head = b"\x00\x00\x00\x01" + b"\x00\x01t" + b"\x00\x00\x00\x01"
    part = b"\x00\x00\x00\x02" + b"\x00\x00" + (10).to_bytes(8, "big")
    assert b"".join(produce_response.encode(0, topics).chunks) == head + part
    assert b"".join(produce_response.encode(1, topics).chunks) == head + part + bytes(4)
    assert b"".join(produce_response.encode(2, topics).chunks) == (
        head + part + (1234).to_bytes(8, "big") + bytes(4))
