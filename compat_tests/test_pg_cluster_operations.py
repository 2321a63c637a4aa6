"""What an operator of the cluster watches and sizes (docs/cluster.md,
docs/operations.md): two gateway processes over one throwaway PostgreSQL
each list, in /metrics and the web console, both live gateways with their
leases and shares, and every partition's leader as Metadata names it; after
one is killed, the survivor lists itself alone, leading everything. The
connections a gateway holds to PostgreSQL stay within what docs/cluster.md
tells operators to size ``max_connections`` for.
"""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request
from collections.abc import Iterator

import asyncpg
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from testkit import postgres
from testkit.gateway import GatewayProcess
from testkit.postgres import PostgresServer

pg_server = postgres.server_fixture("module")
TIMEOUT = 60
LEASE_MS = 3000
TOPIC, PARTITIONS = "console-orders", 4
SLOTS = 50  # coordinator slots (pgstore.schema.COORDINATOR_SLOTS)
CONNECTIONS_PER_GATEWAY = 11  # docs/cluster.md, "What the gateways need"


@pytest.fixture(scope="module")
def pair(pg_server: PostgresServer, tmp_path_factory) -> Iterator[list[GatewayProcess]]:
    base = tmp_path_factory.mktemp("pg-cluster-console")
    gateways = [GatewayProcess(base / f"data-{node}", "--store", pg_server.dsn,
                               "--node-id", str(node), "--admin-listen", "127.0.0.1:0",
                               "--broker-session-timeout-ms", str(LEASE_MS))
                for node in (1, 2)]
    try:
        for gateway in gateways:
            gateway.start()
        admin = AdminClient({"bootstrap.servers": gateways[0].bootstrap})
        admin.create_topics([NewTopic(TOPIC, num_partitions=PARTITIONS,
                                      replication_factor=1)])[TOPIC].result(TIMEOUT)
        yield gateways
    finally:
        for gateway in gateways:
            gateway.kill()


def metadata_leaders(gateway: GatewayProcess) -> dict[int, int]:
    meta = AdminClient({"bootstrap.servers": gateway.bootstrap}).list_topics(TOPIC, timeout=10)
    return {p.id: p.leader for p in meta.topics[TOPIC].partitions.values()}


def cluster_series(gateway: GatewayProcess) -> dict[str, dict[str, float]]:
    """The cluster's series of one scrape: name -> {node id or partition: value}."""
    out: dict[str, dict[str, float]] = {}
    for (name, labels), value in gateway.metrics().items():
        found = dict(labels)
        if name.startswith("kafka_gateway_cluster_node_"):
            out.setdefault(name, {})[found["node_id"]] = value
        elif name in ("kafka_gateway_partition_leader", "kafka_gateway_partition_leader_epoch"):
            if found["topic"] == TOPIC:
                out.setdefault(name, {})[found["partition"]] = value
        elif name == "kafka_gateway_cluster_nodes":
            out[name] = {"": value}
    return out


def settled(gateway: GatewayProcess, nodes: set[str]) -> dict[str, dict[str, float]]:
    """The gateway's cluster series once they list exactly ``nodes``, sharing
    every partition and slot, and agree with its Metadata."""
    last: object = None
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        series = cluster_series(gateway)
        led = series.get("kafka_gateway_cluster_node_partitions_led", {})
        slots = series.get("kafka_gateway_cluster_node_coordinator_slots_led", {})
        leaders = {int(p): int(v) for p, v in
                   series.get("kafka_gateway_partition_leader", {}).items()}
        last = (series, metadata_leaders(gateway))
        if (set(led) == nodes and sum(led.values()) >= PARTITIONS
                and sum(slots.values()) == SLOTS and leaders == last[1]
                and {str(n) for n in leaders.values()} <= nodes):
            return series
        time.sleep(0.2)
    raise AssertionError(f"cluster series never settled on {nodes}: {last}")


def console_nodes(gateway: GatewayProcess) -> list[list[str]]:
    with urllib.request.urlopen(f"http://{gateway.admin_address()}/ui/cluster",
                                timeout=TIMEOUT) as answer:
        html = answer.read().decode()
    table = re.search(r'<table[^>]* id="nodes".*?</table>', html, re.S)
    assert table, html
    rows = re.findall(r"<tr>(.*?)</tr>", table.group(0), re.S)
    return [[re.sub(r"<[^>]+>", "", cell).strip()
             for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)] for row in rows if
            "<td" in row]


def connections(pg_server: PostgresServer) -> int:
    """Client connections to the gateways' database, this one's aside."""
    async def count() -> int:
        conn = await asyncpg.connect(pg_server.dsn)
        try:
            return int(await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND backend_type = 'client backend' AND pid <> pg_backend_pid()"))
        finally:
            await conn.close()
    return asyncio.run(count())


def traffic(gateway: GatewayProcess) -> None:
    """Produce to every partition through the cluster and read it all back,
    so the gateways open their write and read paths."""
    producer = Producer({"bootstrap.servers": gateway.bootstrap, "enable.idempotence": True})
    for i in range(200):
        producer.produce(TOPIC, value=b"v%d" % i, partition=i % PARTITIONS)
    assert producer.flush(TIMEOUT) == 0
    consumer = Consumer({"bootstrap.servers": gateway.bootstrap, "group.id": "ops-reader",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    read = 0
    deadline = time.monotonic() + TIMEOUT
    try:
        while read < 200:
            assert time.monotonic() < deadline, f"read {read} of 200"
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                read += 1
    finally:
        consumer.close()


def test_both_gateways_list_the_cluster_then_the_survivor_alone(pair, pg_server):
    first, second = pair
    traffic(first)
    both = connections(pg_server)
    for gateway in pair:
        series = settled(gateway, {"1", "2"})
        assert series["kafka_gateway_cluster_nodes"][""] == 2
        now = time.time()
        for node, expiry in series["kafka_gateway_cluster_node_lease_expiry_timestamp_seconds"
                                   ].items():
            # renewed every third of the lease: it runs out within the lease from now
            assert now - 2 < expiry < now + LEASE_MS / 1000 + 2, (node, expiry, now)
        assert all(v >= 1 for v in series["kafka_gateway_partition_leader_epoch"].values())
        rows = console_nodes(gateway)
        assert [row[0] for row in rows] == ["1", "2"], rows
        assert {row[1] for row in rows} == {first.bootstrap, second.bootstrap}, rows
        led = series["kafka_gateway_cluster_node_partitions_led"]
        assert [int(row[3]) for row in rows] == [int(led["1"]), int(led["2"])], rows
        this = "1" if gateway is first else "2"
        assert [row[5] for row in rows] == ["this gateway" if row[0] == this else ""
                                            for row in rows], rows

    second.kill()
    series = settled(first, {"1"})
    # The killed gateway's connections are gone (the kernel closed its
    # sockets); what it held is the difference.
    deadline = time.monotonic() + TIMEOUT
    while (one := connections(pg_server)) >= both and time.monotonic() < deadline:
        time.sleep(0.2)
    print(f"\nconnections to PostgreSQL: two gateways {both}, one {one}")
    assert 1 <= both - one <= CONNECTIONS_PER_GATEWAY, (both, one)
    assert 1 <= one <= CONNECTIONS_PER_GATEWAY, (both, one)
    assert series["kafka_gateway_cluster_nodes"][""] == 1
    assert set(series["kafka_gateway_partition_leader"].values()) == {1}
    assert series["kafka_gateway_cluster_node_coordinator_slots_led"] == {"1": SLOTS}
    assert [row[0] for row in console_nodes(first)] == ["1"]
