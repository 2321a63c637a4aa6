"""Every advertised version of every group API, over the wire, in-process.

One scenario per version step: a member finds the coordinator, joins
(MEMBER_ID_REQUIRED first from JoinGroup v4), syncs as leader, heartbeats,
commits and fetches offsets, is described and listed, leaves; the group is
deleted. Each API is used at ``min(its lowest version + step, its highest)``,
so every version of every API is encoded and decoded at least once.
"""

from __future__ import annotations

import asyncio
import dataclasses

from kio.schema.errors import ErrorCode

from kafka_gateway.apis import APIS
from kafka_gateway.client import KafkaClient
from kafka_gateway.server import GatewayServer
from kafka_gateway.settings import GatewayConfig
from testkit.consumer_protocol import encode_assignment, encode_subscription
from testkit.kafka_requests import Versions, ms

FIND_COORDINATOR, OFFSET_COMMIT, OFFSET_FETCH, JOIN_GROUP, HEARTBEAT = 10, 8, 9, 11, 12
LEAVE_GROUP, SYNC_GROUP, DESCRIBE_GROUPS, LIST_GROUPS, DELETE_GROUPS = 13, 14, 15, 16, 42
OFFSET_DELETE = 47
GROUP_APIS = (FIND_COORDINATOR, OFFSET_COMMIT, OFFSET_FETCH, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP,
              SYNC_GROUP, DESCRIBE_GROUPS, LIST_GROUPS, DELETE_GROUPS, OFFSET_DELETE)


async def scenario(client: KafkaClient, step: int, topic: str) -> None:
    v = Versions(step)
    group = f"group-{step}"

    found = await client.request(v.make(FIND_COORDINATOR, "FindCoordinatorRequest", key=group,
                                        key_type=0, coordinator_keys=(group,)))
    coordinator = found.coordinators[0] if v.version(FIND_COORDINATOR) >= 4 else found
    assert coordinator.error_code is ErrorCode.none
    assert coordinator.node_id == 0

    def join(member_id: str):
        return v.make(
            JOIN_GROUP, "JoinGroupRequest", group_id=group, session_timeout=ms(10_000),
            rebalance_timeout=ms(10_000), member_id=member_id, group_instance_id=None,
            protocol_type="consumer", reason=None,
            protocols=(v.make(JOIN_GROUP, "JoinGroupRequestProtocol", name="range",
                              metadata=encode_subscription([topic])),))

    joined = await client.request(join(""))
    if v.version(JOIN_GROUP) >= 4:
        assert joined.error_code is ErrorCode.member_id_required
        joined = await client.request(join(joined.member_id))
    assert joined.error_code is ErrorCode.none, joined
    member_id, generation = joined.member_id, joined.generation_id
    assert (joined.leader, generation, joined.protocol_name) == (member_id, 1, "range")
    assert [m.member_id for m in joined.members] == [member_id]

    assignment = encode_assignment({topic: [0, 1]})
    synced = await client.request(v.make(
        SYNC_GROUP, "SyncGroupRequest", group_id=group, generation_id=generation,
        member_id=member_id, group_instance_id=None, protocol_type="consumer",
        protocol_name="range",
        assignments=(v.make(SYNC_GROUP, "SyncGroupRequestAssignment", member_id=member_id,
                            assignment=assignment),)))
    assert (synced.error_code, synced.assignment) == (ErrorCode.none, assignment)

    beat = await client.request(v.make(HEARTBEAT, "HeartbeatRequest", group_id=group,
                                       generation_id=generation, member_id=member_id,
                                       group_instance_id=None))
    assert beat.error_code is ErrorCode.none
    stale = await client.request(v.make(HEARTBEAT, "HeartbeatRequest", group_id=group,
                                        generation_id=generation - 1, member_id=member_id,
                                        group_instance_id=None))
    assert stale.error_code is ErrorCode.illegal_generation

    committed = await client.request(v.make(
        OFFSET_COMMIT, "OffsetCommitRequest", group_id=group,
        generation_id_or_member_epoch=generation, member_id=member_id, group_instance_id=None,
        retention_time=ms(-1),
        topics=(v.make(OFFSET_COMMIT, "OffsetCommitRequestTopic", name=topic, partitions=(
            v.make(OFFSET_COMMIT, "OffsetCommitRequestPartition", partition_index=1,
                   committed_offset=42, committed_leader_epoch=0, committed_metadata="meta"),
            v.make(OFFSET_COMMIT, "OffsetCommitRequestPartition", partition_index=9,
                   committed_offset=1, committed_leader_epoch=-1, committed_metadata=None),
        )),)))
    codes = [p.error_code for p in committed.topics[0].partitions]
    assert codes == [ErrorCode.none, ErrorCode.unknown_topic_or_partition]

    if v.version(OFFSET_FETCH) >= 8:
        fetched = await client.request(v.make(
            OFFSET_FETCH, "OffsetFetchRequest", require_stable=True,
            groups=(v.make(OFFSET_FETCH, "OffsetFetchRequestGroup", group_id=group, topics=(
                v.make(OFFSET_FETCH, "OffsetFetchRequestTopics", name=topic,
                       partition_indexes=(0, 1)),)),)))
        topics = fetched.groups[0].topics
    else:
        fetched = await client.request(v.make(
            OFFSET_FETCH, "OffsetFetchRequest", group_id=group, require_stable=True,
            topics=(v.make(OFFSET_FETCH, "OffsetFetchRequestTopic", name=topic,
                           partition_indexes=(0, 1)),)))
        topics = fetched.topics
    offsets = {p.partition_index: (p.committed_offset, p.metadata) for p in topics[0].partitions}
    assert offsets == {0: (-1, ""), 1: (42, "meta")}

    described = await client.request(v.make(DESCRIBE_GROUPS, "DescribeGroupsRequest",
                                            groups=(group, "no-such-group"),
                                            include_authorized_operations=True))
    mine, unknown = described.groups
    assert (mine.group_state, mine.protocol_type, mine.protocol_data) == (
        "Stable", "consumer", "range")
    assert [(m.member_id, m.member_assignment) for m in mine.members] == [(member_id, assignment)]
    assert (unknown.error_code, unknown.group_state) == (ErrorCode.none, "Dead")

    listed = await client.request(v.make(LIST_GROUPS, "ListGroupsRequest",
                                         states_filter=("stable",)))
    assert group in {g.group_id for g in listed.groups}

    refused = await client.request(v.make(OFFSET_DELETE, "OffsetDeleteRequest", group_id=group,
                                          topics=(v.make(OFFSET_DELETE, "OffsetDeleteRequestTopic",
                                                         name=topic, partitions=(v.make(
                                                             OFFSET_DELETE,
                                                             "OffsetDeleteRequestPartition",
                                                             partition_index=1),)),)))
    assert refused.topics[0].partitions[0].error_code is ErrorCode.group_subscribed_to_topic

    busy = await client.request(v.make(DELETE_GROUPS, "DeleteGroupsRequest",
                                       groups_names=(group,)))
    assert busy.results[0].error_code is ErrorCode.non_empty_group

    if v.version(LEAVE_GROUP) >= 3:
        left = await client.request(v.make(
            LEAVE_GROUP, "LeaveGroupRequest", group_id=group,
            members=(v.make(LEAVE_GROUP, "MemberIdentity", member_id=member_id,
                            group_instance_id=None, reason="done"),)))
        assert [m.error_code for m in left.members] == [ErrorCode.none]
    else:
        left = await client.request(v.make(LEAVE_GROUP, "LeaveGroupRequest", group_id=group,
                                           member_id=member_id))
    assert left.error_code is ErrorCode.none

    deleted = await client.request(v.make(DELETE_GROUPS, "DeleteGroupsRequest",
                                          groups_names=(group, group + "-unknown")))
    assert [r.error_code for r in deleted.results] == [ErrorCode.none,
                                                        ErrorCode.group_id_not_found]


def test_every_version_of_every_group_api(tmp_path):
    steps = max(APIS[k].max_version - APIS[k].min_version for k in GROUP_APIS) + 1

    async def main() -> None:
        config = dataclasses.replace(GatewayConfig(), listen=("127.0.0.1", 0),
                                     data_dir=str(tmp_path), group_initial_rebalance_delay_ms=0)
        server = GatewayServer(config)
        await server.start()
        try:
            await server.engine.create_topic("events", 2, {})
            client = await KafkaClient.connect(*server.config.listen)
            try:
                for step in range(steps):
                    await scenario(client, step, "events")
            finally:
                await client.close()
        finally:
            await server.stop()

    asyncio.run(asyncio.wait_for(main(), 60))
