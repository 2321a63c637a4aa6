"""An open transaction whose coordinator gateway is killed (issue 22,
"Coordinators": it survives its coordinator's death and can still be
committed or aborted; its timeout keeps running), with confluent-kafka on
three gateways over one PostgreSQL (``test_pg_cluster_faults``' fixtures).

The premise of both tests, asserted: before the kill, node 3 coordinates
the transactional ids AND leads the partition their transactions wrote to,
so the kill takes both away and what is tested is the new coordinator's
part: it reads the open transactions of the slots it gains (state,
partitions, pending batches) before answering for them, then commits,
aborts or times them out. A commit through a new coordinator that does not
lead the partition it publishes into is a cross-gateway publication, which
another piece of issue 22 covers (the leader's epoch and its notices,
branch pgnotify); so the commit test commits each transaction whose new
coordinator is the partition's new leader and aborts the others, through
their new coordinators. One transactional id per coordinator slot node 3
holds: the survivors share its slots (counts within one), so each of them
coordinates some, and both a commit and an abort happen, whoever takes the
partition.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from test_pg_cluster_faults import (
    TIMEOUT,
    Acks,
    Cluster,
    coordinator_of,
    create,
    read_log,
    wait_balanced,
)

from pgstore.leadership import coordinator_slot
from testkit import postgres
from testkit.postgres import PostgresServer

pg_server = postgres.server_fixture("module")


@pytest.fixture(name="cluster")
def cluster_fixture(pg_server: PostgresServer, tmp_path: Path) -> Iterator[Cluster]:
    found = Cluster(pg_server, tmp_path)
    try:
        found.start()
        yield found
    finally:
        found.stop()


VICTIM = 3


def txn_ids_of(cluster: Cluster, node: int, prefix: str, count: int | None = None) -> list[str]:
    """One transactional id per coordinator slot ``node`` holds (the first
    ``count`` slots), by Kafka's placement; FindCoordinator agrees."""
    slots = sorted(row["slot"] for row in cluster.db(
        "SELECT slot FROM kafka_gateway.coordinator_slots WHERE leader_node = $1", node))
    assert slots, f"node {node} holds no coordinator slot"
    chosen: dict[int, str] = {}
    index = 0
    while len(chosen) < len(slots):
        candidate = f"{prefix}-{index}"
        index += 1
        slot = coordinator_slot(candidate)
        if slot in slots and slot not in chosen:
            chosen[slot] = candidate
    ids = [chosen[slot] for slot in slots][:count]
    for transactional_id in ids[:2]:
        assert coordinator_of(cluster.node(1), transactional_id) == node
    return ids


def open_txns(cluster: Cluster, topic: str, prefix: str, timeout_ms: int,
              count: int | None = None) -> tuple[int, dict[str, tuple[Producer, list[bytes]]]]:
    """Transactions of ids node 3 coordinates, each open with records in one
    partition node 3 leads: (that partition, id -> (producer, values))."""
    _, parts = wait_balanced(cluster.gateways, topic, {1, 2, 3})
    mine = sorted(p for p, leader in parts.items() if leader == VICTIM)
    assert mine, parts
    partition = mine[0]
    opened = {}
    for transactional_id in txn_ids_of(cluster, VICTIM, prefix, count):
        producer = Producer({"bootstrap.servers": cluster.bootstrap(1, 2),
                             "transactional.id": transactional_id, "linger.ms": 5,
                             "transaction.timeout.ms": timeout_ms,
                             "message.timeout.ms": min(timeout_ms, 60_000)})
        producer.init_transactions(TIMEOUT)
        producer.begin_transaction()
        values = [b"%s-%d" % (transactional_id.encode(), i) for i in range(5)]
        acks = Acks()
        for value in values:
            producer.produce(topic, value, partition=partition, on_delivery=acks.delivered)
        assert producer.flush(TIMEOUT) == 0
        assert acks.failed == [] and acks.acked == values, acks.failed[:3]
        opened[transactional_id] = (producer, values)
    # The premise: node 3 coordinates them and leads their partition.
    assert cluster.leaders_in_db(topic)[partition] == VICTIM
    return partition, opened


def kill_victim(cluster: Cluster) -> float:
    cluster.node(VICTIM).kill()
    killed_at = time.monotonic()
    process = cluster.node(VICTIM).process
    assert process is not None and process.poll() is not None
    return killed_at


def wait_opened(cluster: Cluster, node: int, topic: str, partition: int,
                since: float) -> None:
    """Until ``node`` has opened the partition it took (its ListOffsets
    answers rather than NOT_LEADER_OR_FOLLOWER): the failover is over."""
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap(node), "group.id": "probe"})
    try:
        while True:
            assert time.monotonic() - since < TIMEOUT, f"{topic}-{partition} not opened"
            try:
                consumer.get_watermark_offsets(TopicPartition(topic, partition), 5)
                return
            except KafkaException:
                time.sleep(0.05)
    finally:
        consumer.close()


def stored_state(cluster: Cluster, transactional_id: str) -> str | None:
    rows = cluster.db("SELECT state FROM kafka_gateway.txn_states "
                      "WHERE transactional_id = $1", transactional_id)
    return str(json.loads(bytes(rows[0]["state"]))["state"]) if rows else None


def test_an_open_transaction_is_committed_through_the_new_coordinator(
        cluster: Cluster) -> None:
    topic = "faults-coordinator"
    create(cluster.node(1), topic)
    partition, opened = open_txns(cluster, topic, "faults-commit", 120_000)
    assert len(opened) >= 8  # node 3's share of the 50 slots

    killed_at = kill_victim(cluster)
    # The partition's new leader, and each id's new coordinator, as
    # FindCoordinator says once the survivors took node 3's rows.
    leader = None
    while leader not in (1, 2):
        assert time.monotonic() - killed_at < TIMEOUT, "node 3's partition not taken over"
        leader = cluster.leaders_in_db(topic)[partition]
        time.sleep(0.05)
    wait_opened(cluster, leader, topic, partition, killed_at)
    first = next(iter(opened))
    new = {}
    for transactional_id in [first, *[t for t in opened if t != first]]:
        while new.get(transactional_id) not in (1, 2):
            assert time.monotonic() - killed_at < TIMEOUT, f"{transactional_id}: no coordinator"
            try:
                new[transactional_id] = coordinator_of(cluster.node(1), transactional_id)
            except AssertionError:  # COORDINATOR_NOT_AVAILABLE until a survivor takes it
                time.sleep(0.05)
    to_commit = [t for t in opened if new[t] == leader]
    to_abort = [t for t in opened if new[t] != leader]
    assert to_commit and to_abort, (leader, new)  # both survivors took some of node 3's slots

    failover_seen = time.monotonic() - killed_at
    first_commit = None
    for transactional_id in to_commit:
        opened[transactional_id][0].commit_transaction(TIMEOUT)
        if first_commit is None:
            first_commit = time.monotonic() - killed_at
    for transactional_id in to_abort:
        opened[transactional_id][0].abort_transaction(TIMEOUT)
    print(f"coordinator killed: {len(to_commit)} open transactions committed through node "
          f"{leader}, the first {first_commit:.2f} s after the kill (the test saw the new "
          f"coordinators {failover_seen:.2f} s after it); {len(to_abort)} aborted through "
          f"node {3 - leader}")
    for transactional_id in opened:
        assert stored_state(cluster, transactional_id) == (
            "CompleteCommit" if transactional_id in to_commit else "CompleteAbort")

    log = read_log(cluster.bootstrap(1, 2), topic, "read_committed")
    got = [v for _, v in log[partition]]
    expected = [v for t in to_commit for v in opened[t][1]]
    assert sorted(got) == sorted(expected)
    assert [v for p, records in log.items() if p != partition for _, v in records] == []
    # Each producer goes on with a new transaction through its new coordinator.
    producer, _ = opened[to_commit[0]]
    producer.begin_transaction()
    producer.produce(topic, b"after", partition=partition)
    producer.commit_transaction(TIMEOUT)
    log = read_log(cluster.bootstrap(1, 2), topic, "read_committed")
    assert b"after" in [v for _, v in log[partition]]


def test_an_open_transaction_still_times_out_after_its_coordinator_died(
        cluster: Cluster) -> None:
    """Its timeout runs from its persisted start: the new coordinator aborts
    it (an abort publishes nothing, so whoever leads the partition now)."""
    topic = "faults-coordinator-timeout"
    create(cluster.node(1), topic)
    timeout_ms = 8000
    _, opened = open_txns(cluster, topic, "faults-timeout", timeout_ms, count=1)
    ((transactional_id, (producer, _)),) = opened.items()
    began = time.monotonic()
    killed_at = kill_victim(cluster)
    deadline = time.monotonic() + TIMEOUT
    state = None
    while state != "CompleteAbort":
        state = stored_state(cluster, transactional_id)
        assert time.monotonic() < deadline, f"still {state} {TIMEOUT} s after the kill"
        time.sleep(0.2)
    aborted = time.monotonic()
    print(f"coordinator killed: the open transaction timed out on a survivor "
          f"{aborted - killed_at:.2f} s after the kill, {aborted - began:.2f} s after its "
          f"last record (transaction.timeout.ms {timeout_ms})")
    try:
        producer.commit_transaction(TIMEOUT)
    except KafkaException as exc:
        refused = exc.args[0]
    else:
        raise AssertionError("a timed-out transaction was committed")
    print(f"commit after the timeout: {refused}")
    log = read_log(cluster.bootstrap(1, 2), topic, "read_committed")
    assert [v for records in log.values() for _, v in records] == []
