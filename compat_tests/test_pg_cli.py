"""``kafka-gateway transactions`` and ``groups`` against a cluster of three
gateway processes over one throwaway PostgreSQL (issue 22, "Routing";
docs/cli.md, docs/cluster.md), bootstrapped through one gateway that
neither coordinates the id or group asked about nor leads the partition:
the CLI finds the coordinator (FindCoordinator) and the leader (Metadata)
as Kafka's AdminClient does, and lists what every gateway coordinates.

Every premise is asserted before and after the command (testkit.routing):
the bootstrap is not the coordinator, or not the leader, of what is asked.

- ``transactions list`` shows open transactions coordinated by each of the
  three; ``describe`` and ``abort`` of an id another gateway coordinates
  work, and the abort fences the producer (its commit then fails, fatal);
- ``transactions producers`` of a partition another gateway leads;
- ``groups list`` shows groups coordinated by each of the three;
  ``describe`` of one coordinated elsewhere shows its committed offsets and
  each partition's log end from its leader; ``reset-offsets --execute``,
  ``delete-offsets`` and ``delete`` of groups coordinated elsewhere;
- a gateway Metadata lists but the CLI cannot reach (a fourth, advertising
  an address nothing listens on): ``list`` prints what the others answered,
  reports that broker on stderr and exits 1.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from test_pg_txn_offsets import key_led_by, slot_leaders

from testkit import pg_store_mode, postgres
from testkit.cli import run_cli
from testkit.gateway import GatewayProcess
from testkit.pg_cluster import PARTITIONS, create, running_cluster, wait_balanced
from testkit.postgres import PostgresServer
from testkit.routing import GROUP, TRANSACTION, coordinator_of, leader_of

pg_server = postgres.server_fixture("module")
LEASE_MS = 3000
TIMEOUT = 60
TOPIC = "pg-cli"
NODES = (1, 2, 3)
RECORDS = 5  # per partition


@pytest.fixture(scope="module")
def cluster(pg_server: PostgresServer, tmp_path_factory) -> Iterator[list[GatewayProcess]]:
    base = tmp_path_factory.mktemp("pg-cli")
    with running_cluster(base, pg_server.dsn, lease_ms=LEASE_MS) as gateways:
        create(gateways[0], TOPIC)
        wait_balanced(gateways, TOPIC, set(NODES))
        settled_slots(pg_server, set(NODES))
        yield gateways


def settled_slots(pg: PostgresServer, nodes: set[int]) -> dict[int, int]:
    """The coordinator slots' leaders (slot -> node), once each of ``nodes``
    leads its share (counts within one) and that stayed so for two seconds."""
    deadline = time.monotonic() + TIMEOUT
    last: dict[int, int] = {}
    steady_since = time.monotonic()
    while time.monotonic() < deadline:
        now = asyncio.run(slot_leaders(pg))
        counts = Counter(now.values())
        balanced = set(counts) == nodes and max(counts.values()) - min(counts.values()) <= 1
        if now != last or not balanced:
            last, steady_since = now, time.monotonic()
        elif time.monotonic() - steady_since >= 2:
            return now
        time.sleep(0.2)
    raise AssertionError(f"the coordinator slots did not settle over {nodes}: {last}")


def cli(bootstrap: GatewayProcess, *args: str, check: bool = True):
    return run_cli(bootstrap.bootstrap, *args, check=check, timeout=TIMEOUT)


def coordinator_port(bootstrap: GatewayProcess, key: str, key_type: int) -> int:
    _, _, port = asyncio.run(asyncio.wait_for(
        coordinator_of(bootstrap.host_port, key, key_type), TIMEOUT))
    return port


def leader_port(bootstrap: GatewayProcess, topic: str, partition: int) -> int:
    _, _, port = asyncio.run(asyncio.wait_for(
        leader_of(bootstrap.host_port, topic, partition), TIMEOUT))
    return port


def keys_by_node(cluster: list[GatewayProcess], pg: PostgresServer, prefix: str,
                 key_type: int) -> dict[int, str]:
    """A key coordinated by each gateway, checked through the bootstrap
    (cluster[0], node 1): the first's is coordinated by it, the others' not."""
    keys = {node: key_led_by(pg, prefix, node) for node in NODES}
    assert_coordinated(cluster, keys, key_type)
    return keys


def assert_coordinated(cluster: list[GatewayProcess], keys: dict[int, str],
                       key_type: int) -> None:
    ports = {node: gateway.port for node, gateway in zip(NODES, cluster, strict=True)}
    for node, key in keys.items():
        assert coordinator_port(cluster[0], key, key_type) == ports[node], (node, key)
    assert ports[1] == cluster[0].port  # the bootstrap coordinates only the first


def rows(output: str) -> list[list[str]]:
    """A printed table's rows, without its header."""
    return [line.split() for line in output.splitlines()[1:] if line.strip()]


def test_transactions_list_describe_and_abort_ids_coordinated_elsewhere(
        cluster: list[GatewayProcess], pg_server: PostgresServer) -> None:
    bootstrap = cluster[0]
    ids = keys_by_node(cluster, pg_server, "pg-cli-txn", TRANSACTION)
    producers = {}
    for node, txn_id in ids.items():
        producer = Producer({"bootstrap.servers": ",".join(g.bootstrap for g in cluster),
                             "transactional.id": txn_id})
        producer.init_transactions(TIMEOUT)
        producer.begin_transaction()
        producer.produce(TOPIC, value=b"open", partition=node)
        assert producer.flush(TIMEOUT) == 0
        producers[node] = producer

    listed = {row[0]: row for row in rows(cli(bootstrap, "transactions", "list").stdout)}
    for txn_id in ids.values():
        assert listed[txn_id][2] == "Ongoing", listed

    described = rows(cli(bootstrap, "transactions", "describe", ids[2]).stdout)
    assert described[0][0] == ids[2] and described[0][2:4] == ["0", "Ongoing"], described
    assert described[0][-1] == f"{TOPIC}-2", described

    aborted = cli(bootstrap, "transactions", "abort", ids[3]).stdout
    assert "is fenced (now epoch 1)" in aborted, aborted
    after = rows(cli(bootstrap, "transactions", "describe", ids[3]).stdout)
    assert after[0][2:4] == ["1", "Empty"], after
    with pytest.raises(KafkaException) as fenced:
        producers[3].commit_transaction(TIMEOUT)
    assert fenced.value.args[0].fatal(), fenced.value
    for node in (1, 2):
        producers[node].abort_transaction(TIMEOUT)
    # The premise held throughout: node 1 (the bootstrap) coordinates only ids[1].
    assert_coordinated(cluster, ids, TRANSACTION)


def test_transactions_producers_of_a_partition_led_elsewhere(
        cluster: list[GatewayProcess]) -> None:
    bootstrap = cluster[0]
    partition = next(p for p in range(PARTITIONS)
                     if leader_port(bootstrap, TOPIC, p) != bootstrap.port)
    producer = Producer({"bootstrap.servers": bootstrap.bootstrap, "enable.idempotence": True,
                         "linger.ms": 50})
    for _ in range(RECORDS):
        producer.produce(TOPIC, value=b"idempotent", partition=partition)
    assert producer.flush(TIMEOUT) == 0

    shown = rows(cli(bootstrap, "transactions", "producers", TOPIC, str(partition)).stdout)
    # The idempotent producer, its last sequence that of its fifth record.
    assert ["0", str(RECORDS - 1)] in [row[1:3] for row in shown], shown
    assert leader_port(bootstrap, TOPIC, partition) != bootstrap.port


def test_groups_list_describe_reset_and_delete_groups_coordinated_elsewhere(
        cluster: list[GatewayProcess], pg_server: PostgresServer) -> None:
    bootstrap = cluster[0]
    topic = "pg-cli-groups"
    create(bootstrap, topic)
    _, leaders = wait_balanced(cluster, topic, set(NODES))
    assert set(leaders.values()) == set(NODES), leaders  # partitions led elsewhere too
    producer = Producer({"bootstrap.servers": bootstrap.bootstrap})
    for partition in range(PARTITIONS):
        for _ in range(RECORDS):
            producer.produce(topic, value=b"x", partition=partition)
    assert producer.flush(TIMEOUT) == 0
    groups = keys_by_node(cluster, pg_server, "pg-cli-group", GROUP)
    for group in groups.values():
        consumer = Consumer({"bootstrap.servers": bootstrap.bootstrap, "group.id": group,
                             "enable.auto.commit": False})
        consumer.commit(offsets=[TopicPartition(topic, p, 2) for p in range(PARTITIONS)],
                        asynchronous=False)
        consumer.close()

    listed = {row[0]: row for row in rows(cli(bootstrap, "groups", "list").stdout)}
    for group in groups.values():
        assert listed[group][1] == "Empty", listed

    described = cli(bootstrap, "groups", "describe", groups[2]).stdout
    offsets = {int(row[1]): row[2:5] for row in rows(described.split("\n\n")[-1])}
    # Committed 2 of 5 on every partition, whichever gateway leads it.
    assert offsets == {p: ["2", str(RECORDS), str(RECORDS - 2)] for p in range(PARTITIONS)}, \
        described

    reset = cli(bootstrap, "groups", "reset-offsets", "--group", groups[2], "--topic",
                topic, "--to-latest", "--execute").stdout
    assert {int(row[2]): row[3] for row in rows(reset)} == dict.fromkeys(
        range(PARTITIONS), str(RECORDS)), reset
    deleted = cli(bootstrap, "groups", "delete-offsets", "--group", groups[2], "--topic",
                  f"{topic}:0").stdout
    assert rows(deleted) == [[topic, "0", "Successful"]], deleted
    again = cli(bootstrap, "groups", "describe", groups[2]).stdout
    offsets = {int(row[1]): row[2:5] for row in rows(again.split("\n\n")[-1])}
    # Reset to the log ends, and partition 0's offset gone (so is its row).
    assert offsets == {p: [str(RECORDS), str(RECORDS), "0"] for p in range(1, PARTITIONS)}, \
        again

    gone = cli(bootstrap, "groups", "delete", groups[3]).stdout
    assert gone.strip() == f"Deleted group {groups[3]}.", gone
    missing = cli(bootstrap, "groups", "describe", groups[3], check=False)
    assert missing.returncode == 1 and "does not exist" in missing.stdout, missing
    assert groups[3] not in {row[0] for row in rows(cli(bootstrap, "groups", "list").stdout)}
    assert_coordinated(cluster, groups, GROUP)


def test_a_gateway_the_cli_cannot_reach_is_reported_and_fails_the_listing(
        cluster: list[GatewayProcess], pg_server: PostgresServer, tmp_path) -> None:
    """Last in the module: a fourth gateway joins, advertising an address
    where nothing listens (Metadata lists it; no client can reach it)."""
    bootstrap = cluster[0]
    fourth = GatewayProcess(tmp_path / "data-4", "--store", pg_server.dsn, "--node-id", "4",
                            "--broker-session-timeout-ms", str(LEASE_MS),
                            "--advertise", "127.0.0.1:1")
    fourth.start()
    try:
        pg_store_mode.check_cluster([g.host_port for g in (*cluster, fourth)], {1, 2, 3, 4},
                                    TIMEOUT)
        slots = settled_slots(pg_server, {1, 2, 3, 4})
        groups = {node: key_led_by(pg_server, "pg-cli-unreached", node) for node in NODES}
        for group in groups.values():
            consumer = Consumer({"bootstrap.servers": bootstrap.bootstrap, "group.id": group,
                                 "enable.auto.commit": False})
            consumer.commit(offsets=[TopicPartition(TOPIC, 0, 1)], asynchronous=False)
            consumer.close()

        for command in (("groups", "list"), ("transactions", "list")):
            result = cli(bootstrap, *command, check=False)
            assert result.returncode == 1, result
            assert "of broker 4 (127.0.0.1:1)" in result.stderr, result
            assert result.stdout.split()[0] in ("GROUP", "TRANSACTIONAL-ID"), result
        listed = {row[0] for row in rows(cli(bootstrap, "groups", "list", check=False).stdout)}
        assert set(groups.values()) <= listed, listed
        assert asyncio.run(slot_leaders(pg_server)) == slots  # the premise: nothing moved
    finally:
        fourth.kill()
