"""pgstore.retention_sql: the delete retention and DeleteRecords end in, on a
throwaway PostgreSQL.

- exactly the batches wholly below the new log start go, index rows and
  bytes, never one holding it, nor another partition's; the log start moves,
  the partition's size loses the deleted bytes;
- a moved leader epoch deletes nothing (``Fenced``), nor a start past the log
  end (``OffsetOutOfRange``), nor one at or below the log start;
- a read after it starts at the new log start; appends go on;
- ``start_for_size``: Kafka's retention.bytes rule;
- ``vacuum`` makes the deleted space reusable (without it, appends grow the
  TOAST table); migration 3's settings and the foreign key's index are there.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg
import pytest

from pgstore.batch_log import BatchLog, Fenced
from pgstore.migrate import migrate
from pgstore.retention_sql import (
    Deleted,
    OffsetOutOfRange,
    delete_below,
    start_for_size,
    vacuum,
)
from pgstore.schema import TABLE_STORAGE_PARAMETERS
from tablets import batch as batch_header
from testkit import postgres
from testkit.batches import make_batch
from testkit.postgres import PostgresServer

pg_server = postgres.server_fixture("module")
SCHEMA = "retention"
T = TypeVar("T")


def run(pg: PostgresServer, body: Callable[[asyncpg.Pool], Awaitable[T]]) -> T:
    async def main() -> T:
        pool = await asyncpg.create_pool(pg.dsn, min_size=1, max_size=4)
        try:
            async with pool.acquire() as conn:
                await migrate(conn, SCHEMA)
            return await body(pool)
        finally:
            await pool.close()

    return asyncio.run(main())


async def new_log(pool: asyncpg.Pool, epoch: int = 5) -> BatchLog:
    async with pool.acquire() as conn:
        topic_id = uuid.uuid4()
        await conn.execute(f"INSERT INTO {SCHEMA}.topics (topic_id, name, created_ms) "
                           "VALUES ($1, $2, 0)", topic_id, f"t-{topic_id.hex[:8]}")
        log_id = int(await conn.fetchval(
            f"INSERT INTO {SCHEMA}.partitions (topic_id, partition, leader_epoch) "
            "VALUES ($1, 0, $2) RETURNING log_id", topic_id, epoch))
    return await BatchLog.open(pool, SCHEMA, log_id)


def batch(values: int, tag: str) -> bytes:
    return make_batch([f"{tag}-{i}".encode() * 10 for i in range(values)])


async def state(pool: asyncpg.Pool, log_id: int) -> tuple[int, int, list[int], int]:
    """(log start, size, index rows' base offsets, batch_data rows) in the database."""
    async with pool.acquire() as conn:
        found = await conn.fetchrow(
            f"SELECT log_start_offset, size_bytes FROM {SCHEMA}.partitions "
            "WHERE log_id = $1", log_id)
        assert found is not None
        bases = [r["base_offset"] for r in await conn.fetch(
            f"SELECT base_offset FROM {SCHEMA}.batches WHERE log_id = $1 "
            "ORDER BY base_offset", log_id)]
        blobs = int(await conn.fetchval(
            f"SELECT count(*) FROM {SCHEMA}.batch_data WHERE log_id = $1", log_id))
        return found["log_start_offset"], found["size_bytes"], bases, blobs


async def filled(pool: asyncpg.Pool, epoch: int = 5) -> tuple[BatchLog, list[bytes]]:
    """A log of five batches of 4 records: offsets 0-3, 4-7, ..., 16-19."""
    log = await new_log(pool, epoch)
    batches = [batch(4, f"b{i}") for i in range(5)]
    assert await log.append(batches) == [0, 4, 8, 12, 16]
    return log, batches


def test_deletes_exactly_the_batches_wholly_below_the_new_start(
        pg_server: PostgresServer) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        log, batches = await filled(pool)
        other, _ = await filled(pool)  # another partition: untouched
        untouched = await state(pool, other.log_id)
        size = len(batches[0])
        assert await state(pool, log.log_id) == (0, 5 * size, [0, 4, 8, 12, 16], 5)
        async with pool.acquire() as conn:
            # 9 falls inside 8-11: that batch stays whole, 0-3 and 4-7 go.
            deleted = await delete_below(conn, SCHEMA, log.log_id, 5, 9)
        assert deleted == Deleted(log_start_offset=9, batches=2, bytes=2 * size)
        assert await state(pool, log.log_id) == (9, 3 * size, [8, 12, 16], 3)
        async with pool.acquire() as conn:
            # At a batch's base offset: the one before goes, that one stays.
            deleted = await delete_below(conn, SCHEMA, log.log_id, 5, 12)
            assert deleted == Deleted(12, 1, size)
            assert await state(pool, log.log_id) == (12, 2 * size, [12, 16], 2)
            # At the log end: everything goes, the log is empty from 20.
            assert await delete_below(conn, SCHEMA, log.log_id, 5, 20) == \
                Deleted(20, 2, 2 * size)
        assert await state(pool, log.log_id) == (20, 0, [], 0)
        assert await state(pool, other.log_id) == untouched
        # No orphaned bytes anywhere: every batch_data row is some batch's.
        async with pool.acquire() as conn:
            assert await conn.fetchval(
                f"SELECT count(*) FROM {SCHEMA}.batch_data d WHERE NOT EXISTS (SELECT 1 "
                f"FROM {SCHEMA}.batches b WHERE b.log_id = d.log_id "
                "AND b.data_id = d.data_id)") == 0

    run(pg_server, body)


def test_never_backwards_and_never_past_the_log_end(pg_server: PostgresServer) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        log, batches = await filled(pool)
        size = len(batches[0])
        async with pool.acquire() as conn:
            assert await delete_below(conn, SCHEMA, log.log_id, 5, 8) == Deleted(8, 2, 2 * size)
            before = await state(pool, log.log_id)
            # Below or at the log start: nothing to do, the start stays.
            assert await delete_below(conn, SCHEMA, log.log_id, 5, 3) == Deleted(8, 0, 0)
            assert await delete_below(conn, SCHEMA, log.log_id, 5, 8) == Deleted(8, 0, 0)
            with pytest.raises(OffsetOutOfRange, match="past the log end 20"):
                await delete_below(conn, SCHEMA, log.log_id, 5, 21)
        assert await state(pool, log.log_id) == before

    run(pg_server, body)


def test_a_moved_epoch_deletes_nothing(pg_server: PostgresServer) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        log, _ = await filled(pool, epoch=5)
        before = await state(pool, log.log_id)
        async with pool.acquire() as conn:
            await conn.execute(f"UPDATE {SCHEMA}.partitions SET leader_epoch = 6 "
                               "WHERE log_id = $1", log.log_id)
            with pytest.raises(Fenced, match="leader epoch 6") as fenced:
                await delete_below(conn, SCHEMA, log.log_id, 5, 12)
            assert fenced.value.leader_epoch == 6
            assert await state(pool, log.log_id) == before  # nothing deleted, start kept
            # The new leader's retention goes through.
            assert (await delete_below(conn, SCHEMA, log.log_id, 6, 12)).batches == 3

    run(pg_server, body)


def test_a_retention_waits_for_an_epoch_change_in_flight_and_is_fenced_by_it(
        pg_server: PostgresServer) -> None:
    # The fence locks the partition row: a leadership change holding it
    # (uncommitted) makes the delete wait, and once it commits the delete
    # sees the new epoch and deletes nothing.
    async def body(pool: asyncpg.Pool) -> None:
        log, _ = await filled(pool, epoch=5)
        before = await state(pool, log.log_id)
        async with pool.acquire() as mover, pool.acquire() as retainer:
            tx = mover.transaction()
            await tx.start()
            await mover.execute(f"UPDATE {SCHEMA}.partitions SET leader_epoch = 6 "
                                "WHERE log_id = $1", log.log_id)
            deleting = asyncio.create_task(delete_below(retainer, SCHEMA, log.log_id, 5, 12))
            waited = False
            for _ in range(500):
                waited = bool(await pool.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE '%DELETE FROM%'"))
                if waited:
                    break
                await asyncio.sleep(0.02)
            assert waited, "the delete never waited on the partition row"
            await tx.commit()
            with pytest.raises(Fenced, match="leader epoch 6"):
                await deleting
        assert await state(pool, log.log_id) == before

    run(pg_server, body)


def test_a_read_after_it_starts_at_the_new_log_start(pg_server: PostgresServer) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        log, batches = await filled(pool)
        async with pool.acquire() as conn:
            await delete_below(conn, SCHEMA, log.log_id, 5, 9)
        got = await log.read(9, 1 << 20)
        assert [batch_header.base_offset_of(b) for b in got] == [8, 12, 16]
        assert got[0][8:12] == batches[2][8:12] and got[0][16:] == batches[2][16:]
        # From below the log start, the first batch left: nothing deleted comes back.
        got = await log.read(0, 1 << 20)
        assert [batch_header.base_offset_of(b) for b in got] == [8, 12, 16]
        # A writer opened now sees the new log start; appends go on at the end.
        reopened = await BatchLog.open(pool, SCHEMA, log.log_id)
        assert (reopened.log_start_offset, reopened.log_end_offset) == (9, 20)
        assert await reopened.append([batch(2, "after")]) == [20]
        assert [batch_header.base_offset_of(b) for b in await reopened.read(9, 1 << 20)] == \
            [8, 12, 16, 20]

    run(pg_server, body)


def test_start_for_size_keeps_at_least_retention_bytes(pg_server: PostgresServer) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        log, batches = await filled(pool)
        size = len(batches[0])
        async with pool.acquire() as conn:
            assert await start_for_size(conn, SCHEMA, log.log_id, 5 * size) == 0
            assert await start_for_size(conn, SCHEMA, log.log_id, 10 * size) == 0
            # 3 batches and a byte: only the oldest may go (4 would stay under).
            assert await start_for_size(conn, SCHEMA, log.log_id, 3 * size + 1) == 4
            assert await start_for_size(conn, SCHEMA, log.log_id, 3 * size) == 8
            assert await start_for_size(conn, SCHEMA, log.log_id, 0) == 20
            await delete_below(conn, SCHEMA, log.log_id, 5,
                               await start_for_size(conn, SCHEMA, log.log_id, 2 * size))
            assert await state(pool, log.log_id) == (12, 2 * size, [12, 16], 2)
            assert await start_for_size(conn, SCHEMA, log.log_id, 2 * size) == 12

    run(pg_server, body)


def test_the_tables_retention_deletes_from_carry_migration_3s_autovacuum_settings(
        pg_server: PostgresServer) -> None:
    # Migration 3's settings land on the tables and on batch_data's TOAST
    # table (where the bytes, and so the dead space, are).
    async def body(pool: asyncpg.Pool) -> None:
        async with pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT c.relname, c.reloptions, t.reloptions AS toast FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "LEFT JOIN pg_class t ON t.oid = c.reltoastrelid "
                "WHERE n.nspname = $1 AND c.relname IN ('batch_data', 'batches')", SCHEMA)
        found = {r["relname"]: (set(r["reloptions"] or ()), set(r["toast"] or ()))
                 for r in rows}
        expected: dict[str, tuple[set[str], set[str]]] = {}
        for table, settings in TABLE_STORAGE_PARAMETERS.items():
            expected[table] = (
                {f"{k}={v}" for k, v in settings.items() if not k.startswith("toast.")},
                {f"{k.removeprefix('toast.')}={v}" for k, v in settings.items()
                 if k.startswith("toast.")})
        assert found == expected
        assert found["batch_data"][1], "no TOAST setting checked"

    run(pg_server, body)


def test_the_foreign_key_check_of_a_delete_has_its_index(pg_server: PostgresServer) -> None:
    # Deleting a batch_data row checks batches for a row naming it: that
    # lookup must be an index probe on (log_id, data_id), not a walk of the
    # partition's whole index (retention's delete would grow with the square
    # of the log). The planner's choice for the check's own query says so.
    async def body(pool: asyncpg.Pool) -> None:
        log, _ = await filled(pool)
        async with pool.acquire() as conn:
            await conn.execute(f"ANALYZE {SCHEMA}.batches")
            await conn.execute("SET enable_seqscan = off")
            plan = "\n".join(r[0] for r in await conn.fetch(
                f"EXPLAIN SELECT 1 FROM {SCHEMA}.batches WHERE log_id = $1 AND data_id = $2",
                log.log_id, 1))
        assert "batches_by_data" in plan, plan

    run(pg_server, body)


def test_vacuum_makes_the_deleted_space_reusable(pg_server: PostgresServer) -> None:
    # Deleted bytes are dead TOAST chunks: appends after a delete grow the
    # TOAST table until a vacuum has passed; after ``vacuum`` they reuse the
    # space. Autovacuum is off on these tables here, so only ``vacuum`` acts.
    async def body(pool: asyncpg.Pool) -> None:
        schema = "retention_vacuum"
        async with pool.acquire() as conn:
            await migrate(conn, schema)
            for table in ("batch_data", "batches"):
                await conn.execute(f"ALTER TABLE {schema}.{table} SET (autovacuum_enabled = "
                                   "false, toast.autovacuum_enabled = false)")
            topic_id = uuid.uuid4()
            await conn.execute(f"INSERT INTO {schema}.topics (topic_id, name, created_ms) "
                               "VALUES ($1, 'v', 0)", topic_id)
            log_id = await conn.fetchval(
                f"INSERT INTO {schema}.partitions (topic_id, partition) VALUES ($1, 0) "
                "RETURNING log_id", topic_id)
        log = await BatchLog.open(pool, schema, log_id)
        big = [make_batch([os.urandom(60_000)]) for _ in range(32)]  # ~2 MiB, out of line

        async def toast_bytes() -> int:
            async with pool.acquire() as conn:
                return int(await conn.fetchval(
                    "SELECT pg_relation_size(reltoastrelid) FROM pg_class "
                    "WHERE oid = $1::regclass", f"{schema}.batch_data"))

        await log.append(big)
        one = await toast_bytes()
        async with pool.acquire() as conn:
            await delete_below(conn, schema, log_id, 0, log.log_end_offset)
        await log.append(big)  # no vacuum yet: the dead chunks' space is not reused
        assert await toast_bytes() >= 2 * one * 0.95, (await toast_bytes(), one)
        grown = await toast_bytes()
        for _ in range(3):
            async with pool.acquire() as conn:
                await delete_below(conn, schema, log_id, 0, log.log_end_offset)
                await vacuum(conn, schema)
            await log.append(big)
            assert await toast_bytes() <= grown, (await toast_bytes(), grown)

    run(pg_server, body)
