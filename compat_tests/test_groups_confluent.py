"""Consumer groups with confluent-kafka (librdkafka): assignors, rebalances on
join/leave/crash without loss, static membership, offsets across kill -9,
and the group admin APIs."""

from __future__ import annotations

import signal
import subprocess
import time
import uuid

import pytest
from compat_helpers import create_topic
from confluent_kafka import (
    Consumer,
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    KafkaError,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from group_helpers import (
    PYTHON,
    SESSION_TIMEOUT_MS,
    WORKER,
    committed_offsets,
    describe_group,
    group_gateway,
    stable_assignment,
    wait_for,
)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with group_gateway(tmp_path_factory.mktemp("groups") / "data") as gw:
        yield gw


def group_name() -> str:
    return f"g-{uuid.uuid4().hex[:10]}"


def produce(gateway, topic: str, values: list[str], partitions: int) -> None:
    producer = Producer({"bootstrap.servers": gateway.bootstrap, "linger.ms": 5})
    for index, value in enumerate(values):
        producer.produce(topic, value.encode(), partition=index % partitions)
    assert producer.flush(30) == 0


def consumer(gateway, group: str, **overrides) -> Consumer:
    settings = {
        "bootstrap.servers": gateway.bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "session.timeout.ms": SESSION_TIMEOUT_MS,
        "heartbeat.interval.ms": 500,
    }
    settings.update(overrides)
    return Consumer(settings)


@pytest.mark.parametrize("assignor", ["range", "roundrobin", "cooperative-sticky"])
def test_three_consumers_share_six_partitions(gateway, topic_name, assignor):
    create_topic(gateway, topic_name, partitions=6)
    values = [f"v{i}" for i in range(120)]
    produce(gateway, topic_name, values, 6)
    group = group_name()
    consumers = [consumer(gateway, group, **{"partition.assignment.strategy": assignor,
                                             "client.id": f"c{i}"}) for i in range(3)]
    for each in consumers:
        each.subscribe([topic_name])
    seen: list[str] = []
    owners: dict[int, set[int]] = {}  # partition -> consumers that delivered from it
    described = None
    deadline = time.monotonic() + 60
    try:
        while (len(set(seen)) < len(values) or described is None) and time.monotonic() < deadline:
            for index, each in enumerate(consumers):
                message = each.poll(0.05)
                if message is None or message.error():
                    continue
                seen.append(message.value().decode())
                owners.setdefault(message.partition(), set()).add(index)
                each.commit(message, asynchronous=False)
            if described is None and all(c.assignment() for c in consumers):
                current = describe_group(gateway, group)
                held = sorted(p for m in current["members"].values() for p in m["partitions"])
                if current["state"] == "Stable" and len(current["members"]) == 3 and held == [
                        (topic_name, p) for p in range(6)]:
                    described = current
        assert sorted(set(seen)) == sorted(values), "every message is consumed"
        assert described is not None, "the group settles with three members"
        assert described["protocol"] == assignor
        assert sorted(len(m["partitions"]) for m in described["members"].values()) == [2, 2, 2]
        # Each consumer holds what the gateway says it was assigned.
        by_client = {m["client_id"]: m["partitions"] for m in described["members"].values()}
        for index, each in enumerate(consumers):
            held = {(tp.topic, tp.partition) for tp in each.assignment()}
            assert held == by_client[f"c{index}"]
        assert committed_offsets(gateway, group) == {
            (topic_name, p): (20, "") for p in range(6)
        }
    finally:
        for each in consumers:
            each.close()
    wait_for(lambda: describe_group(gateway, group)["state"] == "Empty", 15,
             "the group to be empty after every member left", gateway)


class Worker:
    """A group member in a subprocess (compat_tests/group_worker.py)."""

    def __init__(self, gateway, group: str, topic: str, tmp_path, name: str,
                 session_timeout_ms: int) -> None:
        self.output = tmp_path / name
        self.output.touch()
        self.process = subprocess.Popen(
            [PYTHON, str(WORKER), gateway.bootstrap, group, topic, str(self.output),
             str(session_timeout_ms)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def processed(self) -> list[str]:
        return self.output.read_text().split()

    def stop(self, sig: int) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def test_join_leave_and_crash_move_partitions_without_loss(gateway, topic_name, tmp_path):
    """Members join, one leaves (LeaveGroup), one is killed (no LeaveGroup);
    with commit-after-process every message is processed at least once."""
    session_ms = 10_000
    create_topic(gateway, topic_name, partitions=6)
    all_partitions = {(topic_name, p) for p in range(6)}
    group = group_name()
    workers: list[Worker] = []
    sent: list[str] = []

    def send(batch: str) -> None:
        values = [f"{batch}{i}" for i in range(60)]
        produce(gateway, topic_name, values, 6)
        sent.extend(values)

    def start(name: str) -> Worker:
        worker = Worker(gateway, group, topic_name, tmp_path, name, session_ms)
        workers.append(worker)
        return worker

    try:
        first = start("w1")
        stable_assignment(gateway, group, 1, all_partitions)
        send("a")
        second = start("w2")
        stable_assignment(gateway, group, 2, all_partitions)
        third = start("w3")
        stable_assignment(gateway, group, 3, all_partitions)
        send("b")

        left_at = time.monotonic()
        third.stop(signal.SIGTERM)  # close(): LeaveGroup
        stable_assignment(gateway, group, 2, all_partitions)
        # LeaveGroup rebalances at once; without it this would take a session timeout.
        assert time.monotonic() - left_at < session_ms / 1000
        send("c")

        crashed_at = time.monotonic()
        first.stop(signal.SIGKILL)  # a crash: no LeaveGroup, no commit
        described = stable_assignment(gateway, group, 1, all_partitions,
                                      timeout=session_ms / 1000 + 20)
        moved_after = time.monotonic() - crashed_at
        survivor = next(iter(described["members"].values()))
        assert survivor["client_id"] == "worker-w2"
        send("d")

        def everything_processed() -> bool:
            return set(sent) <= {v for w in workers for v in w.processed()}

        wait_for(everything_processed, 60, "every message to be processed", gateway, 0.3)
        wait_for(lambda: committed_offsets(gateway, group) == {
            tp: (40, "") for tp in all_partitions}, 30, "the survivor's commits", gateway)
        # The dead member's partitions moved once its session expired, not later.
        assert moved_after < session_ms / 1000 + 15
        assert second.process.poll() is None
    finally:
        for worker in workers:
            worker.stop(signal.SIGTERM)


def test_static_member_restart_keeps_its_assignment(gateway, topic_name):
    create_topic(gateway, topic_name, partitions=4)
    all_partitions = {(topic_name, p) for p in range(4)}
    group = group_name()
    rebalances_seen_by_b: list[str] = []
    errors: list[KafkaError] = []

    def static(instance: str, **extra) -> Consumer:
        return consumer(gateway, group, **{"group.instance.id": instance,
                                           "session.timeout.ms": 10_000,
                                           "partition.assignment.strategy": "range",
                                           "client.id": instance}, **extra)

    a = static("a")
    b = static("b", error_cb=errors.append)
    a.subscribe([topic_name])
    b.subscribe([topic_name], on_assign=lambda c, p: rebalances_seen_by_b.append("assign"),
                on_revoke=lambda c, p: rebalances_seen_by_b.append("revoke"))

    def poll_all(*consumers: Consumer) -> None:
        for each in consumers:
            message = each.poll(0.05)
            if message is not None and message.error():
                errors.append(message.error())

    def settled(*consumers: Consumer) -> dict | None:
        poll_all(*consumers)
        described = describe_group(gateway, group)
        held = sorted(p for m in described["members"].values() for p in m["partitions"])
        if (described["state"] == "Stable" and len(described["members"]) == 2
                and held == sorted(all_partitions) and all(c.assignment() for c in consumers)):
            return described
        return None

    before = wait_for(lambda: settled(a, b), 30, "two static members", gateway)
    by_instance = {m["instance"]: (mid, m["partitions"]) for mid, m in before["members"].items()}
    assert set(by_instance) == {"a", "b"}
    assert rebalances_seen_by_b == ["assign"]

    a.close()  # a static member does not leave on close: its slot waits for it
    assert len(describe_group(gateway, group)["members"]) == 2
    restarted = static("a")
    restarted.subscribe([topic_name])
    after = wait_for(lambda: settled(restarted, b), 30, "the static member back", gateway)
    again = {m["instance"]: (mid, m["partitions"]) for mid, m in after["members"].items()}
    assert again["a"][1] == by_instance["a"][1], "same partitions as before the restart"
    assert again["a"][0] != by_instance["a"][0], "a new member id for the new incarnation"
    assert again["b"] == by_instance["b"]
    assert {(tp.topic, tp.partition) for tp in restarted.assignment()} == by_instance["a"][1]
    for _ in range(20):  # b keeps heartbeating: still no rebalance
        poll_all(restarted, b)
    assert rebalances_seen_by_b == ["assign"], "the other member saw no rebalance"

    # A second process with b's instance id fences the first one.
    duplicate = static("b")
    duplicate.subscribe([topic_name])
    try:
        def fenced() -> bool:
            poll_all(restarted, b, duplicate)
            # librdkafka reports it as a fatal error naming the cause.
            return any(e.code() in (KafkaError.FENCED_INSTANCE_ID, KafkaError._FATAL)
                       and "fenced" in e.str().lower() for e in errors)

        wait_for(fenced, 30, "FENCED_INSTANCE_ID for the duplicate instance id", gateway)
    finally:
        for each in (restarted, duplicate):
            each.close()
        b.close()


def stored_offsets(gateway, group: str) -> dict[tuple[str, int], tuple[int, str]]:
    # librdkafka sends a metadata string with its C terminator; Kafka stores
    # the bytes it is sent, and so does the gateway.
    return {tp: (offset, metadata.removesuffix("\x00"))
            for tp, (offset, metadata) in committed_offsets(gateway, group).items()}


def test_commit_survives_kill_9_and_consumer_resumes(tmp_path, topic_name):
    """Commit, kill -9 the gateway, restart: the group resumes exactly at its
    committed offsets, metadata included."""
    with group_gateway(tmp_path / "data") as gw:
        create_topic(gw, topic_name, partitions=3)
        values = [f"v{i}" for i in range(90)]
        produce(gw, topic_name, values, 3)
        group = group_name()
        first = consumer(gw, group)
        first.subscribe([topic_name])
        consumed: list[tuple[int, int, str]] = []
        deadline = time.monotonic() + 30
        while len(consumed) < 45 and time.monotonic() < deadline:
            message = first.poll(0.1)
            if message is None or message.error():
                continue
            consumed.append((message.partition(), message.offset(), message.value().decode()))
            first.commit(offsets=[TopicPartition(topic_name, message.partition(),
                                                 message.offset() + 1,
                                                 metadata=f"after-{message.offset()}")],
                         asynchronous=False)
        assert len(consumed) == 45
        expected = {}
        for partition, offset, _ in consumed:
            expected[(topic_name, partition)] = (offset + 1, f"after-{offset}")
        assert stored_offsets(gw, group) == expected
        first.close()

        gw.kill()  # kill -9: no shutdown, no flush
        gw.start()

        assert stored_offsets(gw, group) == expected
        second = consumer(gw, group)
        second.subscribe([topic_name])
        try:
            resumed: list[tuple[int, int, str]] = []
            deadline = time.monotonic() + 30
            while len(resumed) < 45 and time.monotonic() < deadline:
                message = second.poll(0.1)
                if message is not None and not message.error():
                    resumed.append((message.partition(), message.offset(),
                                    message.value().decode()))
            assert sorted(v for *_, v in consumed + resumed) == sorted(values), (
                "the two sessions together read every message exactly once")
            for partition in range(3):
                first_offset = min((o for p, o, _ in resumed if p == partition), default=None)
                committed_offset = expected.get((topic_name, partition), (0, ""))[0]
                if first_offset is not None:
                    assert first_offset == committed_offset
            # The metadata the client committed comes back through its own API.
            committed = second.committed([TopicPartition(topic_name, p) for p in range(3)],
                                         timeout=10)
            for tp in committed:
                if (topic_name, tp.partition) in expected:
                    assert (tp.offset, tp.metadata) == expected[(topic_name, tp.partition)]
        finally:
            second.close()


def test_admin_client_group_apis(gateway, topic_name):
    """ListGroups (state filter), DescribeGroups, OffsetFetch, OffsetCommit via
    the admin client (generation -1), DeleteGroups; assign()-based commits."""
    create_topic(gateway, topic_name, partitions=2)
    produce(gateway, topic_name, [f"v{i}" for i in range(10)], 2)
    admin = AdminClient({"bootstrap.servers": gateway.bootstrap})
    active, standalone = group_name(), group_name()

    member = consumer(gateway, active)
    member.subscribe([topic_name])
    wait_for(lambda: member.poll(0.1) is not None and bool(member.assignment()), 30,
             "an assignment", gateway)
    # A consumer that assigns partitions itself commits with generation -1.
    assigner = consumer(gateway, standalone)
    assigner.assign([TopicPartition(topic_name, 0, 0)])
    assigner.commit(offsets=[TopicPartition(topic_name, 0, 3, metadata="manual")],
                    asynchronous=False)
    assigner.close()
    try:
        listed = admin.list_consumer_groups(request_timeout=10).result()
        states = {g.group_id: g.state for g in listed.valid}
        assert states[active] == ConsumerGroupState.STABLE
        assert states[standalone] == ConsumerGroupState.EMPTY
        only_empty = admin.list_consumer_groups(
            states={ConsumerGroupState.EMPTY}, request_timeout=10).result()
        assert standalone in {g.group_id for g in only_empty.valid}
        assert active not in {g.group_id for g in only_empty.valid}

        description = admin.describe_consumer_groups([active], request_timeout=10)[active].result()
        assert description.state == ConsumerGroupState.STABLE
        assert description.partition_assignor == "range"
        assert [{(tp.topic, tp.partition) for tp in m.assignment.topic_partitions}
                for m in description.members] == [{(topic_name, 0), (topic_name, 1)}]
        assert [m.host for m in description.members] == ["/127.0.0.1"]  # as Kafka shows it

        request = ConsumerGroupTopicPartitions(standalone, [TopicPartition(topic_name, 0)])
        fetched = admin.list_consumer_group_offsets([request])[standalone].result()
        assert [(tp.offset, tp.metadata) for tp in fetched.topic_partitions] == [(3, "manual")]
        altered = ConsumerGroupTopicPartitions(standalone, [TopicPartition(topic_name, 1, 7)])
        admin.alter_consumer_group_offsets([altered])[standalone].result()
        assert stored_offsets(gateway, standalone) == {
            (topic_name, 0): (3, "manual"), (topic_name, 1): (7, "")}

        busy = admin.delete_consumer_groups([active], request_timeout=10)[active]
        with pytest.raises(Exception, match=r"NON_EMPTY_GROUP|not empty"):
            busy.result()
        admin.delete_consumer_groups([standalone], request_timeout=10)[standalone].result()
        assert committed_offsets(gateway, standalone) == {}
        assert describe_group(gateway, standalone)["state"] == "Dead"
    finally:
        member.close()
