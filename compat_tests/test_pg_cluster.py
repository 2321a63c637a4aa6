"""Three gateway processes on one throwaway PostgreSQL (docs/cluster.md):
Metadata from any of them lists the three and balanced leaders;
confluent-kafka produces to and consumes from a multi-partition topic
through the cluster (following the leaders); kill -9 of one gateway in the
middle of an idempotent, acks=all produce: the producer carries on through
the others once the lease ran out, and every acknowledged record is read
back exactly once.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterator

import asyncpg
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kio.schema.describe_cluster.v0.request import DescribeClusterRequest
from kio.schema.describe_cluster.v0.response import DescribeClusterResponse
from kio.schema.describe_producers.v0.request import DescribeProducersRequest, TopicRequest
from kio.schema.describe_transactions.v0.request import DescribeTransactionsRequest
from kio.schema.errors import ErrorCode

from kafka_gateway.cli.describe_transactions_answer import decode_describe_transactions
from kafka_gateway.client import KafkaClient
from pgstore.leadership import coordinator_slot
from testkit import kafka_requests as rq
from testkit import pg_store_mode, postgres
from testkit.batches import make_batch
from testkit.gateway import GatewayProcess
from testkit.pg_cluster import (
    LEASE_MS,
    PARTITIONS,
    TIMEOUT,
    consume_all,
    create,
    leaders_in_db,
    produce_values,
    running_cluster,
    wait_balanced,
)
from testkit.postgres import PostgresServer

pg_server = postgres.server_fixture("module")


@pytest.fixture(scope="module")
def cluster(pg_server: PostgresServer, tmp_path_factory) -> Iterator[list[GatewayProcess]]:
    base = tmp_path_factory.mktemp("pg-cluster")
    with running_cluster(base, pg_server.dsn) as gateways:
        yield gateways


def test_metadata_from_any_gateway_lists_three_brokers_and_balanced_leaders(
        cluster: list[GatewayProcess]) -> None:
    create(cluster[0], "pg-cluster-meta")
    _, parts = wait_balanced(cluster, "pg-cluster-meta", {1, 2, 3})
    assert sorted(Counter(parts.values()).values()) == [2, 2, 2], parts


def test_describe_cluster_from_any_gateway_lists_the_three(
        cluster: list[GatewayProcess]) -> None:
    """DescribeCluster, as the Java admin client's describeCluster sends it to
    any broker: each gateway lists the same three as Metadata, itself as the
    controller."""
    nodes = {pg_store_mode.node_id(g.extra_args): g.port for g in cluster}
    pg_store_mode.check_cluster([g.host_port for g in cluster], set(nodes), TIMEOUT)

    async def describe(gateway: GatewayProcess) -> DescribeClusterResponse:
        client = await KafkaClient.connect(*gateway.host_port)
        try:
            answer: DescribeClusterResponse = await client.request(
                DescribeClusterRequest(include_cluster_authorized_operations=False))
            return answer
        finally:
            await client.close()

    for gateway in cluster:
        answer = asyncio.run(describe(gateway))
        assert answer.error_code is ErrorCode.none, answer
        assert {b.broker_id: b.port for b in answer.brokers} == nodes, answer
        assert answer.controller_id == pg_store_mode.node_id(gateway.extra_args)


def test_confluent_kafka_produces_and_consumes_through_the_cluster(
        cluster: list[GatewayProcess]) -> None:
    topic = "pg-cluster-e2e"
    create(cluster[1], topic)
    wait_balanced(cluster, topic, {1, 2, 3})
    values = [b"v-%d" % i for i in range(600)]
    producer = Producer({"bootstrap.servers": cluster[0].bootstrap,
                         "enable.idempotence": True, "linger.ms": 5})
    failures: list[object] = []
    for index, value in enumerate(values):
        producer.produce(topic, value, key=b"%d" % index,
                         on_delivery=lambda err, _m: err and failures.append(err))
    assert producer.flush(TIMEOUT) == 0
    assert failures == []
    got = consume_all(cluster[2], topic, len(values))
    assert sorted(got) == sorted(values)


def test_requests_to_a_gateway_that_does_not_lead_or_coordinate_are_refused(
        cluster: list[GatewayProcess]) -> None:
    """Raw requests, no client's retries: FindCoordinator names the same
    gateway from all three; the others answer the group's requests (and
    DescribeTransactions of a transactional id) NOT_COORDINATOR and a
    partition's (and DescribeProducers) NOT_LEADER_OR_FOLLOWER (storing
    nothing); the leader and the coordinator answer them."""
    topic = "pg-cluster-route"
    create(cluster[0], topic)
    _, parts = wait_balanced(cluster, topic, {1, 2, 3})
    by_node = {node: gateway for node, gateway in zip((1, 2, 3), cluster, strict=True)}
    group = "pg-cluster-route-group"

    async def ask(gateway: GatewayProcess, body: object) -> object:
        client = await KafkaClient.connect(*gateway.host_port)
        try:
            return await client.request(body)
        finally:
            await client.close()

    async def body() -> None:
        found = [(await ask(g, rq.find_coordinator([group]))).coordinators[0] for g in cluster]
        assert {c.error_code for c in found} == {ErrorCode.none}, found
        assert len({(c.node_id, c.port) for c in found}) == 1, found
        coordinator = found[0].node_id
        assert by_node[coordinator].port == found[0].port
        for node, gateway in by_node.items():
            answer = await ask(gateway, rq.offset_fetch(group, topic, [0]))
            code = answer.groups[0].error_code
            assert code is (ErrorCode.none if node == coordinator
                            else ErrorCode.not_coordinator), (node, code)
            answer = await ask(gateway, rq.heartbeat(group, 1, "nobody"))
            assert (answer.error_code is ErrorCode.not_coordinator) == (node != coordinator)
        # A transactional id with the group's name: the same slot, the same
        # coordinator; unknown there (no InitProducerId), elsewhere not theirs.
        [txn] = (await ask(cluster[0], rq.find_coordinator([group], 1))).coordinators
        assert (txn.error_code, txn.node_id) == (ErrorCode.none, coordinator), txn
        for node, gateway in by_node.items():
            client = await KafkaClient.connect(*gateway.host_port)
            try:  # read by hand: kio refuses the -1 start time of an unknown id
                [described] = decode_describe_transactions(await client.request_frame(
                    DescribeTransactionsRequest(transactional_ids=(group,))))
            finally:
                await client.close()
            code = described.error_code
            assert code is (ErrorCode.transactional_id_not_found if node == coordinator
                            else ErrorCode.not_coordinator), (node, code)
        leader = parts[0]
        for node, gateway in by_node.items():
            answer = await ask(gateway, rq.produce([(topic, 0, make_batch([b"%d" % node]))]))
            code = answer.responses[0].partition_responses[0].error_code
            assert code is (ErrorCode.none if node == leader
                            else ErrorCode.not_leader_or_follower), (node, code)
            answer = await ask(gateway, rq.list_offsets(topic, [(0, -1)]))
            part = answer.topics[0].partitions[0]
            if node == leader:
                assert (part.error_code, part.offset) == (ErrorCode.none, 1)
                assert part.leader_epoch > 0  # the epoch PostgreSQL gave the leader
            else:
                assert part.error_code is ErrorCode.not_leader_or_follower
            answer = await ask(gateway, DescribeProducersRequest(
                topics=(TopicRequest(name=topic, partition_indexes=(0,)),)))
            code = answer.topics[0].partitions[0].error_code
            assert code is (ErrorCode.none if node == leader
                            else ErrorCode.not_leader_or_follower), (node, code)

    asyncio.run(asyncio.wait_for(body(), TIMEOUT))


def test_kill_9_of_a_gateway_mid_produce_loses_and_duplicates_nothing_acknowledged(
        cluster: list[GatewayProcess]) -> None:
    topic = "pg-cluster-kill"
    create(cluster[0], topic)
    _, before = wait_balanced(cluster, topic, {1, 2, 3})
    victim = cluster[2]  # node 3
    assert 3 in before.values(), before  # the fault hits partitions it leads
    producer = Producer({"bootstrap.servers": f"{cluster[0].bootstrap},{cluster[1].bootstrap}",
                         "enable.idempotence": True, "acks": "all", "linger.ms": 5,
                         "message.timeout.ms": 60_000})
    acked: list[bytes] = []
    failed: list[object] = []
    lock = threading.Lock()

    def delivered(err: object, message: object) -> None:
        with lock:
            if err:
                failed.append(err)
            else:
                acked.append(message.value())  # type: ignore[attr-defined]

    sent = 0

    def produce_for(seconds: float) -> None:
        nonlocal sent
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            producer.produce(topic, b"k-%d" % sent, key=b"%d" % sent, on_delivery=delivered)
            sent += 1
            producer.poll(0.002)

    produce_for(1.5)
    acked_before = len(acked)
    assert acked_before > 0, "nothing acknowledged before the kill"
    victim.kill()
    killed_at = time.monotonic()
    assert victim.process is not None and victim.process.poll() is not None  # the fault landed
    produce_for(0.5)
    # Failover: until the survivors' Metadata has every partition led by them.
    wait_balanced(cluster[:2], topic, {1, 2}, balanced=False)
    failover = time.monotonic() - killed_at
    produce_for(1.0)
    assert producer.flush(TIMEOUT) == 0
    print(f"failover (kill -9 to every partition led by a survivor, lease "
          f"{LEASE_MS} ms): {failover:.2f} s; acknowledged {len(acked)} of {sent}")
    assert failed == [], failed[:5]
    assert len(acked) == sent
    got = consume_all(cluster[0], topic, sent)
    counts = Counter(got)
    duplicates = [v for v, n in counts.items() if n > 1]
    assert duplicates == [], duplicates[:5]
    assert set(acked) <= set(got), f"lost {len(set(acked) - set(got))} acknowledged records"
    assert failover < LEASE_MS / 1000 * 4 / 3 + 5, f"failover took {failover:.2f} s"


def test_a_consumer_group_across_the_cluster_consumes_and_commits(
        cluster: list[GatewayProcess]) -> None:
    """The group's coordinator is the leader of its slot (FindCoordinator);
    the others answer its requests NOT_COORDINATOR. The consumer reads every
    record and commits its ends; ListGroups names the group on its
    coordinator alone."""
    topic = "pg-cluster-group-topic"
    group = "pg-cluster-group"
    running = {node: g for node, g in enumerate(cluster, start=1)
               if g.process is not None and g.process.poll() is None}
    live = list(running.values())
    create(live[0], topic)
    wait_balanced(live, topic, set(running), balanced=False)
    produce_values(live[0], topic, [b"g-%d" % i for i in range(300)])
    consumer = Consumer({"bootstrap.servers": live[-1].bootstrap, "group.id": group,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    count = 0
    try:
        deadline = time.monotonic() + TIMEOUT
        while count < 300 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None:
                assert message.error() is None, message.error()
                count += 1
        assert count == 300, f"consumed {count} of 300"
        consumer.commit(asynchronous=False)
        parts = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        committed = consumer.committed(parts, TIMEOUT)
        ends = [consumer.get_watermark_offsets(tp, TIMEOUT)[1] for tp in parts]
        assert sum(ends) == 300 and 0 not in ends, ends
        assert [tp.offset for tp in committed] == ends
    finally:
        consumer.close()

    async def listed() -> list[list[str]]:
        out = []
        for gateway in live:
            client = await KafkaClient.connect(*gateway.host_port)
            try:
                answer = await client.request(rq.list_groups())
            finally:
                await client.close()
            out.append([g.group_id for g in answer.groups])
        return out

    names = asyncio.run(asyncio.wait_for(listed(), TIMEOUT))
    assert sum(found.count(group) for found in names) == 1, names


def test_a_restarted_gateway_takes_its_share_back_and_clients_follow(
        cluster: list[GatewayProcess], pg_server: PostgresServer) -> None:
    """Node 3 (killed above) starts again: a new incarnation, which the live
    gateways hand partitions over to while a producer and a consumer run
    through the cluster; nothing is lost or read twice."""
    topic = "pg-cluster-back"
    victim = cluster[2]
    victim.kill()  # down already after the kill test; here too when run alone
    create(cluster[0], topic)
    produce_values(cluster[0], topic, [b"first-%d" % i for i in range(600)])
    _, before = wait_balanced(cluster[:2], topic, {1, 2}, balanced=False)
    assert 3 not in before.values()
    start = time.monotonic()
    while 3 in asyncio.run(leaders_in_db(pg_server)):  # the lease of the killed one ran out
        assert time.monotonic() - start < TIMEOUT
        time.sleep(0.2)
    producer = Producer({"bootstrap.servers": cluster[0].bootstrap,
                         "enable.idempotence": True, "acks": "all", "linger.ms": 5})
    failures: list[object] = []
    values = [b"back-%d" % i for i in range(900)]
    for value in values[:300]:
        producer.produce(topic, value, on_delivery=lambda err, _m: err and failures.append(err))
    producer.poll(0)
    victim.start()
    for value in values[300:]:
        producer.produce(topic, value, on_delivery=lambda err, _m: err and failures.append(err))
        producer.poll(0.001)
    wait_balanced(cluster, topic, {1, 2, 3}, balanced=False)
    start = time.monotonic()
    while True:  # the newcomer's share of all partitions (of every topic)
        counts = asyncio.run(leaders_in_db(pg_server))
        if set(counts) == {1, 2, 3} and max(counts.values()) - min(counts.values()) <= 1:
            break
        assert time.monotonic() - start < TIMEOUT, counts
        time.sleep(0.2)
    assert producer.flush(TIMEOUT) == 0
    assert failures == []
    got = consume_all(cluster[2], topic, 600 + len(values))
    counts = Counter(got)
    assert [v for v, n in counts.items() if n > 1] == []
    assert set(values) <= set(got)
    assert len(got) == 600 + len(values)


def test_transactions_whose_coordinator_leads_none_of_their_partitions_commit_and_abort(
        cluster: list[GatewayProcess], pg_server: PostgresServer) -> None:
    """A confluent-kafka transactional producer whose transactional id's
    coordinator (its slot's leader in PostgreSQL, asserted with
    ``coordinator_slot`` before and after) leads none of the partitions it
    writes (Metadata): every Produce goes to another gateway, which stores
    the batches for the coordinator's transaction. Four transactions
    committed, one aborted between them: a read_committed consumer reads
    exactly the committed records, once, in the order produced per
    partition; nothing is left pending."""
    topic = "pg-cluster-txn-across"
    create(cluster[0], topic)
    _, parts = wait_balanced(cluster, topic, {1, 2, 3})

    async def slot_leader(transactional_id: str) -> int:
        conn = await asyncpg.connect(pg_server.dsn)
        try:
            return int(await conn.fetchval(
                "SELECT leader_node FROM kafka_gateway.coordinator_slots WHERE slot = $1",
                coordinator_slot(transactional_id)))
        finally:
            await conn.close()

    def coordinator(transactional_id: str) -> int:
        return asyncio.run(asyncio.wait_for(slot_leader(transactional_id), TIMEOUT))

    transactional_id = f"{topic}-id"
    node = coordinator(transactional_id)
    written = sorted(p for p, leader in parts.items() if leader != node)
    assert len(written) == PARTITIONS - PARTITIONS // 3, (node, parts)  # the premise
    producer = Producer({"bootstrap.servers": cluster[0].bootstrap,
                         "transactional.id": transactional_id, "linger.ms": 5})
    producer.init_transactions(TIMEOUT)
    failures: list[object] = []
    committed: dict[int, list[bytes]] = {p: [] for p in written}
    for round_ in range(5):
        aborted = round_ == 2
        producer.begin_transaction()
        for index in range(40):
            partition = written[index % len(written)]
            value = b"%s-%d-%d" % (b"aborted" if aborted else b"committed", round_, index)
            producer.produce(topic, value, partition=partition,
                             on_delivery=lambda err, _m: err and failures.append(err))
            if not aborted:
                committed[partition].append(value)
        if aborted:
            assert producer.flush(TIMEOUT) == 0  # stored through the leaders, then aborted
            producer.abort_transaction(TIMEOUT)
        else:
            producer.commit_transaction(TIMEOUT)
    assert failures == []
    # The premise held throughout: the coordinator did not move, and led
    # none of the partitions written.
    assert coordinator(transactional_id) == node
    _, after = wait_balanced(cluster, topic, {1, 2, 3})
    assert after == parts and node not in {after[p] for p in written}

    consumer = Consumer({"bootstrap.servers": cluster[2].bootstrap,
                         "group.id": f"{topic}-reader", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    read: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    total = sum(len(v) for v in committed.values())
    try:
        deadline = time.monotonic() + TIMEOUT
        while sum(len(v) for v in read.values()) < total and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            read[message.partition()].append(message.value())
        quiet = time.monotonic() + 2  # anything more would be a duplicate or aborted
        while time.monotonic() < quiet:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                read[message.partition()].append(message.value())
    finally:
        consumer.close()
    assert read == {p: committed.get(p, []) for p in range(PARTITIONS)}

    async def pending() -> int:
        conn = await asyncpg.connect(pg_server.dsn)
        try:
            return int(await conn.fetchval("SELECT count(*) FROM kafka_gateway.pending_batches"))
        finally:
            await conn.close()

    assert asyncio.run(asyncio.wait_for(pending(), TIMEOUT)) == 0
