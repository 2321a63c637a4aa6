"""Helpers of the tests of several gateway processes over one PostgreSQL
(compat_tests/test_pg_cluster.py, test_pg_cluster_faults.py): each gateway's
Metadata (brokers, leaders), waiting until the cluster's leaders settle,
topics made, written and read back with confluent-kafka, and the leaders as
PostgreSQL has them.

    gateways = start_cluster(base, dsn, lease_ms=3000)     # nodes 1, 2, 3
    create(gateways[0], "t")
    seconds, parts = wait_balanced(gateways, "t", {1, 2, 3})
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import asyncpg
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from testkit.gateway import GatewayProcess
from testkit.postgres import PostgresServer

TIMEOUT = 60
LEASE_MS = 3000  # broker.session.timeout.ms: failover within it plus a third
PARTITIONS = 6


def cluster_gateways(base: Path, dsn: str, nodes: tuple[int, ...] = (1, 2, 3),
                     lease_ms: int = LEASE_MS) -> list[GatewayProcess]:
    """Gateways (not started) of ``nodes`` on the store ``dsn``."""
    return [GatewayProcess(base / f"data-{node}", "--store", dsn, "--node-id", str(node),
                           "--broker-session-timeout-ms", str(lease_ms))
            for node in nodes]


@contextlib.contextmanager
def running_cluster(base: Path, dsn: str, nodes: tuple[int, ...] = (1, 2, 3),
                    lease_ms: int = LEASE_MS) -> Iterator[list[GatewayProcess]]:
    """``cluster_gateways`` started, and killed at the end (a module's fixture)."""
    gateways = cluster_gateways(base, dsn, nodes, lease_ms)
    try:
        for gateway in gateways:
            gateway.start()
        yield gateways
    finally:
        for gateway in gateways:
            gateway.kill()


def leaders(gateway: GatewayProcess, topic: str) -> tuple[set[int], dict[int, int]]:
    """(broker ids, partition -> leader id) as one gateway's Metadata says."""
    meta = AdminClient({"bootstrap.servers": gateway.bootstrap}).list_topics(topic, timeout=10)
    found = meta.topics[topic]
    return set(meta.brokers), {p.id: p.leader for p in found.partitions.values()}


def wait_balanced(gateways: list[GatewayProcess], topic: str, live: set[int],
                  balanced: bool = True,
                  partitions: int = PARTITIONS) -> tuple[float, dict[int, int]]:
    """Seconds until every gateway's Metadata lists exactly ``live`` and every
    partition led by one of them, with ``balanced`` within the topic (counts
    within one: a topic made while all of ``live`` were up; the cluster
    balances all partitions together), and the leaders then (partition ->
    node)."""
    start = time.monotonic()
    last: object = None
    while time.monotonic() - start < TIMEOUT:
        views = [leaders(g, topic) for g in gateways]
        last = views
        if all(brokers == live and len(parts) == partitions
               and set(parts.values()) <= live for brokers, parts in views):
            counts = Counter(views[0][1].values())
            if not balanced or max(counts.values()) - min(counts[n] for n in live) <= 1:
                return time.monotonic() - start, views[0][1]
        time.sleep(0.1)
    raise AssertionError(f"not balanced over {live} in {TIMEOUT} s: {last}")


def create(gateway: GatewayProcess, topic: str, partitions: int = PARTITIONS) -> None:
    admin = AdminClient({"bootstrap.servers": gateway.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions,
                                  replication_factor=1)])[topic].result(TIMEOUT)


def consume_all(gateway: GatewayProcess, topic: str, count: int,
                partitions: int = PARTITIONS) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": gateway.bootstrap, "group.id": f"{topic}-reader",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    values: list[bytes] = []
    try:
        deadline = time.monotonic() + TIMEOUT
        while len(values) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            values.append(message.value())
        # Anything beyond ``count`` would be a duplicate: read a little longer.
        quiet = time.monotonic() + 2
        while time.monotonic() < quiet:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                values.append(message.value())
    finally:
        consumer.close()
    return values


def produce_values(gateway: GatewayProcess, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": gateway.bootstrap,
                         "enable.idempotence": True, "linger.ms": 5})
    failures: list[object] = []
    for index, value in enumerate(values):  # keyed: every partition gets some
        producer.produce(topic, value, key=b"%d" % index,
                         on_delivery=lambda err, _m: err and failures.append(err))
    assert producer.flush(TIMEOUT) == 0
    assert failures == []


async def leaders_in_db(pg: PostgresServer, dsn: str | None = None) -> Counter[int | None]:
    """How many partitions each node leads, by the ``partitions`` table."""
    conn = await asyncpg.connect(dsn or pg.dsn)
    try:
        return Counter(row["leader_node"] for row in await conn.fetch(
            "SELECT leader_node FROM kafka_gateway.partitions"))
    finally:
        await conn.close()
