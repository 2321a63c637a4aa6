"""Every advertised version of every topic, data and admin API, over the wire.

Version-specific layouts are where bugs hide (a field one version lacks, a
nested schema another version renames), so one scenario runs per version step
against an in-process gateway: each API is used at ``min(its lowest version +
step, its highest)``, so every version is encoded, decoded and answered at
least once. Group APIs have their own test (test_group_apis.py), transaction
APIs theirs (test_txn_wire.py); Produce v0-2, which kio cannot encode, theirs
(test_produce_v0_2.py).
"""

from __future__ import annotations

from uuid import UUID

import pytest
from kio.schema.errors import ErrorCode
from kio.static.primitive import Records

from kafka_gateway.apis import APIS
from kafka_gateway.client import KafkaClient
from kafka_gateway.codec import request_schema
from kafka_gateway.server import GatewayServer
from tablets.records import record_timestamps
from testkit.batches import make_batch
from testkit.inprocess import serve
from testkit.kafka_requests import Versions, ms

PRODUCE, FETCH, LIST_OFFSETS, METADATA, OFFSET_FOR_LEADER_EPOCH = 0, 1, 2, 3, 23
API_VERSIONS, CREATE_TOPICS, DELETE_TOPICS, DELETE_RECORDS = 18, 19, 20, 21
DESCRIBE_CONFIGS, ALTER_CONFIGS, CREATE_PARTITIONS, INCREMENTAL_ALTER_CONFIGS = 32, 33, 37, 44
DESCRIBE_CLUSTER = 60
TOPIC_RESOURCE = 2
STEPS = max(APIS[k].max_version - APIS[k].min_version for k in (
    FETCH, LIST_OFFSETS, METADATA, CREATE_TOPICS, DELETE_TOPICS)) + 1


async def scenario(client: KafkaClient, step: int) -> None:
    v = Versions(step, floors={PRODUCE: 3})  # kio cannot encode Produce v0-2
    topic = f"wire-{step}"
    timestamp = 1_700_000_000_000

    versions = await client.request(v.make(API_VERSIONS, "ApiVersionsRequest",
                                           client_software_name="t",
                                           client_software_version="1"))
    assert versions.error_code is ErrorCode.none
    assert {k.api_key for k in versions.api_keys} == set(APIS)

    created = await client.request(v.make(
        CREATE_TOPICS, "CreateTopicsRequest", timeout=ms(5000), validate_only=False,
        topics=(v.make(CREATE_TOPICS, "CreatableTopic", name=topic, num_partitions=2,
                       replication_factor=1, assignments=(),
                       configs=(v.make(CREATE_TOPICS, "CreatableTopicConfig",
                                       name="retention.ms", value="86400000"),)),)))
    assert created.topics[0].error_code is ErrorCode.none

    metadata = await client.request(v.make(
        METADATA, "MetadataRequest", allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False, include_topic_authorized_operations=False,
        topics=(v.make(METADATA, "MetadataRequestTopic", name=topic, topic_id=None),)))
    [described] = metadata.topics
    assert described.error_code is ErrorCode.none
    assert [p.leader_id for p in described.partitions] == [0, 0]
    topic_id = await _topic_id(client, topic)
    if v.version(METADATA) >= 10:
        assert described.topic_id == topic_id

    batch = make_batch([b"a", b"b", b"c"], base_timestamp=timestamp)
    produced = await client.request(v.make(
        PRODUCE, "ProduceRequest", transactional_id=None, acks=-1, timeout=ms(5000),
        topic_data=(v.make(PRODUCE, "TopicProduceData", name=topic, partition_data=(
            v.make(PRODUCE, "PartitionProduceData", index=0, records=Records(batch)),)),)))
    result = produced.responses[0].partition_responses[0]
    assert (result.error_code, result.base_offset) == (ErrorCode.none, 0)

    fetched = await client.request(v.make(
        FETCH, "FetchRequest", replica_id=-1, max_wait=ms(0), min_bytes=1, max_bytes=1 << 20,
        isolation_level=1, session_id=0, session_epoch=-1, forgotten_topics_data=(),
        rack_id="", topics=(v.make(FETCH, "FetchTopic", topic=topic, topic_id=topic_id,
                                   partitions=(v.make(FETCH, "FetchPartition", partition=0,
                                                      fetch_offset=1, partition_max_bytes=1 << 20,
                                                      current_leader_epoch=0),)),)))
    data = fetched.responses[0].partitions[0]
    assert (data.error_code, data.high_watermark) == (ErrorCode.none, 3)
    assert [o for o, _ in record_timestamps(bytes(data.records))] == [0, 1, 2]

    async def list_offset(position: int) -> tuple[int, int]:
        answer = await client.request(v.make(
            LIST_OFFSETS, "ListOffsetsRequest", replica_id=-1, isolation_level=1,
            topics=(v.make(LIST_OFFSETS, "ListOffsetsTopic", name=topic, partitions=(
                v.make(LIST_OFFSETS, "ListOffsetsPartition", partition_index=0,
                       timestamp=position, current_leader_epoch=-1),)),)))
        part = answer.topics[0].partitions[0]
        assert part.error_code is ErrorCode.none
        return part.offset, part.timestamp

    assert (await list_offset(-1))[0] == 3
    assert (await list_offset(-2))[0] == 0
    assert await list_offset(timestamp) == (0, timestamp)
    if v.version(LIST_OFFSETS) >= 7:
        assert await list_offset(-3) == (0, timestamp)

    epochs = await client.request(v.make(
        OFFSET_FOR_LEADER_EPOCH, "OffsetForLeaderEpochRequest", replica_id=-1,
        topics=(v.make(OFFSET_FOR_LEADER_EPOCH, "OffsetForLeaderTopic", topic=topic, partitions=(
            v.make(OFFSET_FOR_LEADER_EPOCH, "OffsetForLeaderPartition", partition=0,
                   current_leader_epoch=0, leader_epoch=0),)),)))
    end = epochs.topics[0].partitions[0]
    assert (end.error_code, end.leader_epoch, end.end_offset) == (ErrorCode.none, 0, 3)

    async def config(name: str) -> str | None:
        answer = await client.request(v.make(
            DESCRIBE_CONFIGS, "DescribeConfigsRequest", include_synonyms=True,
            include_documentation=False,
            resources=(v.make(DESCRIBE_CONFIGS, "DescribeConfigsResource",
                              resource_type=TOPIC_RESOURCE, resource_name=topic,
                              configuration_keys=(name,)),)))
        [entry] = answer.results[0].configs
        return entry.value

    assert await config("retention.ms") == "86400000"
    altered = await client.request(v.make(
        INCREMENTAL_ALTER_CONFIGS, "IncrementalAlterConfigsRequest", validate_only=False,
        resources=(v.make(INCREMENTAL_ALTER_CONFIGS, "AlterConfigsResource",
                          resource_type=TOPIC_RESOURCE, resource_name=topic, configs=(
                              v.make(INCREMENTAL_ALTER_CONFIGS, "AlterableConfig",
                                     name="retention.ms", config_operation=0, value="5000"),)),)))
    assert altered.responses[0].error_code is ErrorCode.none
    assert await config("retention.ms") == "5000"
    replaced = await client.request(v.make(
        ALTER_CONFIGS, "AlterConfigsRequest", validate_only=False,
        resources=(v.make(ALTER_CONFIGS, "AlterConfigsResource", resource_type=TOPIC_RESOURCE,
                          resource_name=topic, configs=(
                              v.make(ALTER_CONFIGS, "AlterableConfig",
                                     name="max.message.bytes", value="2000"),)),)))
    assert replaced.responses[0].error_code is ErrorCode.none
    assert await config("retention.ms") == "604800000"  # not named: back to the default
    assert await config("max.message.bytes") == "2000"

    grown = await client.request(v.make(
        CREATE_PARTITIONS, "CreatePartitionsRequest", timeout=ms(5000), validate_only=False,
        topics=(v.make(CREATE_PARTITIONS, "CreatePartitionsTopic", name=topic, count=3,
                       assignments=None),)))
    assert grown.results[0].error_code is ErrorCode.none

    deleted = await client.request(v.make(
        DELETE_RECORDS, "DeleteRecordsRequest", timeout=ms(5000),
        topics=(v.make(DELETE_RECORDS, "DeleteRecordsTopic", name=topic, partitions=(
            v.make(DELETE_RECORDS, "DeleteRecordsPartition", partition_index=0, offset=1),)),)))
    part = deleted.topics[0].partitions[0]
    assert (part.error_code, part.low_watermark) == (ErrorCode.none, 1)

    cluster = await client.request(v.make(DESCRIBE_CLUSTER, "DescribeClusterRequest",
                                          include_cluster_authorized_operations=False))
    assert cluster.controller_id == 0 and len(cluster.brokers) == 1

    by_state = v.version(DELETE_TOPICS) >= 6  # v6 names topics by name or id
    gone = await client.request(v.make(
        DELETE_TOPICS, "DeleteTopicsRequest", timeout=ms(5000), topic_names=(topic,),
        topics=(v.make(DELETE_TOPICS, "DeleteTopicState", name=topic, topic_id=None),)
        if by_state else ()))
    assert gone.responses[0].error_code is ErrorCode.none


async def _topic_id(client: KafkaClient, topic: str) -> UUID:
    """The topic's id, through the newest Metadata version."""
    schema = request_schema(METADATA, APIS[METADATA].max_version)
    answer = await client.request(schema.MetadataRequest(
        topics=(schema.MetadataRequestTopic(topic_id=None, name=topic),),
        allow_auto_topic_creation=False, include_topic_authorized_operations=False))
    return answer.topics[0].topic_id


@pytest.mark.timeout(120)
def test_every_version_of_every_api(tmp_path):
    async def main(client: KafkaClient, _server: GatewayServer) -> None:
        for step in range(STEPS):
            await scenario(client, step)

    serve(tmp_path, main)
