"""Requests that decode but sit at the edges: null arrays, empty lists, the zero id.

Where Kafka's schema lets an array be null the handler gives it the meaning
Kafka gives it; where it does not, the parse fails and only that connection
closes, as in Kafka ("non-nullable field ... was serialized as null"). An
empty Fetch is answered at once, not after max_wait.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Awaitable, Callable
from uuid import UUID

import pytest
from kio.schema.errors import ErrorCode

from kafka_gateway.client import KafkaClient
from kafka_gateway.codec import build, request_schema
from kafka_gateway.server import GatewayServer
from testkit.inprocess import serve

FETCH, METADATA, OFFSET_COMMIT, OFFSET_FETCH, LIST_OFFSETS = 1, 3, 8, 9, 2
CREATE_TOPICS, DESCRIBE_CONFIGS, CREATE_PARTITIONS = 19, 32, 37
TOPIC, GROUP = "edge", "edge-group"
TEN_MINUTES = datetime.timedelta(minutes=10)


def _serve(tmp_path, scenario: Callable[[KafkaClient, GatewayServer], Awaitable[None]]) -> None:
    """The scenario against a fresh gateway holding topic ``edge`` (2 partitions)."""

    async def with_topic(client: KafkaClient, server: GatewayServer) -> None:
        schema = request_schema(CREATE_TOPICS, 7)
        await client.request(schema.CreateTopicsRequest(
            topics=(schema.CreatableTopic(name=TOPIC, num_partitions=2,
                                          replication_factor=1, assignments=(),
                                          configs=()),),
            timeout=datetime.timedelta(seconds=5), validate_only=False))
        await scenario(client, server)

    serve(tmp_path, with_topic)


@pytest.mark.parametrize("version", [4, 11, 13])
def test_a_fetch_of_no_topics_is_answered_at_once(tmp_path, version):
    async def scenario(client: KafkaClient, _server) -> None:
        schema = request_schema(FETCH, version)
        # max_wait is ten minutes: only an immediate answer beats the timeout.
        answer = await asyncio.wait_for(client.request(build(
            schema.FetchRequest, replica_id=-1, max_wait=TEN_MINUTES, min_bytes=1,
            max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1, topics=(),
            forgotten_topics_data=(), rack_id="")), 60)
        assert answer.responses == ()

    _serve(tmp_path, scenario)


def test_fetch_by_the_zero_topic_id_is_unknown_topic_id(tmp_path):
    async def scenario(client: KafkaClient, _server) -> None:
        schema = request_schema(FETCH, 13)
        answer = await client.request(schema.FetchRequest(
            replica_id=-1, max_wait=TEN_MINUTES, min_bytes=1, max_bytes=1 << 20,
            isolation_level=0, session_id=0, session_epoch=-1, forgotten_topics_data=(),
            rack_id="", topics=(schema.FetchTopic(topic_id=UUID(int=0), partitions=(
                schema.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20,
                                      current_leader_epoch=-1, log_start_offset=-1,
                                      last_fetched_epoch=-1),)),)))
        [topic] = answer.responses
        assert topic.topic_id in (None, UUID(int=0))
        assert topic.partitions[0].error_code is ErrorCode.unknown_topic_id

    _serve(tmp_path, scenario)


def test_null_arrays_where_the_schema_allows_them(tmp_path):
    async def scenario(client: KafkaClient, _server) -> None:
        # Metadata v1+: null topics is every topic.
        schema = request_schema(METADATA, 12)
        answer = await client.request(schema.MetadataRequest(
            topics=None, allow_auto_topic_creation=False,
            include_topic_authorized_operations=False))
        assert [t.name for t in answer.topics] == [TOPIC]

        # DescribeConfigs: null keys is every config.
        schema = request_schema(DESCRIBE_CONFIGS, 4)
        answer = await client.request(schema.DescribeConfigsRequest(
            resources=(schema.DescribeConfigsResource(resource_type=2, resource_name=TOPIC,
                                                      configuration_keys=None),),
            include_synonyms=False, include_documentation=False))
        names = {c.name for c in answer.results[0].configs}
        assert {"retention.ms", "cleanup.policy", "max.message.bytes"} <= names

        # CreatePartitions: null assignments lets the broker place them.
        schema = request_schema(CREATE_PARTITIONS, 3)
        answer = await client.request(schema.CreatePartitionsRequest(
            topics=(schema.CreatePartitionsTopic(name=TOPIC, count=3, assignments=None),),
            timeout=datetime.timedelta(seconds=5), validate_only=False))
        assert answer.results[0].error_code is ErrorCode.none

        # OffsetFetch v2-7 and v8's groups: null topics is every committed offset.
        schema = request_schema(OFFSET_COMMIT, 8)
        committed = await client.request(schema.OffsetCommitRequest(
            group_id=GROUP, generation_id_or_member_epoch=-1, member_id="",
            group_instance_id=None, topics=(schema.OffsetCommitRequestTopic(name=TOPIC, partitions=(
                schema.OffsetCommitRequestPartition(partition_index=1, committed_offset=0,
                                                    committed_leader_epoch=-1,
                                                    committed_metadata="m"),)),)))
        assert committed.topics[0].partitions[0].error_code is ErrorCode.none
        schema = request_schema(OFFSET_FETCH, 7)
        answer = await client.request(schema.OffsetFetchRequest(
            group_id=GROUP, topics=None, require_stable=False))
        assert [(t.name, [p.partition_index for p in t.partitions])
                for t in answer.topics] == [(TOPIC, [1])]
        schema = request_schema(OFFSET_FETCH, 8)
        answer = await client.request(schema.OffsetFetchRequest(
            groups=(schema.OffsetFetchRequestGroup(group_id=GROUP, topics=None),),
            require_stable=False))
        assert [t.name for t in answer.groups[0].topics] == [TOPIC]

    _serve(tmp_path, scenario)


@pytest.mark.parametrize(("api_key", "version", "request_of"), [
    (LIST_OFFSETS, 7, lambda s: s.ListOffsetsRequest(replica_id=-1, isolation_level=0,
                                                     topics=None)),
    (METADATA, 0, lambda s: s.MetadataRequest(topics=None)),
    (OFFSET_FETCH, 1, lambda s: s.OffsetFetchRequest(group_id=GROUP, topics=None)),
    (FETCH, 4, lambda s: s.FetchRequest(replica_id=-1, max_wait=TEN_MINUTES, min_bytes=1,
                                         max_bytes=1, isolation_level=0, topics=None)),
])
def test_a_null_array_the_schema_does_not_allow_closes_only_that_connection(
        tmp_path, api_key, version, request_of):
    async def scenario(client: KafkaClient, server: GatewayServer) -> None:
        other = await KafkaClient.connect(*server.config.listen)
        try:
            with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):
                await other.request(request_of(request_schema(api_key, version)))
        finally:
            await other.close()
        schema = request_schema(METADATA, 12)  # the first connection is still served
        answer = await client.request(schema.MetadataRequest(
            topics=None, allow_auto_topic_creation=False,
            include_topic_authorized_operations=False))
        assert [t.name for t in answer.topics] == [TOPIC]
        assert server.broker.metrics.request_errors == {}  # no handler saw the None

    _serve(tmp_path, scenario)
