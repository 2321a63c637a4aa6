"""pgstore.membership on a throwaway PostgreSQL, with short leases (1.5 s):

- a start registers a new incarnation (never reused, also after a
  deregistration) with the advertised listeners; live nodes are those whose
  lease is alive by the database's clock;
- the renewal task keeps the lease alive past several lease lengths;
- a newer process of the same node.id takes the row over, and fences what
  the node led (epochs bumped); the older one's next renewal stops it
  (Superseded), reported once;
- a process that stops renewing (a crash) leaves the live set when its lease
  runs out; if it renews after that it is told LeaseExpired and stops;
- a clean stop deregisters at once.

Every wait is bounded; each test has a schema of its own.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg
import pytest

from pgstore.membership import (
    DEFAULT_LEASE_SECONDS,
    LeaseExpired,
    Listener,
    Membership,
    MembershipLost,
    Superseded,
    session_settings,
)
from pgstore.migrate import migrate
from testkit import postgres
from testkit.postgres import PostgresServer

pg_server = postgres.server_fixture("module")
LEASE = 1.5
T = TypeVar("T")


def run(pg: PostgresServer, body: Callable[[asyncpg.Pool, str], Awaitable[T]]) -> T:
    schema = f"members_{uuid.uuid4().hex[:8]}"

    async def main() -> T:
        pool = await asyncpg.create_pool(pg.dsn, min_size=1, max_size=6,
                                         server_settings=session_settings(LEASE))
        try:
            async with pool.acquire() as conn:
                await migrate(conn, schema)
            return await asyncio.wait_for(body(pool, schema), timeout=60)
        finally:
            await pool.close()

    return asyncio.run(main())


def listeners(port: int) -> list[Listener]:
    return [Listener("PLAINTEXT", "127.0.0.1", port),
            Listener("SSL", "gw.example", port + 1, "SSL")]


async def node_row(pool: asyncpg.Pool, schema: str, node_id: int) -> asyncpg.Record | None:
    async with pool.acquire() as conn:
        return await conn.fetchrow(
            f"SELECT incarnation, listeners, lease_expires_at, lease_expires_at > now() AS alive "
            f"FROM {schema}.nodes WHERE node_id = $1", node_id)


async def live_ids(m: Membership) -> list[int]:
    return [n.node_id for n in await m.live_nodes()]


def test_register_renew_and_deregister(pg_server: PostgresServer) -> None:
    async def body(pool: asyncpg.Pool, schema: str) -> None:
        one = Membership(pool, schema, 1, listeners(9092), lease_seconds=LEASE)
        two = Membership(pool, schema, 2, listeners(9192), lease_seconds=LEASE)
        first = await one.start()
        second = await two.start()
        assert second > first  # incarnations from one sequence
        nodes = await one.live_nodes()
        assert [(n.node_id, n.incarnation) for n in nodes] == [(1, first), (2, second)]
        assert nodes[0].listeners == tuple(listeners(9092))
        assert nodes[1].listeners[1] == Listener("SSL", "gw.example", 9193, "SSL")
        # Renewed by its task: alive well past several lease lengths.
        row = await node_row(pool, schema, 1)
        assert row is not None
        started_expiry = row["lease_expires_at"]
        await asyncio.sleep(3 * LEASE)
        row = await node_row(pool, schema, 1)
        assert row is not None and row["alive"], "the lease was not renewed"
        assert (row["lease_expires_at"] - started_expiry).total_seconds() >= 2 * LEASE
        assert one.active and one.lost is None
        assert await live_ids(two) == [1, 2]
        # A clean stop deregisters now, not after the lease.
        await one.stop()
        assert await node_row(pool, schema, 1) is None
        assert await live_ids(two) == [2]
        assert not one.active
        # A new start of node 1 is a new incarnation, never an old one.
        again = Membership(pool, schema, 1, listeners(9092), lease_seconds=LEASE)
        assert await again.start() > second
        await again.stop()
        await two.stop()

    run(pg_server, body)


def test_a_newer_process_of_the_node_supersedes_the_older(pg_server: PostgresServer) -> None:
    async def body(pool: asyncpg.Pool, schema: str) -> None:
        reported: list[MembershipLost] = []
        old = Membership(pool, schema, 5, listeners(9092), lease_seconds=LEASE,
                         on_lost=reported.append)
        old_inc = await old.start()
        # What node 5 leads gets a new epoch when a newer process registers.
        async with pool.acquire() as conn:
            topic = uuid.uuid4()
            await conn.execute(f"INSERT INTO {schema}.topics (topic_id, name, created_ms) "
                               "VALUES ($1, 't', 0)", topic)
            led = await conn.fetchval(
                f"INSERT INTO {schema}.partitions (topic_id, partition, leader_node, "
                "leader_epoch) VALUES ($1, 0, 5, 7) RETURNING log_id", topic)
            other = await conn.fetchval(
                f"INSERT INTO {schema}.partitions (topic_id, partition, leader_node, "
                "leader_epoch) VALUES ($1, 1, 6, 7) RETURNING log_id", topic)
            await conn.execute(f"UPDATE {schema}.coordinator_slots SET leader_node = 5, "
                               "leader_epoch = 3 WHERE slot = 4")
        new = Membership(pool, schema, 5, listeners(9300), lease_seconds=LEASE)
        new_inc = await new.start()
        assert new_inc > old_inc
        async with pool.acquire() as conn:
            epochs = dict(await conn.fetch(
                f"SELECT log_id, leader_epoch FROM {schema}.partitions"))
            assert epochs == {led: 8, other: 7}  # only node 5's moved
            assert await conn.fetchval(f"SELECT leader_epoch FROM {schema}.coordinator_slots "
                                       "WHERE slot = 4") == 4
        # The older one learns at its next renewal, and stops.
        started = time.monotonic()
        lost = await asyncio.wait_for(old.wait_lost(), timeout=10 * LEASE)
        took = time.monotonic() - started
        assert isinstance(lost, Superseded), lost
        assert f"taken over by a newer process (incarnation {new_inc})" in str(lost)
        assert took <= old.renew_interval + 2.0, f"noticed after {took:.2f} s"
        assert reported == [lost] and not old.active
        with pytest.raises(Superseded):
            await old.renew()
        assert reported == [lost]  # reported once
        # The newer one is unharmed, and the older one's stop cannot remove it.
        await old.stop()
        row = await node_row(pool, schema, 5)
        assert row is not None and row["incarnation"] == new_inc and row["alive"]
        assert [(n.node_id, n.listeners[0].port) for n in await new.live_nodes()] == [(5, 9300)]
        await asyncio.sleep(2 * new.renew_interval)
        assert new.active
        await new.stop()
        assert await node_row(pool, schema, 5) is None

    run(pg_server, body)


def test_a_node_that_stops_renewing_leaves_and_cannot_come_back(
        pg_server: PostgresServer) -> None:
    async def body(pool: asyncpg.Pool, schema: str) -> None:
        crashed = Membership(pool, schema, 1, listeners(9092), lease_seconds=LEASE)
        watcher = Membership(pool, schema, 2, listeners(9192), lease_seconds=LEASE)
        await crashed.start()
        await watcher.start()
        assert await live_ids(watcher) == [1, 2]
        halted_at = time.monotonic()
        await crashed.halt()  # no deregistration: the row stays until the lease ends
        row = await node_row(pool, schema, 1)
        assert row is not None
        deadline = halted_at + LEASE + 5
        while 1 in await live_ids(watcher):
            assert time.monotonic() < deadline, "node 1 stayed live past its lease"
            await asyncio.sleep(0.05)
        gone_after = time.monotonic() - halted_at
        print(f"a halted node left the live set after {gone_after:.2f} s (lease {LEASE} s)")
        assert gone_after <= LEASE + 0.5 + 2.0, gone_after
        row = await node_row(pool, schema, 1)
        assert row is not None and not row["alive"]  # still there, expired
        # A renewal after the lease ran out is refused: the incarnation is over.
        with pytest.raises(LeaseExpired, match="ran out"):
            await crashed.renew()
        assert crashed.lost is not None and not crashed.active
        assert await live_ids(watcher) == [2]
        await watcher.stop()

    run(pg_server, body)


def test_settings_and_arguments_are_checked() -> None:
    assert DEFAULT_LEASE_SECONDS == 10.0
    assert session_settings() == {"idle_in_transaction_session_timeout": "2500"}
    assert session_settings(0.4) == {"idle_in_transaction_session_timeout": "200"}
    with pytest.raises(ValueError, match=r"node\.id"):
        Membership(None, "s", -1, [])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lease"):
        Membership(None, "s", 1, [], lease_seconds=0)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="not registered"):
        _ = Membership(None, "s", 1, []).incarnation  # type: ignore[arg-type]
