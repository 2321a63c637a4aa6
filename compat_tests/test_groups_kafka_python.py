"""Consumer groups with kafka-python (3.0): subscribe and share partitions,
rebalance on leave, commit with metadata, assign()-based commits, static
members, and the group admin APIs (ListGroups, DescribeGroups, OffsetFetch,
OffsetDelete, batched LeaveGroup, DeleteGroups)."""

from __future__ import annotations

import time
import uuid

import pytest
from compat_helpers import create_topic
from group_helpers import (
    SESSION_TIMEOUT_MS,
    committed_offsets,
    describe_group,
    group_gateway,
    stable_assignment,
    wait_for,
)
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import MemberToRemove
from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from kafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor
from kafka.errors import GroupSubscribedToTopicError, NoError
from kafka.structs import OffsetAndMetadata


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with group_gateway(tmp_path_factory.mktemp("groups-kafka-python") / "data") as gw:
        yield gw


def produce(gateway, topic: str, count: int, partitions: int) -> list[str]:
    values = [f"v{i}" for i in range(count)]
    producer = KafkaProducer(bootstrap_servers=gateway.bootstrap)
    try:
        for index, value in enumerate(values):
            producer.send(topic, value.encode(), partition=index % partitions)
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=10)
    return values


def group_consumer(gateway, group: str, **config) -> KafkaConsumer:
    return KafkaConsumer(
        bootstrap_servers=gateway.bootstrap, group_id=group, auto_offset_reset="earliest",
        enable_auto_commit=False, session_timeout_ms=SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=500, request_timeout_ms=30_000, **config)


@pytest.mark.parametrize("assignor", [RoundRobinPartitionAssignor, StickyPartitionAssignor])
def test_two_members_share_partitions_then_one_leaves(gateway, topic_name, assignor):
    create_topic(gateway, topic_name, partitions=4)
    values = produce(gateway, topic_name, 40, 4)
    group = f"g-{uuid.uuid4().hex[:10]}"
    members = [group_consumer(gateway, group, partition_assignment_strategy=(assignor,),
                              client_id=f"kp{i}") for i in range(2)]
    for member in members:
        member.subscribe([topic_name])
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while len(set(seen)) < len(values) and time.monotonic() < deadline:
            for member in members:
                for records in member.poll(timeout_ms=100).values():
                    seen.extend(r.value.decode() for r in records)
                    member.commit()
        assert sorted(set(seen)) == sorted(values)
        all_partitions = {(topic_name, p) for p in range(4)}

        def both_hold_two() -> dict | None:
            for member in members:
                member.poll(timeout_ms=50)
            described = describe_group(gateway, group)
            sizes = sorted(len(m["partitions"]) for m in described["members"].values())
            return described if described["state"] == "Stable" and sizes == [2, 2] else None

        described = wait_for(both_hold_two, 30, "two members with two partitions", gateway)
        assert described["protocol"] == assignor.name
        assert committed_offsets(gateway, group) == {tp: (10, "") for tp in all_partitions}

        members.pop().close()  # LeaveGroup: the other member takes everything

        def survivor_holds_all() -> bool:
            members[0].poll(timeout_ms=100)
            return {(tp.topic, tp.partition) for tp in members[0].assignment()} == all_partitions

        wait_for(survivor_holds_all, 30, "the remaining member to hold every partition", gateway)
        stable_assignment(gateway, group, 1, all_partitions)
    finally:
        for member in members:
            member.close()


def test_commit_metadata_round_trips_and_assign_commits(gateway, topic_name):
    """assign()-based consumers commit with generation -1; the metadata string
    and leader epoch a client commits come back from OffsetFetch."""
    create_topic(gateway, topic_name, partitions=2)
    produce(gateway, topic_name, 10, 2)
    group = f"g-{uuid.uuid4().hex[:10]}"
    tp = TopicPartition(topic_name, 1)
    assigner = group_consumer(gateway, group)
    try:
        assigner.assign([tp])
        assigner.commit({tp: OffsetAndMetadata(4, "checkpoint-4", -1)})
        committed = assigner.committed(tp, metadata=True)
        assert (committed.offset, committed.metadata) == (4, "checkpoint-4")
    finally:
        assigner.close()
    reader = group_consumer(gateway, group)
    try:
        reader.assign([tp])
        first = wait_for(lambda: reader.poll(timeout_ms=200).get(tp), 30, "records", gateway)
        assert first[0].offset == 4, "a consumer starts from the committed offset"
    finally:
        reader.close()


def test_admin_group_apis(gateway, topic_name):
    create_topic(gateway, topic_name, partitions=2)
    other_topic = f"{topic_name}-other"
    create_topic(gateway, other_topic, partitions=1)
    produce(gateway, topic_name, 10, 2)
    group = f"g-{uuid.uuid4().hex[:10]}"
    admin = KafkaAdminClient(bootstrap_servers=gateway.bootstrap, request_timeout_ms=20_000)
    static = group_consumer(gateway, group, group_instance_id="kp-static")
    try:
        static.subscribe([topic_name])
        wait_for(lambda: static.poll(timeout_ms=100) is not None and static.assignment(), 30,
                 "an assignment", gateway)
        static.commit({TopicPartition(topic_name, 0): OffsetAndMetadata(2, "a", -1)})
        # Offsets of a topic the group does not subscribe to.
        static.commit({TopicPartition(other_topic, 0): OffsetAndMetadata(1, "b", -1)})

        listed = {g.group_id if hasattr(g, "group_id") else g["group_id"]: g
                  for g in admin.list_groups(states_filter=["Stable"])}
        assert group in listed
        described = admin.describe_groups([group])[group]
        assert described["group_state"] == "Stable"
        (member,) = described["members"]
        assert member["group_instance_id"] == "kp-static"

        offsets = admin.list_group_offsets({group: None})[group]
        assert {(tp.topic, tp.partition): (o.offset, o.metadata) for tp, o in offsets.items()} == {
            (topic_name, 0): (2, "a"), (other_topic, 0): (1, "b")}

        # OffsetDelete keeps subscribed topics' offsets and drops the others.
        results = admin.delete_group_offsets(group, [TopicPartition(topic_name, 0),
                                                     TopicPartition(other_topic, 0)])
        assert results[TopicPartition(topic_name, 0)] is GroupSubscribedToTopicError
        assert results[TopicPartition(other_topic, 0)] is NoError
        assert set(committed_offsets(gateway, group)) == {(topic_name, 0)}

        # Batched LeaveGroup (v3+) naming a static member by instance id alone.
        removed = admin.remove_group_members(
            group, [MemberToRemove(group_instance_id="kp-static")])
        assert list(removed.values()) == [NoError]
        wait_for(lambda: describe_group(gateway, group)["state"] == "Empty", 15,
                 "the group to empty", gateway)
    finally:
        static.close()
    try:
        assert admin.delete_groups([group]) == {group: "OK"}
        assert committed_offsets(gateway, group) == {}
    finally:
        admin.close()
