"""Kafka requests for raw-client tests: built at any version, and sent as exact bytes.

Builders, from plain arguments:

    create_topics([("t", 3)])                     # newest version kio and Kafka share
    list_offsets("t", [(0, -2)], version=1)        # an older one, same arguments

Each builder takes every field any version has and keeps those the chosen
version knows (``codec.build``), so one scenario can be replayed at each version;
``Versions`` builds any request at every version the gateway advertises.

Senders, for tests that need exact bytes on the wire: Produce of a given record
set (``send_produce``), pipelined Produce on one connection, ListOffsets,
CreateTopics, pipelined InitProducerId (many transactional ids, cheaply), and
``request_frame`` (the whole frame of a request, for a raw socket).

    client = await KafkaClient.connect(*gateway.host_port)
    await create_topic(client, "t")
    answer = await send_produce(client, "t", batch_bytes)
"""

from __future__ import annotations

import asyncio
import datetime
import struct
from collections.abc import Iterable, Mapping
from typing import Any

from kio.schema.produce.v9 import response as produce_response
from kio.static.primitive import i32Timedelta

from kafka_gateway.apis import APIS
from kafka_gateway.client import KafkaClient
from kafka_gateway.codec import (
    ChunkWriter,
    build,
    entity_reader_for,
    entity_writer_for,
    request_schema,
    skip_tagged_fields,
)

# Config operations of IncrementalAlterConfigs.
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
# Resource types of the config APIs.
TOPIC, BROKER = 2, 4


LATEST = -1


def ms(value: int) -> datetime.timedelta:
    return i32Timedelta.parse(datetime.timedelta(milliseconds=value))


def _schema(api_key: int, version: int) -> Any:
    return request_schema(api_key, version)


Configs = Mapping[str, str | None] | Iterable[tuple[str, str | None]]


def _pairs(configs: Configs | None) -> list[tuple[str, str | None]]:
    if configs is None:
        return []
    return list(configs.items()) if isinstance(configs, Mapping) else list(configs)


def create_topics(topics: Iterable[tuple], validate_only: bool = False,
                  version: int = 7) -> Any:
    """``topics``: (name, partitions[, replication factor[, configs[, assignments]]])."""
    s = _schema(19, version)
    out = []
    for name, partitions, *rest in topics:
        replication = rest[0] if rest else 1
        configs = rest[1] if len(rest) > 1 else None
        assignments = rest[2] if len(rest) > 2 else ()
        out.append(build(
            s.CreatableTopic, name=name, num_partitions=partitions,
            replication_factor=replication,
            assignments=tuple(build(s.CreatableReplicaAssignment, partition_index=i,
                                    broker_ids=tuple(ids)) for i, ids in assignments),
            configs=tuple(build(s.CreatableTopicConfig, name=k, value=v)
                          for k, v in _pairs(configs))))
    return build(s.CreateTopicsRequest, topics=tuple(out), timeout=ms(30_000),
                 validate_only=validate_only)


def delete_topics(names: Iterable[str], version: int = 6) -> Any:
    s = _schema(20, version)
    names = tuple(names)
    return build(s.DeleteTopicsRequest, topic_names=names,
                 topics=tuple(build(s.DeleteTopicState, name=n, topic_id=None) for n in names)
                 if hasattr(s, "DeleteTopicState") else (), timeout=ms(30_000))


def produce(batches: Iterable[tuple[str, int, bytes | None]], acks: int = -1,
            version: int = 9, transactional_id: str | None = None) -> Any:
    """``batches``: (topic, partition, record set) in request order."""
    s = _schema(0, version)
    topics: dict[str, list[Any]] = {}
    for topic, partition, records in batches:
        topics.setdefault(topic, []).append(
            build(s.PartitionProduceData, index=partition, records=records))
    return build(s.ProduceRequest, transactional_id=transactional_id, acks=acks,
                 timeout=ms(30_000),
                 topic_data=tuple(build(s.TopicProduceData, name=t, partition_data=tuple(p))
                                  for t, p in topics.items()))


def list_offsets(topic: str, partitions: Iterable[tuple[int, int]], isolation_level: int = 0,
                 version: int = 7, current_leader_epoch: int = -1) -> Any:
    """``partitions``: (partition, timestamp or -1 latest / -2 earliest / -3 max)."""
    s = _schema(2, version)
    return build(s.ListOffsetsRequest, replica_id=-1, isolation_level=isolation_level,
                 topics=(build(s.ListOffsetsTopic, name=topic, partitions=tuple(
                     build(s.ListOffsetsPartition, partition_index=p, timestamp=ts,
                           current_leader_epoch=current_leader_epoch, max_num_offsets=1)
                     for p, ts in partitions)),))


def fetch(topic: Any, partitions: Iterable[tuple[int, int, int]], isolation_level: int = 0,
          max_bytes: int = 50 << 20, max_wait_ms: int = 0, version: int = 12,
          current_leader_epoch: int = -1) -> Any:
    """``partitions``: (partition, fetch offset, partition max bytes); ``topic`` is
    a name, or a topic id from v13 on."""
    s = _schema(1, version)
    parts = tuple(build(s.FetchPartition, partition=p, current_leader_epoch=current_leader_epoch,
                        fetch_offset=offset, last_fetched_epoch=-1, log_start_offset=-1,
                        partition_max_bytes=limit) for p, offset, limit in partitions)
    return build(s.FetchRequest, cluster_id=None, replica_id=-1, max_wait=ms(max_wait_ms),
                 min_bytes=1, max_bytes=max_bytes, isolation_level=isolation_level,
                 session_id=0, session_epoch=-1,
                 topics=(build(s.FetchTopic, topic=topic, topic_id=topic, partitions=parts),),
                 forgotten_topics_data=(), rack_id="")


def delete_records(topic: str, partitions: Iterable[tuple[int, int]], version: int = 2) -> Any:
    s = _schema(21, version)
    return build(s.DeleteRecordsRequest, timeout=ms(30_000), topics=(build(
        s.DeleteRecordsTopic, name=topic, partitions=tuple(
            build(s.DeleteRecordsPartition, partition_index=p, offset=o)
            for p, o in partitions)),))


def metadata(topics: Iterable[str] | None, allow_auto_topic_creation: bool = False,
             version: int = 12) -> Any:
    s = _schema(3, version)
    listed = None if topics is None else tuple(
        build(s.MetadataRequestTopic, name=t, topic_id=None) for t in topics)
    return build(s.MetadataRequest, topics=listed,
                 allow_auto_topic_creation=allow_auto_topic_creation,
                 include_cluster_authorized_operations=False,
                 include_topic_authorized_operations=False)


def describe_configs(resources: Iterable[tuple[int, str, Iterable[str] | None]],
                     include_synonyms: bool = False, include_documentation: bool = False,
                     version: int = 4) -> Any:
    s = _schema(32, version)
    return build(s.DescribeConfigsRequest, include_synonyms=include_synonyms,
                 include_documentation=include_documentation, resources=tuple(
                     build(s.DescribeConfigsResource, resource_type=kind, resource_name=name,
                           configuration_keys=None if keys is None else tuple(keys))
                     for kind, name, keys in resources))


def incremental_alter_configs(resources: Iterable[tuple[int, str, Iterable[tuple]]],
                              validate_only: bool = False, version: int = 1) -> Any:
    """``resources``: (type, name, [(config, operation, value), ...])."""
    s = _schema(44, version)
    return build(s.IncrementalAlterConfigsRequest, validate_only=validate_only, resources=tuple(
        build(s.AlterConfigsResource, resource_type=kind, resource_name=name, configs=tuple(
            build(s.AlterableConfig, name=c, config_operation=op, value=v) for c, op, v in ops))
        for kind, name, ops in resources))


def alter_configs(resources: Iterable[tuple[int, str, Configs]], validate_only: bool = False,
                  version: int = 2) -> Any:
    s = _schema(33, version)
    return build(s.AlterConfigsRequest, validate_only=validate_only, resources=tuple(
        build(s.AlterConfigsResource, resource_type=kind, resource_name=name, configs=tuple(
            build(s.AlterableConfig, name=k, value=v) for k, v in _pairs(configs)))
        for kind, name, configs in resources))


def join_group(group: str, member_id: str = "", instance_id: str | None = None,
               protocols: Iterable[tuple[str, bytes]] = (("range", b"\x00"),),
               session_timeout_ms: int = 30_000, rebalance_timeout_ms: int = 60_000,
               protocol_type: str = "consumer", version: int = 9) -> Any:
    s = _schema(11, version)
    return build(s.JoinGroupRequest, group_id=group, session_timeout=ms(session_timeout_ms),
                 rebalance_timeout=ms(rebalance_timeout_ms), member_id=member_id,
                 group_instance_id=instance_id, protocol_type=protocol_type,
                 protocols=tuple(build(s.JoinGroupRequestProtocol, name=n, metadata=m)
                                 for n, m in protocols), reason=None)


def sync_group(group: str, generation: int, member_id: str, instance_id: str | None = None,
               assignments: Iterable[tuple[str, bytes]] = (), protocol_type: str | None = None,
               protocol_name: str | None = None, version: int = 5) -> Any:
    s = _schema(14, version)
    return build(s.SyncGroupRequest, group_id=group, generation_id=generation,
                 member_id=member_id, group_instance_id=instance_id,
                 protocol_type=protocol_type, protocol_name=protocol_name,
                 assignments=tuple(build(s.SyncGroupRequestAssignment, member_id=m, assignment=a)
                                   for m, a in assignments))


def heartbeat(group: str, generation: int, member_id: str, instance_id: str | None = None,
              version: int = 4) -> Any:
    s = _schema(12, version)
    return build(s.HeartbeatRequest, group_id=group, generation_id=generation,
                 member_id=member_id, group_instance_id=instance_id)


def leave_group(group: str, members: Iterable[tuple[str, str | None]], version: int = 5) -> Any:
    s = _schema(13, version)
    members = list(members)
    return build(s.LeaveGroupRequest, group_id=group, member_id=members[0][0] if members else "",
                 members=tuple(build(s.MemberIdentity, member_id=m, group_instance_id=i,
                                     reason=None) for m, i in members))


def offset_commit(group: str, generation: int, member_id: str, topic: str,
                  offsets: Iterable[tuple[int, int]], instance_id: str | None = None,
                  version: int = 8) -> Any:
    s = _schema(8, version)
    return build(s.OffsetCommitRequest, group_id=group, generation_id_or_member_epoch=generation,
                 member_id=member_id, group_instance_id=instance_id, retention_time=-1,
                 topics=(build(s.OffsetCommitRequestTopic, name=topic, partitions=tuple(
                     build(s.OffsetCommitRequestPartition, partition_index=p,
                           committed_offset=o, committed_leader_epoch=-1,
                           committed_metadata="", commit_timestamp=-1)
                     for p, o in offsets)),))


def offset_fetch(group: str, topic: str, partitions: Iterable[int], version: int = 8) -> Any:
    s = _schema(9, version)
    partitions = tuple(partitions)
    if version >= 8:
        return build(s.OffsetFetchRequest, require_stable=False, groups=(build(
            s.OffsetFetchRequestGroup, group_id=group, topics=(build(
                s.OffsetFetchRequestTopics, name=topic, partition_indexes=partitions),)),))
    return build(s.OffsetFetchRequest, group_id=group, require_stable=False, topics=(build(
        s.OffsetFetchRequestTopic, name=topic, partition_indexes=partitions),))


def describe_groups(groups: Iterable[str], version: int = 5) -> Any:
    s = _schema(15, version)
    return build(s.DescribeGroupsRequest, groups=tuple(groups),
                 include_authorized_operations=False)


def list_groups(states: Iterable[str] = (), version: int = 4) -> Any:
    s = _schema(16, version)
    return build(s.ListGroupsRequest, states_filter=tuple(states))


def find_coordinator(keys: Iterable[str], key_type: int = 0, version: int = 4) -> Any:
    """``keys``: group ids (key type 0) or transactional ids (1); one before v4."""
    s = _schema(10, version)
    keys = tuple(keys)
    return build(s.FindCoordinatorRequest, key=keys[0], key_type=key_type,
                 coordinator_keys=keys)


def offset_for_leader_epoch(topic: str, partitions: Iterable[tuple[int, int, int]],
                            version: int = 4) -> Any:
    """``partitions``: (partition, current leader epoch, leader epoch asked about)."""
    s = _schema(23, version)
    return build(s.OffsetForLeaderEpochRequest, replica_id=-1, topics=(build(
        s.OffsetForLeaderTopic, topic=topic, partitions=tuple(
            build(s.OffsetForLeaderPartition, partition=p, current_leader_epoch=current,
                  leader_epoch=epoch) for p, current, epoch in partitions)),))


def init_producer_id(transactional_id: str | None, timeout_ms: int = 60_000,
                     version: int = 4) -> Any:
    s = _schema(22, version)
    return build(s.InitProducerIdRequest, transactional_id=transactional_id,
                 transaction_timeout=ms(timeout_ms), producer_id=-1, producer_epoch=-1)


def add_partitions_to_txn(transactional_id: str, producer_id: int, epoch: int,
                          partitions: Iterable[tuple[str, Iterable[int]]],
                          version: int = 3) -> Any:
    """``partitions``: (topic, partition indexes)."""
    s = _schema(24, version)
    return build(s.AddPartitionsToTxnRequest, v3_and_below_transactional_id=transactional_id,
                 v3_and_below_producer_id=producer_id, v3_and_below_producer_epoch=epoch,
                 v3_and_below_topics=tuple(
                     build(s.AddPartitionsToTxnTopic, name=name, partitions=tuple(indexes))
                     for name, indexes in partitions))


def add_offsets_to_txn(transactional_id: str, producer_id: int, epoch: int, group: str,
                       version: int = 3) -> Any:
    s = _schema(25, version)
    return build(s.AddOffsetsToTxnRequest, transactional_id=transactional_id,
                 producer_id=producer_id, producer_epoch=epoch, group_id=group)


def txn_offset_commit(transactional_id: str, producer_id: int, epoch: int, group: str,
                      topic: str, offsets: Iterable[tuple[int, int, str | None]],
                      version: int = 3) -> Any:
    """``offsets``: (partition, offset, metadata)."""
    s = _schema(28, version)
    return build(s.TxnOffsetCommitRequest, transactional_id=transactional_id, group_id=group,
                 producer_id=producer_id, producer_epoch=epoch, generation_id=-1, member_id="",
                 group_instance_id=None, topics=(build(
                     s.TxnOffsetCommitRequestTopic, name=topic, partitions=tuple(
                         build(s.TxnOffsetCommitRequestPartition, partition_index=p,
                               committed_offset=o, committed_leader_epoch=-1,
                               committed_metadata=m) for p, o, m in offsets)),))


def end_txn(transactional_id: str, producer_id: int, epoch: int, commit: bool,
            version: int = 3) -> Any:
    s = _schema(26, version)
    return build(s.EndTxnRequest, transactional_id=transactional_id, producer_id=producer_id,
                 producer_epoch=epoch, committed=commit)


def create_partitions(topics: Iterable[tuple[str, int]], validate_only: bool = False,
                      version: int = 3) -> Any:
    """``topics``: (name, new total partition count)."""
    s = _schema(37, version)
    return build(s.CreatePartitionsRequest, timeout=ms(30_000), validate_only=validate_only,
                 topics=tuple(build(s.CreatePartitionsTopic, name=name, count=count,
                                    assignments=None) for name, count in topics))


# ACL enums (Kafka's AclOperation, AclPermissionType, PatternType, ResourceType).
ACL_ANY, ACL_READ, ACL_ALLOW, LITERAL, ACL_TOPIC = 1, 3, 3, 3, 2


def create_acls(creations: Iterable[tuple[str, str]], version: int = 3) -> Any:
    """``creations``: (topic, principal): ALLOW READ from any host, literal names."""
    s = _schema(30, version)
    return build(s.CreateAclsRequest, creations=tuple(
        build(s.AclCreation, resource_type=ACL_TOPIC, resource_name=topic,
              resource_pattern_type=LITERAL, principal=principal, host="*",
              operation=ACL_READ, permission_type=ACL_ALLOW)
        for topic, principal in creations))


def delete_acls(filters: Iterable[tuple[str | None, str | None]], version: int = 3) -> Any:
    """``filters``: (topic or None for any, principal or None for any)."""
    s = _schema(31, version)
    return build(s.DeleteAclsRequest, filters=tuple(
        build(s.DeleteAclsFilter, resource_type_filter=ACL_TOPIC, resource_name_filter=topic,
              pattern_type_filter=LITERAL, principal_filter=principal, host_filter=None,
              operation=ACL_ANY, permission_type=ACL_ALLOW)
        for topic, principal in filters))


def describe_acls(topic: str | None = None, version: int = 3) -> Any:
    s = _schema(29, version)
    return build(s.DescribeAclsRequest, resource_type_filter=ACL_TOPIC,
                 resource_name_filter=topic, pattern_type_filter=LITERAL,
                 principal_filter=None, host_filter=None, operation=ACL_ANY,
                 permission_type=ACL_ALLOW)


class Versions:
    """Builds requests of one API at one version from every field any version has.

    Step ``n`` uses each API at ``min(lowest + n, highest)``; ``lowest`` is the
    advertised minimum unless ``floors`` raises it (versions kio cannot encode).
    """

    def __init__(self, step: int, floors: dict[int, int] | None = None) -> None:
        self.step = step
        self.floors = floors or {}

    def version(self, api_key: int) -> int:
        api = APIS[api_key]
        low = max(api.min_version, self.floors.get(api_key, api.min_version))
        return min(low + self.step, api.max_version)

    def make(self, api_key: int, entity: str, /, **fields):
        return build(getattr(request_schema(api_key, self.version(api_key)), entity), **fields)


async def create_topic(client: KafkaClient, name: str, configs: dict[str, str] | None = None,
                       partitions: int = 1) -> None:
    """Create the topic, then wait until Metadata names a leader for each of its
    partitions: Kafka (KRaft) answers CreateTopics once its controller committed
    the topic, and a broker may answer NOT_LEADER_OR_FOLLOWER to a Produce until
    the new metadata reaches it, as Kafka's own AdminClient users wait for."""
    response = await client.request(create_topics([(name, partitions, 1, configs)]))
    assert response.topics[0].error_code.value == 0, response.topics[0]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while True:
        (topic,) = (await client.request(metadata([name]))).topics
        if topic.error_code.value == 0 and len(topic.partitions) == partitions and all(
                p.error_code.value == 0 and p.leader_id >= 0 for p in topic.partitions):
            return
        assert loop.time() < deadline, f"no leader for every partition of {name} in 30 s"
        await asyncio.sleep(0.05)


async def send_produce(client: KafkaClient, topic: str, records: bytes,
                       partition: int = 0) -> produce_response.PartitionProduceResponse:
    """Produce (v9, acks=all) of one record set; the partition's answer."""
    response = await client.request(produce([(topic, partition, records)]))
    return response.responses[0].partition_responses[0]


async def list_offset(client: KafkaClient, topic: str, timestamp: int = LATEST,
                      partition: int = 0) -> Any:
    """The answer for one partition: ``.offset``, ``.timestamp``, ``.error_code``."""
    response = await client.request(list_offsets(topic, [(partition, timestamp)]))
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
            request = produce([(topic, partition, records)])
            entity_writer_for(type(request))(out, request)
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
