"""pgstore.batch_log: one partition's batches on a throwaway PostgreSQL.

- appends get consecutive offsets, stamped in the stored bytes with the
  writer's leader epoch, one transaction per group; the partition row follows;
- reads by offset range: from the batch holding the offset, within
  max_bytes (the first whatever its size), never at or past ``until``;
  a shifted batch (stored before its commit) has its base offset patched;
- fencing inside the transaction: a moved epoch or log end writes nothing,
  also when two writers race; a write whose outcome is unknown (its
  connection killed) makes the next append reread the partition first.
"""

from __future__ import annotations

import asyncio
import struct
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg
import pytest

from pgstore.batch_log import BatchLog, Fenced, UnknownLog
from pgstore.migrate import migrate
from tablets import batch as batch_header
from testkit import postgres
from testkit.batches import decode_batches, make_batch
from testkit.postgres import PostgresServer

pg_server = postgres.server_fixture("module")
SCHEMA = "batchlog"
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


async def new_partition(pool: asyncpg.Pool, epoch: int = 3) -> int:
    async with pool.acquire() as conn:
        topic_id = uuid.uuid4()
        await conn.execute(f"INSERT INTO {SCHEMA}.topics (topic_id, name, created_ms) "
                           "VALUES ($1, $2, 0)", topic_id, f"t-{topic_id.hex[:8]}")
        return int(await conn.fetchval(
            f"INSERT INTO {SCHEMA}.partitions (topic_id, partition, leader_epoch) "
            "VALUES ($1, 0, $2) RETURNING log_id", topic_id, epoch))


async def row(pool: asyncpg.Pool, log_id: int) -> tuple[int, int, int, int]:
    """(log end, size, index rows, data rows) as the database has them."""
    async with pool.acquire() as conn:
        found = await conn.fetchrow(
            f"SELECT log_end_offset, size_bytes, "
            f"(SELECT count(*) FROM {SCHEMA}.batches WHERE log_id = $1) AS entries, "
            f"(SELECT count(*) FROM {SCHEMA}.batch_data WHERE log_id = $1) AS blobs "
            f"FROM {SCHEMA}.partitions WHERE log_id = $1", log_id)
        assert found is not None
        return (found["log_end_offset"], found["size_bytes"], found["entries"],
                found["blobs"])


def batch(values: int, tag: str, timestamp: int = 1000) -> bytes:
    return make_batch([f"{tag}-{i}".encode() for i in range(values)],
                      base_timestamp=timestamp)


def leader_epoch_of(data: bytes) -> int:
    return int(struct.unpack_from(">i", data, 12)[0])


def test_appends_take_consecutive_offsets_and_read_back(pg_server: PostgresServer) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        log_id = await new_partition(pool, epoch=3)
        log = await BatchLog.open(pool, SCHEMA, log_id)
        first = [batch(3, "a"), batch(1, "b"), batch(5, "c")]
        assert await log.append(first) == [0, 3, 4]
        assert await log.append([batch(2, "d")]) == [9]
        assert log.log_end_offset == 11
        stored = await log.read(0, 1 << 20)
        assert [batch_header.base_offset_of(b) for b in stored] == [0, 3, 4, 9]
        assert {leader_epoch_of(b) for b in stored} == {3}
        decoded = decode_batches(b"".join(stored))
        values = [r["value"] for d in decoded for r in d["records"]]
        assert values == [f"{t}-{i}".encode() for t, n in
                          (("a", 3), ("b", 1), ("c", 5), ("d", 2)) for i in range(n)]
        # Only the offset and the epoch differ from what was produced.
        for sent, got in zip([*first, batch(2, "d")], stored, strict=True):
            assert got[:8] != sent[:8] or batch_header.base_offset_of(got) == 0
            assert got[8:12] == sent[8:12] and got[16:] == sent[16:]
        total = sum(len(b) for b in stored)
        assert await row(pool, log_id) == (11, total, 4, 4)  # each batch's bytes once
        # A writer opened later sees the same log.
        again = await BatchLog.open(pool, SCHEMA, log_id)
        assert (again.log_end_offset, again.leader_epoch) == (11, 3)
        assert await again.read(0, 1 << 20) == stored

    run(pg_server, body)


def test_reads_by_offset_range(pg_server: PostgresServer) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        log = await BatchLog.open(pool, SCHEMA, await new_partition(pool))
        batches = [batch(4, f"r{i}") for i in range(5)]  # offsets 0, 4, 8, 12, 16
        await log.append(batches)
        size = len(batches[0])

        async def bases(offset: int, max_bytes: int, **kw: int | bool) -> list[int]:
            got = await log.read(offset, max_bytes, **kw)  # type: ignore[arg-type]
            return [batch_header.base_offset_of(b) for b in got]

        assert await bases(0, 1 << 20) == [0, 4, 8, 12, 16]
        assert await bases(6, 1 << 20) == [4, 8, 12, 16]  # from the batch holding 6
        assert await bases(19, 1 << 20) == [16]
        assert await bases(20, 1 << 20) == []  # the log end
        assert await bases(5, 2 * size) == [4, 8]  # whole batches within max_bytes
        assert await bases(5, 2 * size + 1) == [4, 8]
        assert await bases(5, 1) == [4]  # the first, whatever its size
        assert await bases(5, 1, min_one=False) == []
        assert await bases(0, 1 << 20, until=12) == [0, 4, 8]  # the high watermark
        assert await bases(0, 1 << 20, until=13) == [0, 4, 8, 12]

    run(pg_server, body)


def test_reads_of_batches_smaller_than_usual_return_less_and_go_on(
        pg_server: PostgresServer) -> None:
    # The rows a read scans are bounded by the recent mean batch size; tiny
    # batches after big ones come back fewer at a time, in order, never lost.
    async def body(pool: asyncpg.Pool) -> None:
        log = await BatchLog.open(pool, SCHEMA, await new_partition(pool))
        big = [make_batch([b"x" * 20_000]) for _ in range(64)]
        await log.append(big)
        tiny = [batch(1, f"t{i}") for i in range(100)]
        await log.append(tiny)
        got = await log.read(64, 64 << 10)
        assert sum(len(b) for b in tiny) < 64 << 10  # all would fit in max_bytes...
        assert 0 < len(got) < len(tiny)  # ...but fewer come back: the bound bites
        offsets: list[int] = []
        offset = 64
        while offset < log.log_end_offset:
            got = await log.read(offset, 64 << 10)
            assert got, f"no progress at {offset}"
            offsets += [batch_header.base_offset_of(b) for b in got]
            offset = offsets[-1] + 1
        assert offsets == list(range(64, 164))
        # A writer opened now takes the mean of the newest batches: all tiny.
        reopened = await BatchLog.open(pool, SCHEMA, log.log_id)
        assert len(await reopened.read(64, 64 << 10)) == len(tiny)

    run(pg_server, body)


def test_a_shifted_batch_reads_with_its_offsets(pg_server: PostgresServer) -> None:
    # The commit of a transaction will move a pending batch, stored with base
    # offset 0, into the log: the index row says shifted, the read patches.
    async def body(pool: asyncpg.Pool) -> None:
        log_id = await new_partition(pool)
        log = await BatchLog.open(pool, SCHEMA, log_id)
        await log.append([batch(2, "plain")])
        pending = batch(3, "txn")
        async with pool.acquire() as conn, conn.transaction():
            data_id = await conn.fetchval(
                f"INSERT INTO {SCHEMA}.batch_data (log_id, data) VALUES ($1, $2) "
                "RETURNING data_id", log_id, pending)
            await conn.execute(
                f"INSERT INTO {SCHEMA}.batches (log_id, base_offset, last_offset, "
                "max_timestamp, running_max_timestamp, size, data_id, shifted) "
                "VALUES ($1, 2, 4, 1000, 1000, $2, $3, true)", log_id, len(pending), data_id)
        got = await log.read(2, 1 << 20, until=5)
        assert [batch_header.base_offset_of(b) for b in got] == [2]
        assert got[0][8:] == pending[8:]

    run(pg_server, body)


def test_a_moved_epoch_fences_the_writer(pg_server: PostgresServer) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        log_id = await new_partition(pool, epoch=7)
        log = await BatchLog.open(pool, SCHEMA, log_id)
        await log.append([batch(2, "before")])
        before = await row(pool, log_id)
        # Another gateway takes the partition over.
        async with pool.acquire() as conn:
            await conn.execute(f"UPDATE {SCHEMA}.partitions SET leader_epoch = 8 "
                               "WHERE log_id = $1", log_id)
        for _ in range(2):  # and stays fenced: it never adopts the new epoch
            with pytest.raises(Fenced, match="leader epoch 8") as fenced:
                await log.append([batch(1, "after")])
            assert fenced.value.leader_epoch == 8
            assert await row(pool, log_id) == before  # nothing written
        # The new leader writes on, at its epoch.
        successor = await BatchLog.open(pool, SCHEMA, log_id)
        assert successor.leader_epoch == 8
        assert await successor.append([batch(1, "new")]) == [2]
        assert {leader_epoch_of(b) for b in await successor.read(2, 1 << 20)} == {8}

    run(pg_server, body)


def test_two_writers_of_one_epoch_never_overlap(pg_server: PostgresServer) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        log_id = await new_partition(pool)
        one = await BatchLog.open(pool, SCHEMA, log_id)
        two = await BatchLog.open(pool, SCHEMA, log_id)
        assert await one.append([batch(2, "one")]) == [0]
        with pytest.raises(Fenced, match="log end 2"):
            await two.append([batch(3, "two")])
        assert await row(pool, log_id) == (2, len(batch(2, "one")), 1, 1)
        # Racing: the row lock orders them; exactly one lands.
        for round_ in range(5):
            outcomes = await asyncio.gather(one.append([batch(1, f"x{round_}")]),
                                            two.append([batch(1, f"y{round_}")]),
                                            return_exceptions=True)
            landed = [o for o in outcomes if not isinstance(o, BaseException)]
            fenced = [o for o in outcomes if isinstance(o, Fenced)]
            assert len(landed) == 1 and len(fenced) == 1, outcomes
        end, _, entries, blobs = await row(pool, log_id)
        assert (end, entries, blobs) == (7, 6, 6)
        offsets = [batch_header.base_offset_of(b) for b in await one.read(0, 1 << 20, until=7)]
        assert offsets == [0, 2, 3, 4, 5, 6]

    run(pg_server, body)


def test_an_append_of_unknown_outcome_rereads_the_partition(
        pg_server: PostgresServer) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        log_id = await new_partition(pool)
        log = await BatchLog.open(pool, SCHEMA, log_id)
        await log.append([batch(1, "first")])
        async with pool.acquire() as holder:
            # Hold the partition row, so the append waits on it; then kill
            # the append's backend: the client cannot know what happened.
            tx = holder.transaction()
            await tx.start()
            await holder.execute(f"SELECT 1 FROM {SCHEMA}.partitions WHERE log_id = $1 "
                                 "FOR UPDATE", log_id)
            appending = asyncio.create_task(log.append([batch(2, "doomed")]))
            waiting = 0
            for _ in range(500):
                # Inside a transaction the activity view is a snapshot: renew it.
                await holder.execute("SELECT pg_stat_clear_snapshot()")
                waiting = await holder.fetchval(
                    "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE '%SET log_end_offset%'")
                if waiting:
                    break
                await asyncio.sleep(0.02)
            assert waiting, "the append never waited on the row lock"
            assert await holder.fetchval("SELECT pg_terminate_backend($1)", waiting)
            with pytest.raises((asyncpg.PostgresError, asyncpg.InterfaceError, OSError)):
                await appending
            await tx.rollback()
        assert await row(pool, log_id) == (1, len(batch(1, "first")), 1, 1)
        # The next append rereads the partition and takes the right offset.
        assert await log.append([batch(1, "next")]) == [1]
        assert (await row(pool, log_id))[0] == 2

    run(pg_server, body)


def test_an_unknown_log_is_refused(pg_server: PostgresServer) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        with pytest.raises(UnknownLog, match="log id 999999"):
            await BatchLog.open(pool, SCHEMA, 999999)

    run(pg_server, body)
