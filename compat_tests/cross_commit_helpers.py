"""Helpers of compat_tests/test_pg_cross_commits.py: gateways' Metadata and
transaction coordinators, topics settled over the cluster, a long-polling
read_committed reader, raw commits of markers, a transaction staged through
a stock client (confluent-kafka, the Java client) and committed when told,
and a gateway joining to take partitions over.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import asyncpg
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from java_helpers import JavaProcess
from kio.schema.errors import ErrorCode

from kafka_gateway.client import KafkaClient
from testkit import kafka_requests as rq
from testkit.gateway import GatewayProcess
from testkit.postgres import PostgresServer
from testkit.raw_txn import RawTxn

DATABASE = "cross_commits"  # not ``postgres``: the outage test closes it to new connections
TIMEOUT = 60
LEASE_MS = 3000
PARTITIONS = 4
LONG_POLL_MS = 10_000


def bootstrap(cluster: list[GatewayProcess]) -> str:
    return ",".join(g.bootstrap for g in cluster)


def create(cluster: list[GatewayProcess], topic: str, partitions: int = PARTITIONS) -> None:
    admin = AdminClient({"bootstrap.servers": cluster[0].bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions,
                                  replication_factor=1)])[topic].result(TIMEOUT)


def settled_leaders(cluster: list[GatewayProcess], topic: str,
                    nodes: frozenset[int] = frozenset({1, 2}),
                    partitions: int = PARTITIONS) -> dict[int, int]:
    """partition -> node, once every gateway's Metadata agrees and each of
    ``nodes`` leads some."""
    deadline = time.monotonic() + TIMEOUT
    views: list[dict[int, int]] = []
    while time.monotonic() < deadline:
        views = []
        for gateway in cluster:
            meta = AdminClient({"bootstrap.servers": gateway.bootstrap}).list_topics(
                topic, timeout=10)
            views.append({p.id: p.leader for p in meta.topics[topic].partitions.values()})
        if (len(views[0]) == partitions and all(v == views[0] for v in views)
                and set(views[0].values()) == nodes):
            return views[0]
        time.sleep(0.1)
    raise AssertionError(f"leaders of {topic} not settled over nodes {set(nodes)}: {views}")


def txn_coordinator(cluster: list[GatewayProcess], transactional_id: str) -> int:
    async def ask() -> int:
        client = await KafkaClient.connect(*cluster[0].host_port)
        try:
            answer = await client.request(rq.find_coordinator([transactional_id], key_type=1))
        finally:
            await client.close()
        found = answer.coordinators[0]
        assert found.error_code is ErrorCode.none, found
        return int(found.node_id)

    return asyncio.run(asyncio.wait_for(ask(), TIMEOUT))


def coordinated_by(cluster: list[GatewayProcess], prefix: str, node: int) -> str:
    """A transactional id whose coordinator is ``node``."""
    for index in range(64):
        candidate = f"{prefix}-{index}"
        if txn_coordinator(cluster, candidate) == node:
            return candidate
    raise AssertionError(f"no transactional id {prefix}-* coordinated by node {node}")


def cross_setup(cluster: list[GatewayProcess], topic: str) -> tuple[str, list[int]]:
    """(a transactional id coordinated by node 1, the partitions node 2 leads)."""
    create(cluster, topic)
    parts = settled_leaders(cluster, topic)
    led = sorted(p for p, node in parts.items() if node == 2)
    transactional_id = coordinated_by(cluster, f"{topic}-txn", 1)
    assert led and txn_coordinator(cluster, transactional_id) != 2  # the premise
    return transactional_id, led


def txn_producer(cluster: list[GatewayProcess], transactional_id: str) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap(cluster),
                         "transactional.id": transactional_id, "linger.ms": 0})
    producer.init_transactions(TIMEOUT)
    return producer


class Reader:
    """A read_committed consumer of ``partitions`` long-polling their leader,
    in a thread: what it received, when (monotonic), at which offset."""

    def __init__(self, cluster: list[GatewayProcess], topic: str, partitions: list[int]) -> None:
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap(cluster), "group.id": f"{topic}-reader",
            "enable.auto.commit": False, "isolation.level": "read_committed",
            "fetch.wait.max.ms": LONG_POLL_MS})
        self.consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        self.received: dict[bytes, float] = {}
        self.records: list[tuple[int, int, bytes]] = []
        self.errors: list[object] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            message = self.consumer.poll(0.1)
            if message is None:
                continue
            if message.error() is not None:
                self.errors.append(message.error())
                continue
            self.received[message.value()] = time.monotonic()
            self.records.append((message.partition(), message.offset(), message.value()))

    def wait_for(self, value: bytes, seconds: float) -> float | None:
        deadline = time.monotonic() + seconds
        while value not in self.received and time.monotonic() < deadline:
            time.sleep(0.002)
        return self.received.get(value)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.consumer.close()


async def committer(cluster: list[GatewayProcess], transactional_id: str) -> RawTxn:
    """A raw transactional session through node 1 (the id's coordinator)."""
    raw = await RawTxn.connect(cluster[0], transactional_id)
    for _ in range(20):
        code = await raw.init_producer_id()
        # Retriable, as clients take it: a gateway whose view of the producer
        # id counter lags (another took ids since) loses one attempt.
        if code is not ErrorCode.kafka_storage_error:
            break
        await asyncio.sleep(0.1)
    assert code is ErrorCode.none, code
    return raw


async def commit_markers(raw: RawTxn, topic: str, partitions: list[int]) -> None:
    """One transaction holding ``partitions`` (written nowhere), committed:
    its COMMIT marker goes into each of them."""
    assert await raw.add_partitions(topic, *partitions) is ErrorCode.none
    assert await raw.end_txn(commit=True) is ErrorCode.none


async def latest(gateway: GatewayProcess, topic: str, partition: int) -> int:
    """The partition's high watermark as ``gateway`` (its leader) answers it."""
    client = await KafkaClient.connect(*gateway.host_port)
    try:
        answer = await client.request(rq.list_offsets(topic, [(partition, -1)]))
    finally:
        await client.close()
    found = answer.topics[0].partitions[0]
    assert found.error_code is ErrorCode.none, found
    return int(found.offset)


async def log_listeners(admin: asyncpg.Connection) -> list[int]:
    return [int(pid) for pid in await admin.fetchval(
        "SELECT coalesce(array_agg(pid), '{}') FROM pg_stat_activity "
        "WHERE datname = $1 AND application_name LIKE 'kafka-gateway-log-notices-%'",
        DATABASE)]


def join_and_move(cluster: list[GatewayProcess], pg_server: PostgresServer, base: Path,
                  topic: str, mine: list[int]) -> dict[int, int]:
    """A new gateway joins; once some of ``mine`` moved off node 1 and every
    gateway's Metadata agreed for 2 s, the leaders (partition -> node)."""
    node = max(int(g.extra_args[g.extra_args.index("--node-id") + 1]) for g in cluster) + 1
    joined = GatewayProcess(base / f"data-{node}", "--store", pg_server.dsn_of(DATABASE),
                            "--node-id", str(node), "--broker-session-timeout-ms", str(LEASE_MS))
    cluster.append(joined)  # killed with the others
    joined.start()
    deadline = time.monotonic() + TIMEOUT
    stable: tuple[dict[int, int], float] | None = None
    last: object = None
    while time.monotonic() < deadline:
        views = []
        for gateway in cluster:
            meta = AdminClient({"bootstrap.servers": gateway.bootstrap}).list_topics(
                topic, timeout=10)
            views.append((set(meta.brokers),
                          {p.id: p.leader for p in meta.topics[topic].partitions.values()}))
        last = views
        agreed = all(v == views[0] for v in views) and node in views[0][0]
        leaders = views[0][1]
        if agreed and any(leaders[p] != 1 for p in mine):
            if stable is None or stable[0] != leaders:
                stable = (leaders, time.monotonic())
            elif time.monotonic() - stable[1] >= 2:
                return leaders
        else:
            stable = None
        time.sleep(0.2)
    raise AssertionError(f"none of node 1's partitions {mine} moved to stay: {last}")


class Staged:
    """One transaction's records written into ``partitions`` through a
    client (not committed yet); ``commit()`` ends it."""

    def __init__(self, client: str, cluster: list[GatewayProcess], topic: str,
                 transactional_id: str, partitions: list[int], java_classes: Path | None,
                 ) -> None:
        self.values = {p: [b"m-%d-%d" % (p, i) for i in range(5)] for p in partitions}
        self.java: JavaProcess | None = None
        self.producer: Producer | None = None
        if client == "java":
            assert java_classes is not None
            self.java = JavaProcess(cluster[0], java_classes, "javatxn.CrossCommit", "run",
                                    "--topic", topic, "--txn-id", transactional_id,
                                    "--partitions", ",".join(map(str, partitions)))
            self.java.wait_until(lambda lines: any(x.get("staged") for x in lines), TIMEOUT,
                                 "the Java producer's batches staged")
        else:
            self.producer = txn_producer(cluster, transactional_id)
            self.producer.begin_transaction()
            for p, batch in self.values.items():
                for value in batch:
                    self.producer.produce(topic, value, partition=p)
            assert self.producer.flush(TIMEOUT) == 0  # acknowledged: staged through node 1

    def commit(self) -> None:
        if self.java is not None:
            assert self.java.process.stdin is not None
            self.java.process.stdin.write("commit\n")
            self.java.process.stdin.flush()
            self.java.wait_until(lambda lines: any(x.get("committed") for x in lines), TIMEOUT,
                                 "the Java producer's commit")
        else:
            assert self.producer is not None
            self.producer.commit_transaction(TIMEOUT)

    def close(self) -> None:
        if self.java is not None:
            self.java.finish()
        if self.producer is not None:
            self.producer.flush(10)
