"""Exactly-once across gateways (issue 22, "Commits that cross gateways";
docs/cluster.md): on three gateway processes over one throwaway PostgreSQL,
transactions whose transactional id one gateway coordinates commit offsets
of a group another gateway coordinates (the client sends TxnOffsetCommit to
the group's coordinator, EndTxn to the id's). The ids are chosen by
``coordinator_slot`` and the slots' leaders, and the premise is asserted by
FindCoordinator: the two coordinators differ.

- a confluent-kafka consume-transform-produce loop: an aborted transaction
  first (its offsets never visible), then several committed ones; the
  read_committed output holds every input record exactly once, and the
  group's committed offsets are the input's log ends, in PostgreSQL and as
  the group's coordinator answers OffsetFetch;
- two transactional producers whose ids two different gateways coordinate
  commit overlapping ranges of one partition of a group a third gateway
  coordinates: the first commit wins, the second fails with an abortable
  error, and nothing of it lands (neither its offset nor its record).

The loop's transactions produce into every partition of the output topic,
whichever gateway leads it; the racing producers each into one their own
coordinator leads, so the loser's partition shows its absence alone.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterator

import asyncpg
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as ClientPartition
from kio.schema.errors import ErrorCode
from test_pg_cluster import PARTITIONS, create, produce_values, wait_balanced

from kafka_gateway.client import KafkaClient
from pgstore.leadership import coordinator_slot
from testkit import kafka_requests as rq
from testkit import postgres
from testkit.gateway import GatewayProcess
from testkit.pg_cluster import running_cluster
from testkit.postgres import PostgresServer

pg_server = postgres.server_fixture("module")
LEASE_MS = 3000
TIMEOUT = 60
RECORDS = 300
BATCH = 40
GROUP, TXN = 0, 1  # FindCoordinator key types


@pytest.fixture(scope="module")
def cluster(pg_server: PostgresServer, tmp_path_factory) -> Iterator[list[GatewayProcess]]:
    base = tmp_path_factory.mktemp("pg-txn-offsets")
    with running_cluster(base, pg_server.dsn, lease_ms=LEASE_MS) as gateways:
        yield gateways


def settled_leaders(cluster: list[GatewayProcess], topic: str) -> dict[int, int]:
    """partition -> leader, once every partition is led and the leaders
    stayed put for two seconds (a pass may still move some after a create)."""
    deadline = time.monotonic() + TIMEOUT
    _, last = wait_balanced(cluster, topic, {1, 2, 3}, balanced=False)
    while time.monotonic() < deadline:
        time.sleep(2)
        _, now = wait_balanced(cluster, topic, {1, 2, 3}, balanced=False)
        if now == last:
            return now
        last = now
    raise AssertionError(f"the leaders of {topic} kept moving: {last}")


def bootstrap(cluster: list[GatewayProcess]) -> str:
    return ",".join(g.bootstrap for g in cluster)


async def slot_leaders(pg: PostgresServer) -> dict[int, int]:
    conn = await asyncpg.connect(pg.dsn)
    try:
        rows = await conn.fetch("SELECT slot, leader_node FROM kafka_gateway.coordinator_slots")
    finally:
        await conn.close()
    return {r["slot"]: r["leader_node"] for r in rows}


def key_led_by(pg: PostgresServer, prefix: str, node: int) -> str:
    """A key whose coordinator slot ``node`` leads."""
    led = asyncio.run(slot_leaders(pg))
    return next(key for key in (f"{prefix}-{i}" for i in range(100_000))
                if led[coordinator_slot(key)] == node)


async def _coordinator(gateway: GatewayProcess, key: str, key_type: int) -> int:
    client = await KafkaClient.connect(*gateway.host_port)
    try:
        found = (await client.request(rq.find_coordinator([key], key_type))).coordinators[0]
    finally:
        await client.close()
    assert found.error_code is ErrorCode.none, found
    return int(found.node_id)


def coordinator(cluster: list[GatewayProcess], key: str, key_type: int) -> int:
    """The coordinator FindCoordinator names, the same from every gateway."""
    seen = {asyncio.run(asyncio.wait_for(_coordinator(g, key, key_type), TIMEOUT))
            for g in cluster}
    assert len(seen) == 1, seen
    return seen.pop()


async def _stored(pg: PostgresServer, group: str) -> tuple[dict[int, tuple[int, str]], int]:
    """The group's committed offsets (partition -> (offset, committer)) and
    how many offsets are staged for it."""
    conn = await asyncpg.connect(pg.dsn)
    try:
        rows = await conn.fetch("SELECT partition, committed_offset, committer FROM "
                                "kafka_gateway.consumer_offsets WHERE group_id = $1", group)
        staged = await conn.fetchval(
            "SELECT count(*) FROM kafka_gateway.txn_staged_offsets WHERE group_id = $1", group)
    finally:
        await conn.close()
    return {r["partition"]: (r["committed_offset"], r["committer"]) for r in rows}, int(staged)


def stored(pg: PostgresServer, group: str) -> tuple[dict[int, tuple[int, str]], int]:
    return asyncio.run(_stored(pg, group))


def read_committed(cluster: list[GatewayProcess], topic: str, partitions: list[int],
                   at_least: int) -> list[bytes]:
    """Every record of ``partitions``, read_committed, reading on a while
    after ``at_least`` for duplicates."""
    consumer = Consumer({"bootstrap.servers": bootstrap(cluster), "group.id": f"{topic}-check",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    consumer.assign([ClientPartition(topic, p, 0) for p in partitions])
    values: list[bytes] = []
    try:
        deadline = time.monotonic() + TIMEOUT
        quiet: float | None = None
        while time.monotonic() < deadline and (quiet is None or time.monotonic() < quiet):
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                values.append(message.value())
            if quiet is None and len(values) >= at_least:
                quiet = time.monotonic() + 3
    finally:
        consumer.close()
    return values


def txn_producer(cluster: list[GatewayProcess], transactional_id: str) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap(cluster),
                         "transactional.id": transactional_id, "linger.ms": 5})
    producer.init_transactions(TIMEOUT)
    return producer


def test_a_consume_transform_produce_loop_across_gateways_is_exactly_once(
        cluster: list[GatewayProcess], pg_server: PostgresServer) -> None:
    source, sink = "pg-eos-in", "pg-eos-out"
    create(cluster[0], source)
    create(cluster[0], sink)
    wait_balanced(cluster, source, {1, 2, 3}, balanced=False)
    sink_leaders = settled_leaders(cluster, sink)
    # The id's coordinator leads some output partitions; the group's is
    # another gateway.
    txn_node = min(sink_leaders.values())
    group_node = next(node for node in (1, 2, 3) if node != txn_node)
    transactional_id = key_led_by(pg_server, "pg-eos-txn", txn_node)
    group = key_led_by(pg_server, "pg-eos-group", group_node)
    # The premise: the id and the group are coordinated by different gateways.
    assert coordinator(cluster, transactional_id, TXN) == txn_node
    assert coordinator(cluster, group, GROUP) == group_node
    outputs = list(range(PARTITIONS))
    assert {sink_leaders[p] for p in outputs} != {txn_node}, sink_leaders
    produce_values(cluster[0], source, [b"v-%d" % i for i in range(RECORDS)])
    producer = txn_producer(cluster, transactional_id)
    config = {"bootstrap.servers": bootstrap(cluster), "group.id": group,
              "auto.offset.reset": "earliest", "enable.auto.commit": False,
              "isolation.level": "read_committed"}

    def batch(consumer: Consumer) -> list[bytes]:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            got = [m for m in consumer.consume(BATCH, 0.5) if m.error() is None]
            if got:
                return [m.value() for m in got]
        raise AssertionError("no input within the timeout")

    def transform(consumer: Consumer, values: list[bytes], commit: bool) -> None:
        producer.begin_transaction()
        for i, value in enumerate(values):
            producer.produce(sink, b"out-" + value, partition=outputs[i % len(outputs)])
        producer.send_offsets_to_transaction(
            consumer.position(consumer.assignment()), consumer.consumer_group_metadata(),
            TIMEOUT)
        if commit:
            producer.commit_transaction(TIMEOUT)
        else:
            producer.abort_transaction(TIMEOUT)

    # An aborted transaction: its offsets are never visible.
    first = Consumer(config)
    first.subscribe([source])
    try:
        aborted = batch(first)
        transform(first, aborted, commit=False)
    finally:
        first.close()
    offsets, staged = stored(pg_server, group)
    assert (offsets, staged) == ({}, 0)

    consumer = Consumer(config)
    consumer.subscribe([source])
    transactions = 0
    consumed: list[bytes] = []
    try:
        while len(consumed) < RECORDS:
            values = batch(consumer)
            transform(consumer, values, commit=True)
            consumed += values
            transactions += 1
        parts = [ClientPartition(source, p) for p in range(PARTITIONS)]
        ends = [consumer.get_watermark_offsets(tp, TIMEOUT)[1] for tp in parts]
        # As the group's coordinator answers OffsetFetch (require_stable).
        committed = consumer.committed(parts, TIMEOUT)
    finally:
        consumer.close()
    assert transactions >= 3, transactions
    assert sorted(consumed) == sorted(b"v-%d" % i for i in range(RECORDS))
    assert [tp.offset for tp in committed] == ends
    offsets, staged = stored(pg_server, group)
    assert staged == 0
    assert {p: o for p, (o, _) in offsets.items()} == dict(enumerate(ends))
    assert {committer for _, committer in offsets.values()} == {transactional_id}
    out = read_committed(cluster, sink, outputs, RECORDS)
    counts = Counter(out)
    assert sorted(counts) == sorted(b"out-v-%d" % i for i in range(RECORDS)), len(out)
    assert max(counts.values()) == 1, [v for v, n in counts.items() if n > 1][:5]
    producer.flush(TIMEOUT)


def began(producer: Producer, body: Callable[[], object]) -> None:
    """Begin a transaction and run ``body`` in it, as an application does:
    a gateway whose transaction-instance counter another gateway moved
    refuses its first transaction once (KAFKA_STORAGE_ERROR, docs/cluster.md
    "producer ids across gateways"); the transaction is aborted and begun
    again. Anything else fails the test."""
    for attempt in range(4):
        producer.begin_transaction()
        try:
            body()
            return
        except KafkaException as exc:
            if attempt == 3 or exc.args[0].code() != KafkaError.KAFKA_STORAGE_ERROR:
                raise
            producer.abort_transaction(TIMEOUT)


def test_two_gateways_racing_to_commit_one_partitions_range_exactly_one_wins(
        cluster: list[GatewayProcess], pg_server: PostgresServer) -> None:
    source, sink = "pg-race-in", "pg-race-out"
    create(cluster[0], source)
    create(cluster[0], sink)
    wait_balanced(cluster, source, {1, 2, 3}, balanced=False)
    sink_leaders = settled_leaders(cluster, sink)
    # Each producer's id is coordinated by a gateway that leads an output
    # partition it writes to; the group by the third gateway.
    leading = sorted(set(sink_leaders.values()))
    assert len(leading) >= 2, f"one gateway leads every partition of {sink}: {sink_leaders}"
    one, two = leading[:2]
    (third,) = {1, 2, 3} - {one, two}
    first_id = key_led_by(pg_server, "pg-race-first", one)
    second_id = key_led_by(pg_server, "pg-race-second", two)
    group = key_led_by(pg_server, "pg-race-group", third)
    assert [coordinator(cluster, first_id, TXN), coordinator(cluster, second_id, TXN),
            coordinator(cluster, group, GROUP)] == [one, two, third]
    out_of = {node: min(p for p, n in sink_leaders.items() if n == node) for node in (one, two)}
    produce_values(cluster[0], source, [b"r-%d" % i for i in range(RECORDS)])
    first, second = txn_producer(cluster, first_id), txn_producer(cluster, second_id)
    # The group's metadata as a consumer that has not joined sends it (no
    # generation, no member): both claim [0, n) of partition 0.
    member = Consumer({"bootstrap.servers": bootstrap(cluster), "group.id": group})
    try:
        metadata = member.consumer_group_metadata()
        for producer, node, offset in ((first, one, 10), (second, two, 15)):
            began(producer, lambda p=producer, n=node, o=offset: (
                p.produce(sink, b"from-%d" % n, partition=out_of[n]),
                p.send_offsets_to_transaction([ClientPartition(source, 0, o)], metadata,
                                              TIMEOUT)))
        offsets, staged = stored(pg_server, group)
        assert (offsets, staged) == ({}, 2)  # both staged, neither visible
        first.commit_transaction(TIMEOUT)
        with pytest.raises(KafkaException) as lost:
            second.commit_transaction(TIMEOUT)
        assert lost.value.args[0].txn_requires_abort(), lost.value
        second.abort_transaction(TIMEOUT)
        offsets, staged = stored(pg_server, group)
        assert (offsets, staged) == ({0: (10, first_id)}, 0)
        # The group's coordinator answers the winner's offset too.
        committed = member.committed([ClientPartition(source, 0)], TIMEOUT)
        assert committed[0].offset == 10
        # Of the loser nothing landed: its record is not readable, the
        # winner's is; the loser's producer goes on with a new transaction.
        assert read_committed(cluster, sink, [out_of[one]], 1) == [b"from-%d" % one]
        assert read_committed(cluster, sink, [out_of[two]], 0) == []
        second.begin_transaction()
        second.produce(sink, b"again", partition=out_of[two])
        second.commit_transaction(TIMEOUT)
        assert read_committed(cluster, sink, [out_of[two]], 1) == [b"again"]
    finally:
        member.close()
        first.flush(TIMEOUT)
        second.flush(TIMEOUT)
