"""The PostgreSQL engine in a cluster (pgstore.cluster) on a throwaway
PostgreSQL: two gateways' engines in one process share the partitions and
coordinator slots, balanced; appends to a partition led elsewhere raise
NotLeader and store nothing; a topic made or deleted by one is seen by the
other (NOTIFY); a gateway that leaves hands its partitions over, and the
successor opens them where the other left them.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable

import asyncpg
import pytest

from pgstore.cluster import ClusterSettings
from pgstore.engine_seam_check import node as as_node
from pgstore.membership import Listener
from pgstore.node import PgNodeSettings, PgNodeStorage
from tablets.errors import NotLeader, StorageError, TopicAlreadyExists
from testkit import postgres
from testkit.batches import make_batch
from testkit.pg_engines import until
from testkit.postgres import PostgresServer
from txn.producer_ids import ProducerIds

pg_server = postgres.server_fixture("module")
TIMEOUT = 60
LEASE = 1.5


def now() -> int:
    return int(time.time() * 1000)


async def gateway(pg: PostgresServer, schema: str, node_id: int) -> PgNodeStorage:
    node = PgNodeStorage(pg.dsn, PgNodeSettings(
        schema=schema, cluster=ClusterSettings(node_id=node_id, lease_seconds=LEASE)))
    await node.start()
    await node.join_cluster([Listener("PLAINTEXT", f"gw{node_id}", 9000 + node_id)])
    return node


def run(body: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(body(), TIMEOUT)

    asyncio.run(bounded())


def test_two_gateways_share_partitions_see_each_others_topics_and_hand_over(
        pg_server: PostgresServer) -> None:
    schema = f"cluster_{uuid.uuid4().hex[:10]}"

    async def body() -> None:
        a = await gateway(pg_server, schema, 1)
        b = await gateway(pg_server, schema, 2)
        ca, cb = a.cluster(), b.cluster()
        assert ca is not None and cb is not None
        assert as_node(a).cluster() is ca  # the seam's view
        await a.create_topic("t", 4, {})
        # b learns of the topic by NOTIFY, and the two end balanced.
        await until(lambda: b.find_topic("t") is not None, "seen by b", 5)

        def split() -> bool:
            led = [[ca.leads("t", i) for i in range(4)], [cb.leads("t", i) for i in range(4)]]
            return (sum(led[0]) == 2 and sum(led[1]) == 2
                    and all(x != y for x, y in zip(*led, strict=True)))

        await until(split, "two partitions each", 3 * LEASE)

        def agreed() -> bool:  # each view is as of its gateway's last pass
            return all(ca.partition_leader("t", i) == cb.partition_leader("t", i)
                       == (1 if ca.leads("t", i) else 2) for i in range(4))

        await until(agreed, "the same leaders in both views", 3 * LEASE)
        assert [(x.node_id, x.host, x.port) for x in ca.brokers("PLAINTEXT")] == [
            (1, "gw1", 9001), (2, "gw2", 9002)]

        # Appends where led land; elsewhere NotLeader, nothing stored.
        for index in range(4):
            mine, other = (a, b) if ca.leads("t", index) else (b, a)
            result = await mine.partition("t", index).append(make_batch([b"x"]), now())
            assert result.base_offset == 0
            with pytest.raises(NotLeader):
                other.partition("t", index).append(make_batch([b"y"]), now())
        for index in range(4):
            mine = a if ca.leads("t", index) else b
            assert mine.partition("t", index).high_watermark == 1

        # Coordinators: one gateway per key, the same answer from both once
        # the slots are balanced (b joined after a took all 50; new
        # partitions get their leaders at once, so the partitions above can
        # settle before a's pass hands b its slots).
        await until(lambda: any(ca.coordinates(f"g{i}") or cb.coordinates(f"g{i}")
                                for i in range(50)), "slots opened", 3 * LEASE)
        await until(lambda: len(ca.leadership.led_slots) == len(cb.leadership.led_slots) == 25
                    if ca.leadership and cb.leadership else False, "25 slots each", 3 * LEASE)
        for key in ("group-a", "group-b", "txn-1"):
            await until(lambda k=key: ca.coordinator(k) == cb.coordinator(k),
                        f"both views agree on {key}'s coordinator", 3 * LEASE)
            assert ca.coordinator(key) == cb.coordinator(key) in (1, 2)
            await until(lambda k=key: ca.coordinates(k) != cb.coordinates(k),
                        f"{key} coordinated by one", 3 * LEASE)

        # A topic deleted by b is gone from a's catalog.
        await b.create_topic("gone", 1, {})
        await until(lambda: a.find_topic("gone") is not None, "seen by a", 5)
        await b.delete_topic("gone")
        await until(lambda: a.find_topic("gone") is None, "deletion seen by a", 5)

        # a leaves cleanly: b leads everything, from where a left each log.
        await a.close()
        took = await until(lambda: all(cb.leads("t", i) for i in range(4)),
                           "everything led by b", 3 * LEASE)
        for index in range(4):
            log = b.partition("t", index)
            assert log.high_watermark == 1
            result = await log.append(make_batch([b"z"]), now())
            assert result.base_offset == 1
        assert [x.node_id for x in cb.brokers("PLAINTEXT")] == [2]
        print(f"partitions of a cleanly stopped gateway led again after {took:.2f} s")
        await b.close()

    run(body)


def test_producer_ids_handed_out_through_two_gateways_are_never_the_same(
        pg_server: PostgresServer) -> None:
    """Each gateway allocates from the counter it last saw; one that another
    gateway already moved past is refused (retriably), never given twice."""
    schema = f"cluster_{uuid.uuid4().hex[:10]}"

    async def body() -> None:
        a = await gateway(pg_server, schema, 1)
        b = await gateway(pg_server, schema, 2)
        given: list[int] = []
        refused = 0
        for node in (a, b, a, b, b, a):
            ids = ProducerIds(node.transaction_storage())
            for attempt in range(3):  # each allocator starts from the value its gateway saw
                change = node.transaction_storage().begin()
                pid = ids.allocate(change)
                try:
                    await node.transaction_storage().commit(change)
                except StorageError:
                    refused += 1
                    # Only the first attempt after the other gateway moved the
                    # counter: the refusal taught this one where the row is.
                    assert attempt == 0, f"refused again on attempt {attempt}"
                    continue
                given.append(pid)
        assert len(given) == len(set(given)), given
        assert refused > 0  # the premise: gateways did race for the same values
        await a.close()
        await b.close()

    run(body)


def test_new_partitions_have_balanced_leaders_as_soon_as_the_create_is_answered(
        pg_server: PostgresServer) -> None:
    """As Kafka's controller does, the gateway that makes a topic (or adds
    partitions) names a leader for each in the same write: its Metadata view
    has them all, balanced, when the create returns (no pass in between),
    and the other gateway opens its share on the topic's notice. A gateway
    that catches up reads the topics and configs the other just changed."""
    schema = f"cluster_{uuid.uuid4().hex[:10]}"

    async def body() -> None:
        a = await gateway(pg_server, schema, 1)
        b = await gateway(pg_server, schema, 2)
        ca, cb = a.cluster(), b.cluster()
        assert ca is not None and cb is not None
        await until(lambda: ca.brokers("PLAINTEXT") and len(ca.brokers("PLAINTEXT")) == 2,
                    "both live in a's view", 3 * LEASE)
        await a.create_topic("fresh", 4, {})
        leaders = [ca.partition_leader("fresh", i) for i in range(4)]
        assert sorted(leaders) == [1, 1, 2, 2], leaders  # type: ignore[type-var]
        await a.create_partitions("fresh", 6)
        leaders = [ca.partition_leader("fresh", i) for i in range(6)]
        assert sorted(leaders) == [1, 1, 1, 2, 2, 2], leaders  # type: ignore[type-var]
        # What each leads is what was written: a leads its share at once,
        # b opens its share; the views then agree.
        assert all(ca.leads("fresh", i) == (leaders[i] == 1) for i in range(6))
        def b_leads_its_share() -> bool:
            found = b.find_topic("fresh")  # b may know the topic before its new partitions
            return (found is not None and len(found.partitions) == 6
                    and all(cb.leads("fresh", i) == (leaders[i] == 2) for i in range(6)))

        await until(b_leads_its_share, "b leads its share", 3 * LEASE)
        # Configs changed through a are read through b once b catches up
        # (what DescribeConfigs and AlterConfigs do first in a cluster),
        # without waiting for the notice.
        for value in ("7200000", "3600000", "1800000"):
            await a.set_topic_configs("fresh", {"retention.ms": value})
            await cb.catch_up_topics()
            found = b.find_topic("fresh")
            assert found is not None and found.configs == {"retention.ms": value}
        await a.create_topic("made-by-a", 1, {})
        await cb.catch_up_topics()
        assert b.find_topic("made-by-a") is not None
        await a.close()
        await b.close()

    run(body)


def test_a_create_that_loses_to_another_gateways_learns_the_topic(
        pg_server: PostgresServer) -> None:
    """A topic another gateway made whose notice this one missed (read while
    its own create of the name was in flight, and skipped): the create
    answers TopicAlreadyExists, as Kafka, and the gateway knows the topic
    from then on (before, it never learned it until another topic changed,
    and a producer's auto-creating Metadata looped on it for 30 s)."""
    schema = f"cluster_{uuid.uuid4().hex[:10]}"

    async def body() -> None:
        a = await gateway(pg_server, schema, 1)
        # The row as another gateway writes it, with no notice.
        conn = await asyncpg.connect(pg_server.dsn)
        try:
            await conn.execute(
                f'INSERT INTO "{schema}".topics (topic_id, name, configs, created_ms) '
                "VALUES ($1, 'ghost', '{}'::jsonb, 0)", uuid.uuid4())
        finally:
            await conn.close()
        assert a.find_topic("ghost") is None
        with pytest.raises(TopicAlreadyExists):
            await a.create_topic("ghost", 1, {})
        assert a.find_topic("ghost") is not None
        await a.close()

    run(body)
