"""pgstore.group_counters on a throwaway PostgreSQL:

- a group's generation goes 1, 2, 3..., is read back by another connection
  (a new coordinator), and never goes back (advance keeps the higher);
- the offset version moves only inside a transaction; two transactions
  moving one group's counter serialise on its row: the second waits (seen
  waiting on a lock in pg_stat_activity) and, once the first commits, gets
  the first's number plus one; after a rollback it gets the same number the
  rolled-back one had; this holds for a new group's first row too;
- what that is for: two transactions committing overlapping offsets of one
  group, each checking the rows it locks against the version it began
  from: exactly one wins, every time.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg
import pytest

from pgstore.group_counters import GroupCounters, NotInTransaction
from pgstore.migrate import migrate
from testkit import postgres
from testkit.postgres import PostgresServer

pg_server = postgres.server_fixture("module")
SCHEMA = "counters"
COUNTERS = GroupCounters(SCHEMA)
T = TypeVar("T")


def run(pg: PostgresServer, body: Callable[[asyncpg.Pool], Awaitable[T]]) -> T:
    async def main() -> T:
        pool = await asyncpg.create_pool(pg.dsn, min_size=3, max_size=6)
        try:
            async with pool.acquire() as conn:
                await migrate(conn, SCHEMA)
            return await asyncio.wait_for(body(pool), timeout=60)
        finally:
            await pool.close()

    return asyncio.run(main())


def group() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


async def waits_on_a_lock(watcher: asyncpg.Connection, pid: int, within: float = 10) -> None:
    """Returns once backend ``pid`` waits on a lock; fails after ``within`` s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while await watcher.fetchval("SELECT wait_event_type FROM pg_stat_activity "
                                 "WHERE pid = $1", pid) != "Lock":
        assert loop.time() < deadline, f"backend {pid} never waited on a lock"
        await asyncio.sleep(0.02)


def test_generations_go_on_and_never_back(pg_server: PostgresServer) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        g = group()
        async with pool.acquire() as one, pool.acquire() as other:
            assert await COUNTERS.generation(one, g) == 0
            assert [await COUNTERS.next_generation(one, g) for _ in range(3)] == [1, 2, 3]
            # Another gateway (a new coordinator) goes on from there.
            assert await COUNTERS.generation(other, g) == 3
            assert await COUNTERS.next_generation(other, g) == 4
            assert await COUNTERS.advance_generation(other, g, 2) == 4  # not back
            assert await COUNTERS.advance_generation(one, g, 9) == 9
            assert await COUNTERS.generation(one, g) == 9
            fresh = group()
            assert await COUNTERS.advance_generation(one, fresh, 5) == 5
            with pytest.raises(ValueError, match="negative"):
                await COUNTERS.advance_generation(one, fresh, -1)
            # A rolled-back bump leaves nothing.
            tx = one.transaction()
            await tx.start()
            assert await COUNTERS.next_generation(one, g) == 10
            await tx.rollback()
            assert await COUNTERS.generation(other, g) == 9

    run(pg_server, body)


def test_the_offset_version_moves_only_in_a_transaction(pg_server: PostgresServer) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        g = group()
        async with pool.acquire() as conn:
            with pytest.raises(NotInTransaction, match="inside the transaction"):
                await COUNTERS.next_offset_version(conn, g)
            assert await COUNTERS.offset_version(conn, g) == 0
            for expected in (1, 2):
                async with conn.transaction():
                    assert await COUNTERS.next_offset_version(conn, g) == expected
            assert await COUNTERS.offset_version(conn, g) == 2

    run(pg_server, body)


@pytest.mark.parametrize("existing", [True, False], ids=["existing group", "new group"])
@pytest.mark.parametrize("first_ends", ["commit", "rollback"])
def test_two_transactions_moving_one_groups_counter_serialise(
        pg_server: PostgresServer, existing: bool, first_ends: str) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        g = group()
        async with pool.acquire() as first, pool.acquire() as second, \
                pool.acquire() as watcher:
            if existing:
                for _ in range(4):
                    async with first.transaction():
                        await COUNTERS.next_offset_version(first, g)
            start = await COUNTERS.offset_version(watcher, g)
            tx1 = first.transaction()
            await tx1.start()
            assert await COUNTERS.next_offset_version(first, g) == start + 1

            async def second_commit() -> int:
                async with second.transaction():
                    return await COUNTERS.next_offset_version(second, g)

            racing = asyncio.create_task(second_commit())
            await waits_on_a_lock(watcher, second.get_server_pid())
            assert not racing.done()  # it waits for the first to end
            if first_ends == "commit":
                await tx1.commit()
                assert await racing == start + 2  # it saw the first's number
            else:
                await tx1.rollback()
                assert await racing == start + 1  # the rolled-back number, once
            assert await COUNTERS.offset_version(watcher, g) == await racing

    run(pg_server, body)


def test_overlapping_offset_commits_through_two_gateways_exactly_one_wins(
        pg_server: PostgresServer) -> None:
    # The shape of the commit the engine makes (the check itself belongs to
    # the offsets' code): the version a committer began from, the counter
    # moved first, the offsets' rows locked, any row written since that
    # version is a conflict and the commit rolls back.
    async def commit(conn: asyncpg.Connection, g: str, begin: int, offset: int,
                     ready: asyncio.Event, go: asyncio.Event) -> bool:
        async with conn.transaction():
            ready.set()
            await go.wait()
            version = await COUNTERS.next_offset_version(conn, g)
            rows = await conn.fetch(
                f"SELECT version FROM {SCHEMA}.consumer_offsets WHERE group_id = $1 "
                "AND topic = 't' AND partition = ANY($2::integer[]) FOR UPDATE", g, [0, 1])
            if any(r["version"] > begin for r in rows):
                raise _Conflict
            await conn.executemany(
                f"INSERT INTO {SCHEMA}.consumer_offsets (group_id, topic, partition, "
                "committed_offset, leader_epoch, metadata, commit_timestamp, version) "
                "VALUES ($1, 't', $2, $3, -1, '', 0, $4) ON CONFLICT (group_id, topic, "
                "partition) DO UPDATE SET committed_offset = EXCLUDED.committed_offset, "
                "version = EXCLUDED.version",
                [(g, p, offset, version) for p in (0, 1)])
        return True

    async def body(pool: asyncpg.Pool) -> None:
        for round_ in range(10):
            g = group()
            async with pool.acquire() as a, pool.acquire() as b, pool.acquire() as w:
                begin = await COUNTERS.offset_version(w, g)
                ready_a, ready_b, go = asyncio.Event(), asyncio.Event(), asyncio.Event()
                tasks = [asyncio.create_task(commit(a, g, begin, 100, ready_a, go)),
                         asyncio.create_task(commit(b, g, begin, 200, ready_b, go))]
                await ready_a.wait()
                await ready_b.wait()  # both inside their transactions
                go.set()
                outcomes = await asyncio.gather(*tasks, return_exceptions=True)
                wins = [o for o in outcomes if o is True]
                conflicts = [o for o in outcomes if isinstance(o, _Conflict)]
                assert len(wins) == 1 and len(conflicts) == 1, (round_, outcomes)
                offsets = {r["committed_offset"] for r in await w.fetch(
                    f"SELECT committed_offset FROM {SCHEMA}.consumer_offsets "
                    "WHERE group_id = $1", g)}
                winner = 100 if outcomes[0] is True else 200
                assert offsets == {winner}  # the winner's rows, both, nothing of the loser
                assert await COUNTERS.offset_version(w, g) == begin + 1

    run(pg_server, body)


class _Conflict(Exception):
    """The offset-range check refused the commit."""
