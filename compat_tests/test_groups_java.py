"""Consumer groups with the Java client, 3.4.1 and 4.x (``java_line_classes``):
two members split the partitions with the range and cooperative-sticky
assignors, commitSync and commitAsync, a new incarnation resumes at the
committed offsets; and the AdminClient's consumer-group calls. The 4.x
client's group.protocol=consumer (KIP-848), refused as Kafka 3.4 refuses it.
Programs: jvm/src/javaclient/GroupCheck.java and AdminCheck.java (groups)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from compat_helpers import create_topic
from group_helpers import committed_offsets, describe_group, group_gateway
from java_helpers import by_op, run_java, step

from testkit import jvm, routing

PARTITIONS = 4
PER_PARTITION = 10


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with group_gateway(tmp_path_factory.mktemp("groups-java") / "data") as gw:
        yield gw


def group_name() -> str:
    return f"g-{uuid.uuid4().hex[:10]}"


@pytest.mark.parametrize("assignor", ["range", "cooperative-sticky"])
def test_two_members_split_partitions_then_a_new_member_resumes(gateway, java_line_classes,
                                                                 topic_name, assignor):
    """Member a joins alone and holds all four partitions; b joins and they split
    them (eager range revokes everything first, cooperative-sticky only what
    moves). 40 records are then consumed exactly once: a commits with
    commitSync, b with commitAsync, every callback answered without error.
    A new member in a new JVM reads the committed offsets back and consumes
    exactly the four records produced after them."""
    create_topic(gateway, topic_name, partitions=PARTITIONS)
    group = group_name()
    args = ("--topic", topic_name, "--group", group, "--partitions", str(PARTITIONS))
    lines = run_java(gateway, java_line_classes, "GroupCheck", "split", *args,
                     "--assignor", assignor, "--per-partition", str(PER_PARTITION))
    split = step(lines, "split")
    if assignor == "range":  # range orders members by id, which starts with the client id
        assert split == {"a": [0, 1], "b": [2, 3]}
    else:
        assert len(split["a"]) == len(split["b"]) == 2
        assert sorted(split["a"] + split["b"]) == list(range(PARTITIONS))

    members = {line["name"]: line for line in by_op(lines)["member"]}
    a, b = members["a"], members["b"]
    assert (a["held"], b["held"]) == (split["a"], split["b"])
    # Callbacks with partitions in them (cooperative rebalances also call
    # onPartitionsAssigned with none, once per generation).
    events = {name: [e for e in m["events"] if e[1]] for name, m in members.items()}
    everything = list(range(PARTITIONS))
    if assignor == "range":
        assert events["a"] == [["assigned", everything], ["revoked", everything],
                               ["assigned", split["a"]]]
    else:
        assert events["a"] == [["assigned", everything], ["revoked", split["b"]]]
    assert events["b"] == [["assigned", split["b"]]]

    # Each member consumed exactly its partitions' records, once each, in order.
    for m in (a, b):
        for partition in m["held"]:
            got = [(offset, value) for p, offset, value in m["consumed"] if p == partition]
            assert got == [(i // PARTITIONS, f"v{i}")
                           for i in range(partition, PARTITIONS * PER_PARTITION, PARTITIONS)]
        assert len(m["consumed"]) == 2 * PER_PARTITION
    commits = step(lines, "commit_async")
    assert commits["sent"] == commits["completed"] >= 1
    assert commits["errors"] == []

    lines = run_java(gateway, java_line_classes, "GroupCheck", "resume", *args)
    assert step(lines, "committed")["offsets"] == {
        str(p): [PER_PARTITION, ""] for p in range(PARTITIONS)}
    c = step(lines, "member")
    assert c["held"] == everything
    assert sorted(c["consumed"]) == [[p, PER_PARTITION, f"late-{p}"] for p in everything]
    assert committed_offsets(gateway, group) == {
        (topic_name, p): (PER_PARTITION + 1, "") for p in everything}
    assert describe_group(gateway, group)["state"] == "Empty"


def test_consumer_group_admin(gateway, java_line_classes, topic_name):
    """listConsumerGroups (with a state filter), describeConsumerGroups,
    listConsumerGroupOffsets, alterConsumerGroupOffsets, deleteConsumerGroupOffsets
    and deleteConsumerGroups, on a group with a subscribed member and on one
    known only by the offsets an assign()-ing consumer committed."""
    group, standalone = group_name(), group_name()
    lines = run_java(gateway, java_line_classes, "AdminCheck", "groups", "--topic", topic_name,
                     "--group", group, "--standalone", standalone)
    ops = by_op(lines)

    def failed(op: str) -> str:
        result = step(lines, op)
        assert result["ok"] is False, result
        return result["error"]

    assert step(lines, "member_consumed") == {"count": 10}
    assert step(lines, "list_groups") == {
        "groups": {group: ["STABLE", False], standalone: ["EMPTY", True]}}
    assert step(lines, "list_empty_groups") == {"groups": {standalone: ["EMPTY", True]}}

    described = {(d["group"], d["state"]): d for d in ops["describe_group"]}
    # The group's coordinator as FindCoordinator names it: the gateway (node
    # 0), or on a cluster the one of its three the group's slot is placed on.
    coordinator, _, _ = asyncio.run(asyncio.wait_for(
        routing.coordinator_of(gateway.host_port, group), 30))
    assert coordinator in gateway.nodes()
    assert described[(group, "STABLE")] == {
        "op": "describe_group", "group": group, "state": "STABLE", "simple": False,
        "assignor": "range", "coordinator": coordinator,
        "members": [{"client_id": f"member-{group}", "host": "/127.0.0.1",
                     "member_id_prefix": True, "instance": None,
                     "assignment": [[topic_name, 0], [topic_name, 1]]}]}
    assert described[(standalone, "EMPTY")]["members"] == []
    assert described[(standalone, "EMPTY")]["simple"] is True
    assert described[(group, "EMPTY")]["members"] == []  # after the member closed
    assert described[(group, "DEAD")]["members"] == []  # after deleteConsumerGroups

    offsets = [(o["group"], o["offsets"]) for o in ops["group_offsets"]]
    p0, p1 = f"{topic_name}-0", f"{topic_name}-1"
    assert offsets == [
        (group, {p0: [5, "m-0"], p1: [5, "m-1"]}),
        (standalone, {p0: [3, "manual"]}),
        (standalone, {p0: [3, "manual"], p1: [7, ""]}),  # after alterConsumerGroupOffsets
        (standalone, {p1: [7, ""]}),  # after deleteConsumerGroupOffsets
        (group, {}),  # after deleteConsumerGroups
    ]
    # An active group's offsets belong to its members (UNKNOWN_MEMBER_ID, as Kafka).
    assert failed("alter_active") == "UnknownMemberIdException"
    assert step(lines, "alter_standalone") == {"ok": True}
    assert failed("delete_offsets_subscribed") == "GroupSubscribedToTopicException"
    assert step(lines, "delete_offsets_standalone") == {"ok": True}
    assert failed("delete_active") == "GroupNotEmptyException"
    assert step(lines, "delete_both") == {"ok": True}
    assert step(lines, "list_after_delete") == {"groups": {}}
    assert failed("delete_again") == "GroupIdNotFoundException"
    assert committed_offsets(gateway, standalone) == {}


@pytest.fixture(scope="module")
def java4_classes():
    """The programs compiled against the 4.x client only (compat_tests/jvm/kafka4)."""
    return jvm.compile_java(pom=jvm.KAFKA4_POM)


def test_consumer_group_protocol_is_refused_as_kafka_3_4_refuses_it(gateway, kafka_broker,
                                                                    java4_classes, topic_name):
    """A 4.x consumer with group.protocol=consumer (KIP-848) needs
    ConsumerGroupHeartbeat (API key 68), which neither the gateway nor Kafka 3.4
    lists in ApiVersions: the client never sends it, fails the member, and its
    poll() throws UnsupportedVersionException saying to set
    group.protocol=classic. The same on both, within seconds, nothing polled."""
    runs = {}
    for name, broker in (("gateway", gateway), ("kafka", kafka_broker)):
        create_topic(broker, topic_name, partitions=1)
        runs[name] = step(run_java(broker, java4_classes, "GroupCheck", "consumer-protocol",
                                   "--topic", topic_name, "--group", group_name()),
                          "consumer_protocol")
        # How long the client took to give up (the program polls for 60 s at most).
        print(f"{name}: refused after {runs[name].pop('seconds'):.1f} s")
    assert runs["gateway"] == runs["kafka"] == {
        "ok": False, "polled": 0, "error": "UnsupportedVersionException",
        "message": "The cluster does not support the new CONSUMER group protocol. Set "
                   "group.protocol=classic on the consumer configs to revert to the CLASSIC "
                   "protocol until the cluster is upgraded.",
        "causes": ["UnsupportedVersionException: The node does not support "
                   "CONSUMER_GROUP_HEARTBEAT"]}
