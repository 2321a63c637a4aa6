"""Raw requests for tests that send exact bytes: Produce of a given record set,
pipelined Produce on one connection, ListOffsets, CreateTopics and pipelined
InitProducerId (many transactional ids, cheaply).

    client = await KafkaClient.connect(*gateway.host_port)
    await create_topic(client, "t")
    answer = await produce(client, "t", batch_bytes)
"""

from __future__ import annotations

import asyncio
import datetime
import struct

from kio.schema.create_topics.v7 import request as create_topics
from kio.schema.list_offsets.v7 import request as list_offsets
from kio.schema.produce.v9 import request as produce_v9
from kio.schema.produce.v9 import response as produce_response
from kio.schema.types import TopicName
from kio.static.primitive import i32Timedelta

from kafka_gateway.client import KafkaClient
from kafka_gateway.codec import (
    ChunkWriter,
    entity_reader_for,
    entity_writer_for,
    skip_tagged_fields,
)

LATEST = -1
_TIMEOUT = i32Timedelta.parse(datetime.timedelta(seconds=30))


async def create_topic(client: KafkaClient, name: str, configs: dict[str, str] | None = None,
                       partitions: int = 1) -> None:
    response = await client.request(create_topics.CreateTopicsRequest(
        topics=(create_topics.CreatableTopic(
            name=TopicName(name), num_partitions=partitions, replication_factor=1,
            assignments=(), configs=tuple(
                create_topics.CreatableTopicConfig(name=k, value=v)
                for k, v in (configs or {}).items())),),
        timeout=_TIMEOUT, validate_only=False))
    assert response.topics[0].error_code.value == 0, response.topics[0]


def produce_request(topic: str, records: bytes, partition: int = 0) -> produce_v9.ProduceRequest:
    return produce_v9.ProduceRequest(
        transactional_id=None, acks=-1, timeout=_TIMEOUT,
        topic_data=(produce_v9.TopicProduceData(name=TopicName(topic), partition_data=(
            produce_v9.PartitionProduceData(index=partition, records=records),)),))


async def produce(client: KafkaClient, topic: str, records: bytes,
                  partition: int = 0) -> produce_response.PartitionProduceResponse:
    response = await client.request(produce_request(topic, records, partition))
    return response.responses[0].partition_responses[0]


async def list_offset(client: KafkaClient, topic: str, timestamp: int = LATEST,
                      partition: int = 0) -> list_offsets.ListOffsetsPartition:
    """The answer for one partition: ``.offset``, ``.timestamp``, ``.error_code``."""
    response = await client.request(list_offsets.ListOffsetsRequest(
        replica_id=-1, isolation_level=0, topics=(list_offsets.ListOffsetsTopic(
            name=TopicName(topic), partitions=(list_offsets.ListOffsetsPartition(
                partition_index=partition, current_leader_epoch=-1, timestamp=timestamp),)),)))
    return response.topics[0].partitions[0]


async def pipelined_produce(host: str, port: int, topic: str, record_sets: list[bytes],
                            partition: int = 0) -> list[produce_response.PartitionProduceResponse]:
    """Send every Produce request on one connection before reading any answer."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        frames = []
        for correlation, records in enumerate(record_sets):
            out = ChunkWriter()
            out.write(struct.pack(">hhih", 0, 9, correlation, 4) + b"test\x00")
            entity_writer_for(produce_v9.ProduceRequest)(
                out, produce_request(topic, records, partition))
            frames.append(struct.pack(">i", out.size) + b"".join(out.chunks))
        writer.write(b"".join(frames))
        await writer.drain()
        read = entity_reader_for(produce_response.ProduceResponse)
        answers = []
        for correlation in range(len(record_sets)):
            (size,) = struct.unpack(">i", await reader.readexactly(4))
            frame = await reader.readexactly(size)
            assert struct.unpack_from(">i", frame)[0] == correlation
            response, _ = read(frame, skip_tagged_fields(frame, 4))
            answers.append(response.responses[0].partition_responses[0])
        return answers
    finally:
        writer.close()


def init_producer_id_frame(transactional_id: bytes, correlation: int,
                           timeout_ms: int = 60_000) -> bytes:
    """InitProducerId v1 (int16-length string) with a transactional id of any bytes."""
    body = struct.pack(">hhih", 22, 1, correlation, 4) + b"test"
    body += struct.pack(">h", len(transactional_id)) + transactional_id
    body += struct.pack(">i", timeout_ms)
    return struct.pack(">i", len(body)) + body


async def init_transactional_ids(host: str, port: int, ids: list[str],
                                 window: int = 64) -> list[int]:
    """InitProducerId for each id, ``window`` at a time on one connection: a cheap way
    to make many transactional ids. Returns each answer's error code."""
    reader, writer = await asyncio.open_connection(host, port)
    codes: list[int] = []
    try:
        for start in range(0, len(ids), window):
            chunk = ids[start:start + window]
            writer.write(b"".join(init_producer_id_frame(tid.encode(), start + i)
                                  for i, tid in enumerate(chunk)))
            await writer.drain()
            for i in range(len(chunk)):
                (size,) = struct.unpack(">i", await reader.readexactly(4))
                frame = await reader.readexactly(size)
                # v1: correlation, throttle time, error code, producer id, epoch
                correlation, _throttle, code = struct.unpack_from(">iih", frame)
                assert correlation == start + i
                codes.append(code)
        return codes
    finally:
        writer.close()


def request_frame(body: object, correlation: int, client_id: bytes = b"test") -> bytes:
    """The whole frame (size prefix first) of a kio request entity, for a raw socket."""
    cls = type(body)
    out = ChunkWriter()
    out.write(struct.pack(">hhih", cls.__api_key__, cls.__version__, correlation,  # type: ignore[attr-defined]
                          len(client_id)) + client_id)
    if cls.__flexible__:  # type: ignore[attr-defined]
        out.write(b"\x00")  # no tagged fields in the header
    entity_writer_for(cls)(out, body)
    return struct.pack(">i", out.size) + b"".join(out.chunks)
