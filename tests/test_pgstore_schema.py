"""pgstore's schema and its versioned migration at start-up, on a throwaway
PostgreSQL (testkit/postgres.py): from empty, re-run, step by step, a newer
schema refused, a failing migration rolled back whole, and migrators
starting at once (one migrates, the other waits and finds it done).

Each test works in a schema (namespace) of its own on one server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg
import pytest

from pgstore.migrate import (
    LOCK_CLASS,
    MigrationError,
    SchemaTooNew,
    migrate,
    quoted,
    schema_version,
)
from pgstore.schema import COORDINATOR_SLOTS, LATEST, MIGRATIONS, Migration
from testkit import postgres
from testkit.postgres import PostgresServer

pg_server = postgres.server_fixture("module")

T = TypeVar("T")

TABLES = {"schema_migrations", "cluster", "topics", "partitions", "batch_data", "batches",
          "segments", "pending_batches", "producers", "consumer_offsets", "released_offsets",
          "txn_states", "txn_partitions", "counters", "node_records",
          # version 2: the cluster
          "nodes", "coordinator_slots", "group_generations", "group_offset_versions"}
# version 4: offsets staged for a transaction another gateway coordinates
V4_TABLES = {"txn_staged_offsets"}

NEXT = Migration(LATEST + 1, "a test's next step",
                 ("CREATE TABLE {schema}.next_step (id integer PRIMARY KEY)",))


def run(pg: PostgresServer, body: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
    async def main() -> T:
        conn = await asyncpg.connect(pg.dsn)
        try:
            return await body(conn)
        finally:
            await conn.close()

    return asyncio.run(main())


async def tables(conn: asyncpg.Connection, schema: str) -> set[str]:
    rows = await conn.fetch(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = $1", schema)
    return {row["table_name"] for row in rows}


def test_migration_from_empty_makes_every_table(pg_server: PostgresServer) -> None:
    async def body(conn: asyncpg.Connection) -> None:
        assert await schema_version(conn, "fresh") == 0
        result = await migrate(conn, "fresh")
        assert (result.before, result.after) == (0, LATEST)
        assert result.applied == tuple(range(1, LATEST + 1))
        assert await schema_version(conn, "fresh") == LATEST
        assert await tables(conn, "fresh") == TABLES | V4_TABLES
        # Record bytes are stored out of line, uncompressed (STORAGE EXTERNAL).
        storage = await conn.fetchval(
            "SELECT attstorage FROM pg_attribute WHERE attrelid = 'fresh.batch_data'::regclass "
            "AND attname = 'data'")
        assert storage == b"e"  # a "char"
        cluster_id = await conn.fetchval("SELECT cluster_id FROM fresh.cluster")
        assert len(cluster_id) == 22 and set(cluster_id) <= set(
            "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
        descriptions = await conn.fetch(
            "SELECT version, description FROM fresh.schema_migrations ORDER BY version")
        assert [(r["version"], r["description"]) for r in descriptions] == [
            (m.version, m.description) for m in MIGRATIONS]

    run(pg_server, body)


def test_the_schema_enforces_what_the_engine_relies_on(pg_server: PostgresServer) -> None:
    async def body(conn: asyncpg.Connection) -> None:
        await migrate(conn, "rules")
        topic = await conn.fetchval(
            "INSERT INTO rules.topics (topic_id, name, created_ms) "
            "VALUES (gen_random_uuid(), 't', 0) RETURNING topic_id")
        log_id = await conn.fetchval(
            "INSERT INTO rules.partitions (topic_id, partition) VALUES ($1, 0) "
            "RETURNING log_id", topic)
        # An index row must name bytes that exist.
        with pytest.raises(asyncpg.ForeignKeyViolationError):
            await conn.execute(
                "INSERT INTO rules.batches (log_id, base_offset, last_offset, max_timestamp, "
                "running_max_timestamp, size, data_id) VALUES ($1, 0, 0, 0, 0, 1, 12345)",
                log_id)
        data_id = await conn.fetchval(
            "INSERT INTO rules.batch_data (log_id, data) VALUES ($1, $2) RETURNING data_id",
            log_id, b"x" * 100)
        await conn.execute(
            "INSERT INTO rules.batches (log_id, base_offset, last_offset, max_timestamp, "
            "running_max_timestamp, size, data_id) VALUES ($1, 0, 0, 0, 0, 100, $2)",
            log_id, data_id)
        with pytest.raises(asyncpg.CheckViolationError):
            await conn.execute("UPDATE rules.partitions SET log_start_offset = 5 "
                               "WHERE log_id = $1", log_id)
        # Deleting the topic deletes its partitions, their index and their bytes.
        await conn.execute("DELETE FROM rules.topics WHERE topic_id = $1", topic)
        for table in ("partitions", "batches", "batch_data"):
            assert await conn.fetchval(f"SELECT count(*) FROM rules.{table}") == 0, table

    run(pg_server, body)


def test_a_second_run_changes_nothing(pg_server: PostgresServer) -> None:
    async def body(conn: asyncpg.Connection) -> None:
        await migrate(conn, "again")
        cluster_id = await conn.fetchval("SELECT cluster_id FROM again.cluster")
        result = await migrate(conn, "again")
        assert (result.before, result.after, result.applied) == (LATEST, LATEST, ())
        assert await conn.fetchval("SELECT cluster_id FROM again.cluster") == cluster_id
        assert await conn.fetchval("SELECT count(*) FROM again.cluster") == 1
        assert await conn.fetchval("SELECT count(*) FROM again.schema_migrations") == LATEST

    run(pg_server, body)


def test_a_later_version_applies_only_the_new_step(pg_server: PostgresServer) -> None:
    async def body(conn: asyncpg.Connection) -> None:
        await migrate(conn, "stepwise")
        result = await migrate(conn, "stepwise", (*MIGRATIONS, NEXT))
        assert (result.before, result.after, result.applied) == (LATEST, LATEST + 1,
                                                                   (LATEST + 1,))
        assert await tables(conn, "stepwise") == TABLES | V4_TABLES | {"next_step"}

    run(pg_server, body)


def test_a_newer_schema_is_refused_with_a_clear_message(pg_server: PostgresServer) -> None:
    async def body(conn: asyncpg.Connection) -> None:
        await migrate(conn, "newer", (*MIGRATIONS, NEXT))
        with pytest.raises(SchemaTooNew) as refused:
            await migrate(conn, "newer")
        message = str(refused.value)
        assert f"at version {LATEST + 1}" in message
        assert f"newer than this gateway's {LATEST}" in message
        assert "upgrade" in message
        assert await schema_version(conn, "newer") == LATEST + 1  # untouched

    run(pg_server, body)


def test_a_failing_migration_leaves_nothing_of_itself(pg_server: PostgresServer) -> None:
    broken = Migration(LATEST + 1, "half good", (
        "CREATE TABLE {schema}.first_half (id integer)",
        "CREATE TABLE {schema}.first_half (id integer)",  # fails: exists
    ))

    async def body(conn: asyncpg.Connection) -> None:
        await migrate(conn, "broken")
        with pytest.raises(asyncpg.DuplicateTableError):
            await migrate(conn, "broken", (*MIGRATIONS, broken))
        assert await schema_version(conn, "broken") == LATEST
        assert "first_half" not in await tables(conn, "broken")
        # Nor from empty: the whole first run is one transaction.
        with pytest.raises(asyncpg.DuplicateTableError):
            await migrate(conn, "broken_fresh", (*MIGRATIONS, broken))
        assert await conn.fetchval(
            "SELECT count(*) FROM pg_namespace WHERE nspname = 'broken_fresh'") == 0

    run(pg_server, body)


async def _lock_waiters(conn: asyncpg.Connection, schema: str) -> tuple[int, int]:
    """(granted, waiting) holders of the schema's migration lock."""
    rows = await conn.fetch(
        "SELECT granted FROM pg_locks WHERE locktype = 'advisory' AND classid = $1 "
        "AND objid = hashtext($2)::oid AND objsubid = 2", LOCK_CLASS, schema)
    return (sum(1 for r in rows if r["granted"]), sum(1 for r in rows if not r["granted"]))


async def _until(check: Callable[[], Awaitable[bool]], what: str, within: float = 30) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not await check():
        assert loop.time() < deadline, f"not within {within} s: {what}"
        await asyncio.sleep(0.02)


def test_two_migrators_at_once_one_migrates_the_other_waits(pg_server: PostgresServer) -> None:
    # The first migrator's last step sleeps, holding the lock, so the second
    # certainly arrives while it works.
    slow = Migration(LATEST + 1, "slow", ("SELECT pg_sleep(1.5)",
                                          "CREATE TABLE {schema}.slow_done (id integer)"))
    steps = (*MIGRATIONS, slow)

    async def body(watcher: asyncpg.Connection) -> None:
        first_conn = await asyncpg.connect(pg_server.dsn)
        second_conn = await asyncpg.connect(pg_server.dsn)
        try:
            first = asyncio.create_task(migrate(first_conn, "racing", steps))
            await _until(lambda: _held(watcher, "racing", (1, 0)), "the first holds the lock")
            second = asyncio.create_task(migrate(second_conn, "racing", steps))
            await _until(lambda: _held(watcher, "racing", (1, 1)), "the second waits")
            done_first, done_second = await first, await second
        finally:
            await first_conn.close()
            await second_conn.close()
        assert done_first.applied == tuple(range(1, LATEST + 2))
        assert (done_second.before, done_second.applied) == (LATEST + 1, ())
        assert await conn_count(watcher, "racing") == LATEST + 1

    run(pg_server, body)


async def _held(conn: asyncpg.Connection, schema: str, expected: tuple[int, int]) -> bool:
    return await _lock_waiters(conn, schema) == expected


async def conn_count(conn: asyncpg.Connection, schema: str) -> int:
    return int(await conn.fetchval(f"SELECT count(*) FROM {quoted(schema)}.schema_migrations"))


def test_migrators_racing_from_empty_apply_each_step_once(pg_server: PostgresServer) -> None:
    async def body(_conn: asyncpg.Connection) -> None:
        conns = [await asyncpg.connect(pg_server.dsn) for _ in range(4)]
        try:
            results = await asyncio.gather(*(migrate(c, "stampede") for c in conns))
        finally:
            for c in conns:
                await c.close()
        applied = sorted(r.applied for r in results)
        assert applied == [(), (), (), tuple(range(1, LATEST + 1))]
        assert {r.after for r in results} == {LATEST}
        assert await conn_count(_conn, "stampede") == LATEST

    run(pg_server, body)


def test_a_migrator_stuck_behind_another_gives_up_clearly(pg_server: PostgresServer) -> None:
    async def body(holder: asyncpg.Connection) -> None:
        waiter = await asyncpg.connect(pg_server.dsn)
        try:
            async with holder.transaction():
                await holder.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))",
                                     LOCK_CLASS, "stuck")
                with pytest.raises(MigrationError, match="another gateway has been migrating"):
                    await migrate(waiter, "stuck", wait_seconds=0.3)
            assert await schema_version(waiter, "stuck") == 0  # nothing was made
            assert (await migrate(waiter, "stuck")).applied  # free now: it migrates
        finally:
            await waiter.close()

    run(pg_server, body)


def test_names_and_numbering_are_checked() -> None:
    for bad in ("Upper", "1st", "semi;colon", 'quo"te', "", "x" * 64):
        with pytest.raises(ValueError, match="schema name"):
            quoted(bad)
    assert quoted("kafka_gateway") == '"kafka_gateway"'

    async def body(conn: asyncpg.Connection) -> None:
        with pytest.raises(ValueError, match="numbered"):
            await migrate(conn, "gaps", (MIGRATIONS[0], Migration(3, "gap", ())))

    asyncio.run(body(None))  # type: ignore[arg-type]  # refused before any use of conn


def test_version_2_comes_over_version_1_keeping_its_data(pg_server: PostgresServer) -> None:
    async def body(conn: asyncpg.Connection) -> None:
        first = await migrate(conn, "upgraded", MIGRATIONS[:1])
        assert (first.after, first.applied) == (1, (1,))
        topic = await conn.fetchval(
            "INSERT INTO upgraded.topics (topic_id, name, created_ms) "
            "VALUES (gen_random_uuid(), 'kept', 0) RETURNING topic_id")
        await conn.execute(
            "INSERT INTO upgraded.partitions (topic_id, partition, leader_epoch, "
            "log_end_offset) SELECT $1, p, 4, 10 * p FROM generate_series(0, 2) p", topic)
        await conn.execute(
            "INSERT INTO upgraded.consumer_offsets (group_id, topic, partition, "
            "committed_offset, leader_epoch, metadata, commit_timestamp, version) "
            "VALUES ('g', 'kept', 0, 7, 4, '', 0, 3)")
        cluster_id = await conn.fetchval("SELECT cluster_id FROM upgraded.cluster")
        second = await migrate(conn, "upgraded", MIGRATIONS[:2])
        assert (second.before, second.after, second.applied) == (1, 2, (2,))
        assert await tables(conn, "upgraded") == TABLES
        # What version 1 held is there, unchanged; the new column is empty.
        rows = await conn.fetch("SELECT partition, leader_epoch, log_end_offset, leader_node "
                                "FROM upgraded.partitions ORDER BY partition")
        assert [tuple(r) for r in rows] == [(0, 4, 0, None), (1, 4, 10, None),
                                            (2, 4, 20, None)]
        assert await conn.fetchval("SELECT committed_offset FROM upgraded.consumer_offsets"
                                   ) == 7
        assert await conn.fetchval("SELECT cluster_id FROM upgraded.cluster") == cluster_id
        # The coordinator slots, each leaderless at epoch 0.
        slots = await conn.fetch("SELECT slot, leader_node, leader_epoch "
                                 "FROM upgraded.coordinator_slots ORDER BY slot")
        assert [tuple(r) for r in slots] == [(s, None, 0) for s in range(COORDINATOR_SLOTS)]
        # On to the latest, then again: nothing to do.
        latest = await migrate(conn, "upgraded")
        assert (latest.before, latest.applied) == (2, tuple(range(3, LATEST + 1)))
        third = await migrate(conn, "upgraded")
        assert (third.before, third.applied) == (LATEST, ())
        assert await conn.fetchval("SELECT count(*) FROM upgraded.coordinator_slots"
                                   ) == COORDINATOR_SLOTS

    run(pg_server, body)


def test_version_2_enforces_the_cluster_rules(pg_server: PostgresServer) -> None:
    async def body(conn: asyncpg.Connection) -> None:
        await migrate(conn, "cluster_rules")
        # A group's generation never goes back, whoever writes it.
        await conn.execute("INSERT INTO cluster_rules.group_generations VALUES ('g', 5)")
        await conn.execute("UPDATE cluster_rules.group_generations SET generation = 6")
        with pytest.raises(asyncpg.CheckViolationError, match="generation 6 would go back"):
            await conn.execute("UPDATE cluster_rules.group_generations SET generation = 2")
        assert await conn.fetchval("SELECT generation FROM cluster_rules.group_generations"
                                   ) == 6
        # Incarnations come from a sequence: never the same twice.
        values = [await conn.fetchval("SELECT nextval('cluster_rules.node_incarnations')")
                  for _ in range(3)]
        assert values == sorted(set(values))
        with pytest.raises(asyncpg.CheckViolationError):
            await conn.execute("INSERT INTO cluster_rules.nodes (node_id, incarnation, "
                               "lease_expires_at) VALUES (-1, 1, now())")

    run(pg_server, body)
