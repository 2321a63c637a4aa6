"""Consumer groups with kafka-python (3.0): subscribe and share partitions,
rebalance on leave, commit with metadata, assign()-based commits, static
members, and the group admin APIs (ListGroups, DescribeGroups, OffsetFetch,
OffsetDelete, batched LeaveGroup, DeleteGroups)."""

from __future__ import annotations

import threading
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
from kafka.structs import MemberState, OffsetAndMetadata


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


POLL_MS = 1000  # PolledMember's poll(): returns at once with records


class PolledMember:
    """One group member polled from a thread of its own, as an application
    polls its consumer: records read go to ``seen``, and their offsets are
    committed after each batch.

    Why not poll the members in turn from the test's thread: kafka-python
    (3.0.12, and its main branch as of 2026-11) drops a JoinGroup/SyncGroup
    that completes while none of its poll() calls awaits it, and joins again
    at the next poll(). The leader's JoinGroup in a Stable group starts a new
    rebalance (Kafka's rule, which the gateway follows;
    ``test_leader_join_completed_outside_poll_starts_a_rebalance``), and that
    rebalance ends when the other member rejoins, inside the other member's
    poll(): outside the leader's again. Polled in turn, two members can loop
    so for minutes, the leader never holding a partition (issue 22's flake,
    on either store).

    Polled from its own thread, a member is in poll() when its join
    completes, unless that falls in the instant between two poll() calls;
    each waits up to POLL_MS, so such instants are rare, and the one extra
    rebalance such a miss starts ends in the members' poll() calls. A miss
    of a join that kafka-python started because its topic metadata changed
    (``need_rejoin``'s snapshots) would leave the member unjoined for good
    (it does not join again): members learn the topic's partitions before
    they join, so the leader's first assignment covers them."""

    def __init__(self, consumer: KafkaConsumer, seen: list[str]) -> None:
        self.consumer = consumer
        self.seen = seen
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"poll-{consumer.config['client_id']}")
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for records in self.consumer.poll(timeout_ms=POLL_MS).values():
                    self.seen.extend(r.value.decode() for r in records)  # list.extend: atomic
                    self.consumer.commit()
        except BaseException as exc:  # the test's thread raises it (check)
            self.error = exc

    def check(self) -> None:
        """Raise what the member's thread failed with, if it failed."""
        if self.error is not None:
            raise AssertionError(f"{self._thread.name} failed") from self.error

    def assignment(self) -> set[tuple[str, int]]:
        return {(tp.topic, tp.partition) for tp in self.consumer.assignment()}

    def halt(self) -> None:
        """Stop polling (the consumer stays open)."""
        self._stop.set()
        self._thread.join(timeout=30)
        assert not self._thread.is_alive(), f"{self._thread.name} did not stop in 30 s"

    def close(self) -> None:
        """Stop polling, close the consumer (LeaveGroup); raise what the thread failed with."""
        self.halt()
        self.consumer.close()
        self.check()


@pytest.mark.parametrize("assignor", [RoundRobinPartitionAssignor, StickyPartitionAssignor])
def test_two_members_share_partitions_then_one_leaves(gateway, topic_name, assignor):
    create_topic(gateway, topic_name, partitions=4)
    values = produce(gateway, topic_name, 40, 4)
    group = f"g-{uuid.uuid4().hex[:10]}"
    consumers = [group_consumer(gateway, group, partition_assignment_strategy=(assignor,),
                                client_id=f"kp{i}") for i in range(2)]
    for consumer in consumers:
        # The leader's first assignment then covers the topic (PolledMember).
        assert consumer.partitions_for_topic(topic_name) == {0, 1, 2, 3}
        consumer.subscribe([topic_name])
    seen: list[str] = []
    members: list[PolledMember] = []
    try:
        members.extend(PolledMember(consumer, seen) for consumer in consumers)

        deadline = time.monotonic() + 60
        while len(set(seen)) < len(values) and time.monotonic() < deadline:
            for member in members:
                member.check()
            time.sleep(0.1)
        assert sorted(set(seen)) == sorted(values)
        all_partitions = {(topic_name, p) for p in range(4)}

        def both_hold_two() -> dict | None:
            for member in members:
                member.check()
            described = describe_group(gateway, group)
            sizes = sorted(len(m["partitions"]) for m in described["members"].values())
            return described if described["state"] == "Stable" and sizes == [2, 2] else None

        described = wait_for(both_hold_two, 30, "two members with two partitions", gateway)
        assert described["protocol"] == assignor.name
        assert committed_offsets(gateway, group) == {tp: (10, "") for tp in all_partitions}

        members.pop().close()  # LeaveGroup: the other member takes everything

        def survivor_holds_all() -> bool:
            members[0].check()
            return members[0].assignment() == all_partitions

        wait_for(survivor_holds_all, 30, "the remaining member to hold every partition", gateway)
        stable_assignment(gateway, group, 1, all_partitions)
    finally:
        for member in members:
            member.halt()
        for consumer in consumers:
            consumer.close()
    for member in members:
        member.check()


def test_leader_join_completed_outside_poll_starts_a_rebalance(gateway, topic_name):
    """What ``PolledMember`` avoids, step by step with one member: a
    kafka-python JoinGroup/SyncGroup that completes while no poll() awaits it
    is dropped, and the next poll() sends JoinGroup again; from the group's
    leader, in a Stable group, that starts a new generation. Kafka 3.4's
    GroupCoordinator does the same ("force a rebalance if the leader sends
    JoinGroup"), and so does the gateway."""
    create_topic(gateway, topic_name, partitions=1)
    group = f"g-{uuid.uuid4().hex[:10]}"
    member = group_consumer(gateway, group, client_id="kp-leader")
    try:
        member.subscribe([topic_name])

        def joining() -> bool:
            """poll(0) returns at once: once the JoinGroup with the member id
            (after MEMBER_ID_REQUIRED) is under way, no poll() runs until the
            group answers it, after its initial delay (INITIAL_DELAY_MS)."""
            member.poll(timeout_ms=0)
            meta = member.group_metadata()
            return bool(meta.member_id) and meta.state == MemberState.REBALANCING

        wait_for(joining, 30, "the JoinGroup", gateway, interval=0.01)
        # It completes with no poll() running: kafka-python's IO thread sends
        # the SyncGroup by itself and the group is Stable in generation 1.
        wait_for(lambda: describe_group(gateway, group)["state"] == "Stable", 30,
                 "generation 1 stable", gateway)
        # kafka-python's own task (internal): done once the SyncGroup is
        # answered; None if a poll() took its answer (the premise below fails).
        wait_for(lambda: (task := member._coordinator._join_task) is None or task.is_done, 30,
                 "the join's end")
        joined = member.group_metadata()
        assert (joined.generation_id, joined.state) == (1, MemberState.REBALANCING), (
            "premise: the join completed outside poll(), so the member did not take it")
        assert not member.assignment()

        member.poll(timeout_ms=0)  # drops that answer: JoinGroup again, a rebalance
        wait_for(lambda: member.group_metadata().generation_id > 1, 30,
                 "a generation after the leader's JoinGroup", gateway)
        # Polled until it takes an answer, the member holds its partition.
        wait_for(lambda: member.poll(timeout_ms=200) is not None and member.assignment(), 30,
                 "the member to hold its partition", gateway)
        stable_assignment(gateway, group, 1, {(topic_name, 0)})
    finally:
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
