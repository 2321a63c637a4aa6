"""Commits that cross gateways (docs/cluster.md, "Commits that cross
gateways"): two gateway processes on one throwaway PostgreSQL; a
transaction whose coordinator is one gateway commits into partitions the
other leads, and the leader learns of it from the commit's notice.

What a transaction can hold of a partition led elsewhere today: its COMMIT
marker (the partition added, nothing written there through this gateway),
and the batches it wrote while its coordinator's gateway led the partition,
which then moved (a transactional Produce to a leader that is not the
coordinator is refused, docs/cluster.md). So:

- raw commits through node 1 put their markers into partitions node 2
  leads, while a Fetch long-polls node 2 (10 s): it is answered promptly
  (the cross-gateway end-to-end latency, over 50 commits);
- plain produce on node 2 to the same partitions meanwhile: every
  acknowledged record is read back once, at its acknowledged offset, and
  the partition's batches cover each offset exactly once;
- node 2's listening connection killed, and connections to the database
  refused so it cannot come back, while a commit lands: node 2 does not
  move, until its listener is back and its resync rereads what it leads;
- confluent-kafka and the Java client: a transaction writes into node 1's
  partitions, a new gateway joins and takes some of them, the commit
  through node 1 publishes there, and a read_committed consumer
  long-polling the new leader receives the records promptly.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from compaction_helpers import read_partition
from confluent_kafka import Producer
from cross_commit_helpers import (
    DATABASE,
    LEASE_MS,
    LONG_POLL_MS,
    TIMEOUT,
    Reader,
    Staged,
    commit_markers,
    committer,
    coordinated_by,
    create,
    cross_setup,
    join_and_move,
    latest,
    log_listeners,
    settled_leaders,
)
from java_helpers import run_java
from kio.schema.errors import ErrorCode

from kafka_gateway.client import KafkaClient
from testkit import kafka_requests as rq
from testkit import postgres
from testkit.gateway import GatewayProcess
from testkit.pg_cluster import running_cluster
from testkit.postgres import PostgresServer

pg_server = postgres.server_fixture("module")
PROMPT_SECONDS = 3.0  # well under the long-poll: a missing wake-up fails
COMMITS = 50


@pytest.fixture(scope="module")
def cluster(pg_server: PostgresServer, tmp_path_factory) -> Iterator[list[GatewayProcess]]:
    pg_server.psql(f"CREATE DATABASE {DATABASE}")
    base = tmp_path_factory.mktemp("pg-cross")
    with running_cluster(base, pg_server.dsn_of(DATABASE), nodes=(1, 2),
                         lease_ms=LEASE_MS) as gateways:
        yield gateways


def test_a_commit_through_another_gateway_wakes_the_leaders_long_poll(
        cluster: list[GatewayProcess]) -> None:
    topic = "cross-latency"
    transactional_id, led = cross_setup(cluster, topic)
    partition = led[0]

    async def body() -> list[float]:
        raw = await committer(cluster, transactional_id)
        reader = await KafkaClient.connect(*cluster[1].host_port)  # node 2: the leader
        latencies: list[float] = []
        try:
            for index in range(COMMITS + 1):
                poll = asyncio.ensure_future(reader.request(rq.fetch(
                    topic, [(partition, index, 1 << 20)], isolation_level=1,
                    max_wait_ms=LONG_POLL_MS)))
                await asyncio.sleep(0.05)
                assert not poll.done(), "the Fetch did not wait at the log end"
                started = time.monotonic()
                await commit_markers(raw, topic, [partition])
                answer = await asyncio.wait_for(poll, LONG_POLL_MS / 1000 + 10)
                waited = time.monotonic() - started
                data = answer.responses[0].partitions[0]
                assert data.error_code is ErrorCode.none, data.error_code
                assert (data.high_watermark, data.last_stable_offset) == (index + 1, index + 1)
                assert data.records, "woken with nothing to read"
                latencies.append(waited)
        finally:
            await reader.close()
            await raw.close()
        return latencies

    latencies = asyncio.run(asyncio.wait_for(body(), 600))
    p50, worst = statistics.median(latencies), max(latencies)
    print(f"\ncross-gateway commit (EndTxn through node 1) -> Fetch long-polling the leader "
          f"node 2 (max wait {LONG_POLL_MS} ms) answered: p50 {p50 * 1000:.1f} ms, max "
          f"{worst * 1000:.1f} ms over {len(latencies)} commits")
    # Without the notice, each Fetch would wait out its 10 s and see nothing.
    assert worst < PROMPT_SECONDS, [round(x, 3) for x in latencies]


def test_plain_produce_on_the_leader_and_commits_from_another_gateway_interleave(
        cluster: list[GatewayProcess]) -> None:
    topic = "cross-interleave"
    transactional_id, led = cross_setup(cluster, topic)
    acked: dict[bytes, tuple[int, int]] = {}
    failed: list[object] = []
    stop = threading.Event()

    def plain() -> None:
        producer = Producer({"bootstrap.servers": cluster[1].bootstrap,
                             "enable.idempotence": True, "linger.ms": 1})

        def delivered(err: object, message: object) -> None:
            if err is not None:
                failed.append(err)
            else:
                acked[message.value()] = (  # type: ignore[attr-defined]
                    message.partition(), message.offset())  # type: ignore[attr-defined]

        index = 0
        while not stop.is_set() and index < 20_000:
            producer.produce(topic, b"p-%d" % index, partition=led[index % len(led)],
                             on_delivery=delivered)
            index += 1
            if index % 10 == 0:
                producer.poll(0)
                time.sleep(0.002)
        assert producer.flush(TIMEOUT) == 0

    thread = threading.Thread(target=plain)
    thread.start()
    commits = 60

    async def commit_all() -> None:
        raw = await committer(cluster, transactional_id)
        try:
            for _ in range(commits):
                await commit_markers(raw, topic, led)
                await asyncio.sleep(0.01)
        finally:
            await raw.close()

    try:
        asyncio.run(asyncio.wait_for(commit_all(), 300))
    finally:
        stop.set()
        thread.join(TIMEOUT)
    assert failed == [], failed[:5]
    assert len(acked) > 200, len(acked)  # the premise: plain appends ran alongside

    for partition in led:
        records, batches = read_partition(cluster[1], topic, partition)
        mine = {v: po for v, po in acked.items() if po[0] == partition}
        read = Counter(r.value for r in records)
        assert [v for v, n in read.items() if n > 1] == []  # nothing twice
        assert set(read) == set(mine), (len(set(mine) - set(read)), len(set(read) - set(mine)))
        assert {r.value: (partition, r.offset) for r in records} == mine  # where acknowledged
        # The batches cover every offset from 0 exactly once: appends and markers.
        ends = 0
        for base, _control, count in sorted(batches):
            assert base == ends, (partition, base, ends)
            ends = base + count
        assert sum(1 for _, control, _ in batches if control) == commits
    print(f"\ninterleaved on {len(led)} partitions led by node 2: {len(acked)} plain records "
          f"acknowledged by node 2, {commits} commits through node 1 into each; every record "
          "once, every offset once")


def test_the_leader_resyncs_after_losing_its_listening_connection(
        cluster: list[GatewayProcess], pg_server: PostgresServer) -> None:
    topic = "cross-resync"
    transactional_id, led = cross_setup(cluster, topic)
    partition = led[0]

    async def body() -> float:
        admin = await asyncpg.connect(pg_server.dsn)  # the ``postgres`` database, not ours
        raw = await committer(cluster, transactional_id)
        closed = False
        try:
            await commit_markers(raw, topic, [partition])
            started = time.monotonic()
            while await latest(cluster[1], topic, partition) != 1:  # heard at once
                assert time.monotonic() - started < PROMPT_SECONDS
                await asyncio.sleep(0.01)
            listening = await log_listeners(admin)
            assert len(listening) == 2, listening  # one listener per gateway
            await admin.execute(f"ALTER DATABASE {DATABASE} ALLOW_CONNECTIONS false")
            closed = True
            for pid in listening:
                await admin.execute("SELECT pg_terminate_backend($1)", pid)
            await asyncio.sleep(0.5)
            assert await log_listeners(admin) == []  # the fault landed
            await commit_markers(raw, topic, [partition])  # node 1's writer: connected
            await asyncio.sleep(1.5)
            assert await log_listeners(admin) == []  # nobody could listen meanwhile
            assert await latest(cluster[1], topic, partition) == 1, "told with no listener?"
            await admin.execute(f"ALTER DATABASE {DATABASE} ALLOW_CONNECTIONS true")
            closed = False
            reopened = time.monotonic()
            while await latest(cluster[1], topic, partition) != 2:
                assert time.monotonic() - reopened < 15, "the resync did not move the leader"
                await asyncio.sleep(0.02)
            caught_up = time.monotonic() - reopened
            while len(await log_listeners(admin)) != 2:  # the other gateway's too, in time
                assert time.monotonic() - reopened < 15, "a listener did not come back"
                await asyncio.sleep(0.05)
            return caught_up
        finally:
            if closed:
                await admin.execute(f"ALTER DATABASE {DATABASE} ALLOW_CONNECTIONS true")
            await raw.close()
            await admin.close()

    caught_up = asyncio.run(asyncio.wait_for(body(), 120))
    print(f"\nlisteners killed, commit made while none could listen: the leader moved "
          f"{caught_up:.2f} s after connections were allowed again (its resync)")


@pytest.fixture
def java_or_not(request: pytest.FixtureRequest) -> Path | None:
    """The compiled Java programs for the Java variant only (compiling is slow)."""
    if request.node.callspec.params["client"] != "java":
        return None
    classes: Path = request.getfixturevalue("java_classes")
    return classes


@pytest.mark.parametrize("client", ["confluent", "java"])
def test_a_transaction_whose_partitions_moved_to_a_new_gateway_commits_there(
        cluster: list[GatewayProcess], pg_server: PostgresServer, tmp_path: Path,
        client: str, java_or_not: Path | None) -> None:
    """End to end with a stock client (confluent-kafka, the Java client):
    batches written through node 1 while it led their partitions; a new
    gateway joins and takes some; the commit through node 1 publishes
    there, and the new leader's long-polling read_committed consumer gets
    them at once."""
    topic = f"cross-moved-{client}"
    partitions = 12
    create(cluster, topic, partitions)
    nodes = {int(g.extra_args[g.extra_args.index("--node-id") + 1]) for g in cluster}
    before = settled_leaders(cluster, topic, frozenset(nodes), partitions)
    mine = sorted(p for p, node in before.items() if node == 1)
    transactional_id = coordinated_by(cluster, f"{topic}-txn", 1)
    staged = Staged(client, cluster, topic, transactional_id, mine, java_or_not)
    try:
        after = join_and_move(cluster, pg_server, tmp_path, topic, mine)
        moved = [p for p in mine if after[p] != 1]
        assert moved, f"no partition of node 1 moved: {before} -> {after}"  # the premise
        reader = Reader(cluster, topic, mine)
        try:
            time.sleep(2)  # the reader's fetches wait at the leaders
            assert reader.records == []  # nothing committed yet
            started = time.monotonic()
            staged.commit()
            expected = {v for p in moved for v in staged.values[p]}
            deadline = time.monotonic() + TIMEOUT
            while not expected <= set(reader.received) and time.monotonic() < deadline:
                time.sleep(0.002)
            assert expected <= set(reader.received), "the moved partitions' records never came"
            waited = max(reader.received[v] for v in expected) - started
            everything = {v for batch in staged.values.values() for v in batch}
            while set(reader.received) != everything and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(1)
            got = Counter(v for _, _, v in reader.records)
            assert set(got) == everything and max(got.values()) == 1, got
            assert reader.errors == []
        finally:
            reader.close()
    finally:
        staged.close()
    if java_or_not is not None:
        # The Java consumer reads batches stamped with several leader epochs
        # (node 1's, the new leader's) from the start to the end offsets.
        lines = run_java(cluster[0], java_or_not, "ConsumeCheck", "dump", "--topic", topic,
                         "--partitions", str(partitions))
        read = sorted(line["value"] for line in lines if "value" in line)
        assert read == sorted(v.decode() for batch in staged.values.values() for v in batch)
    print(f"\n{client}: commit through node 1 into {len(moved)} partitions now led by "
          f"{sorted({after[p] for p in moved})}: read by the new leaders' long-polling "
          f"read_committed consumer {waited * 1000:.1f} ms after the commit began")
    assert waited < PROMPT_SECONDS, waited
