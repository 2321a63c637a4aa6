"""The PostgreSQL store behind the seam (pgstore.node, pgstore.partition_log)
on a throwaway PostgreSQL: appends, reads, idempotent producers, time
lookups, DeleteRecords and retention, a write whose outcome is unknown.

Each test uses a schema of its own on one server.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg
import pytest

from pgstore import truncation
from pgstore.node import PgNodeSettings, PgNodeStorage
from pgstore.writer import OutcomeUnknown, PgWriter, StoreUnavailable
from tablets import batch as batch_header
from tablets.errors import (
    InvalidProducerEpoch,
    InvalidRecord,
    OffsetOutOfRange,
    OutOfOrderSequence,
    PolicyViolation,
    RecordTooLarge,
    StorageError,
    UnknownPartition,
    UnknownProducerId,
    UnsupportedRecordKind,
)
from testkit import postgres
from testkit.batches import GZIP, decode_batches, make_batch
from testkit.pg_faults import FlakyConnection, flaky
from testkit.postgres import PostgresServer
from testkit.tail_budget import reshared

pg_server = postgres.server_fixture("module")
T = TypeVar("T")
TIMEOUT = 60


def schema() -> str:
    return f"eng_{uuid.uuid4().hex[:10]}"


def now() -> int:
    return int(time.time() * 1000)


def batch(count: int = 1, ts: int | None = None, **kw: int) -> bytes:
    return make_batch([b"v%d" % i for i in range(count)],
                      base_timestamp=now() if ts is None else ts, **kw)


async def started(pg: PostgresServer, name: str, **settings: int) -> PgNodeStorage:
    node = PgNodeStorage(pg.dsn, PgNodeSettings(schema=name, **settings))  # type: ignore[arg-type]
    await node.start()
    return node


def run(body: Callable[[], Awaitable[T]]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(body(), TIMEOUT)

    return asyncio.run(bounded())


async def db(pg: PostgresServer, sql: str, *args: object) -> object:
    conn = await asyncpg.connect(pg.dsn)
    try:
        return await conn.fetchval(sql, *args)
    finally:
        await conn.close()


def test_appends_take_offsets_in_order_and_read_back_from_the_tail_and_the_database(
        pg_server: PostgresServer) -> None:
    name = schema()

    async def body() -> None:
        node = await started(pg_server, name)
        await node.create_topic("t", 1, {})
        log = node.partition("t", 0)
        assert (await log.read(0, 1 << 20)).batches == []  # read: it keeps a tail
        await reshared(node.catalog.tail_budget)
        waiter = log.waiter()
        results = await asyncio.gather(*(log.append(batch(3), now()) for _ in range(5)))
        assert [r.base_offset for r in results] == [0, 3, 6, 9, 12]
        assert waiter.done()  # woken by a durable append
        assert (log.log_end_offset, log.high_watermark) == (15, 15)
        assert len(log.tail) == 5  # the premise: the read below is the tail's
        tail = await log.read(0, 1 << 20)
        stored = [d["base_offset"] for b in tail.batches
                  for d in decode_batches(bytes(b))]  # type: ignore[arg-type]
        assert stored == [0, 3, 6, 9, 12]
        assert await log.read(15, 1 << 20) == type(tail)([], 15, 0)
        with pytest.raises(OffsetOutOfRange):
            await log.read(16, 1 << 20)
        size = log.size_bytes
        await node.close()
        assert await db(pg_server, f"SELECT count(*) FROM {name}.batches") == 5

        # A restart: state from the rows, reads from PostgreSQL (no tail yet).
        node = await started(pg_server, name)
        log = node.partition("t", 0)
        assert (log.log_end_offset, log.high_watermark, log.size_bytes) == (15, 15, size)
        assert len(log.tail) == 0
        again = await log.read(4, 1 << 20)
        assert [bytes(b) for b in again.batches] == [bytes(b) for b in tail.batches][1:]
        one = await log.read(0, 10)  # smaller than a batch: the first one whole
        assert len(one.batches) == 1
        assert (await log.append(batch(), now())).base_offset == 15
        await node.close()

    run(body)


def test_a_compressed_batch_checked_off_the_loop_keeps_its_place_in_arrival_order(
        pg_server: PostgresServer) -> None:
    async def body() -> None:
        node = await started(pg_server, schema())
        await node.create_topic("t", 1, {})
        log = node.partition("t", 0)
        squeezed = make_batch([b"z" * 1000] * 50, base_timestamp=now(), codec=GZIP)
        results = await asyncio.gather(log.append(squeezed, now()), log.append(batch(2), now()))
        assert [r.base_offset for r in results] == [0, 50]
        garbage = make_batch([b"v"], base_timestamp=now(), codec=GZIP, records=b"\x07garbage")
        refused = await asyncio.gather(log.append(garbage, now()), log.append(batch(), now()),
                                       return_exceptions=True)
        assert type(refused[0]) is InvalidRecord and refused[1].base_offset == 52  # type: ignore[union-attr]
        assert log.log_end_offset == 53
        await node.close()

    run(body)


def test_checks_and_log_append_time(pg_server: PostgresServer) -> None:
    async def body() -> None:
        node = await started(pg_server, schema())
        await node.create_topic("small", 1, {"max.message.bytes": "200"})
        await node.create_topic("lat", 1, {"message.timestamp.type": "LogAppendTime"})
        with pytest.raises(RecordTooLarge):
            node.partition("small", 0).append(make_batch([b"x" * 300]), now())
        with pytest.raises(UnsupportedRecordKind):  # outside a transaction
            node.partition("small", 0).append(
                batch(producer_id=1, producer_epoch=0, base_sequence=0,
                      attributes=batch_header.ATTR_TRANSACTIONAL), now())
        log = node.partition("lat", 0)
        stamp = now() + 5000
        result = await log.append(batch(2, ts=1000), stamp)
        assert result.log_append_time == stamp
        [stored] = (await log.read(0, 1 << 20)).batches
        assert batch_header.max_timestamp_of(bytes(stored)) == stamp
        assert node.partition("small", 0).log_end_offset == 0  # nothing of the refused
        await node.close()

    run(body)


def test_idempotent_producers_dedup_and_sequence_errors_survive_a_restart(
        pg_server: PostgresServer) -> None:
    name = schema()

    def produced(seq: int, count: int = 2, epoch: int = 0, pid: int = 7) -> bytes:
        return batch(count, producer_id=pid, producer_epoch=epoch, base_sequence=seq)

    async def body() -> None:
        node = await started(pg_server, name)
        await node.create_topic("t", 1, {})
        log = node.partition("t", 0)
        first = await log.append(produced(0), now())
        second = await log.append(produced(2), now())
        retry = await log.append(produced(0), now())
        assert (first.base_offset, second.base_offset, retry.base_offset) == (0, 2, 0)
        assert log.log_end_offset == 4
        with pytest.raises(OutOfOrderSequence):
            await log.append(produced(9), now())
        with pytest.raises(UnknownProducerId):
            await log.append(produced(5, pid=8), now())
        [(pid, state)] = log.producers.items()
        assert (pid, state.epoch, state.last_seq) == (7, 0, 3)
        await node.close()
        assert await db(pg_server, f"SELECT count(*) FROM {name}.batches") == 2

        node = await started(pg_server, name)
        log = node.partition("t", 0)
        assert (await log.append(produced(2), now())).base_offset == 2  # still a retry
        assert log.log_end_offset == 4
        await log.append(produced(0, epoch=1), now())  # a new epoch starts at 0
        with pytest.raises(InvalidProducerEpoch):
            await log.append(produced(4, epoch=0), now())
        assert node.producer_stats() == (1, 0)
        await node.close()

    run(body)


def test_offsets_by_time(pg_server: PostgresServer) -> None:
    async def body() -> None:
        node = await started(pg_server, schema())
        await node.create_topic("t", 1, {})
        log = node.partition("t", 0)
        base = now() - 100_000
        for i, ts in enumerate([base, base + 3000, base + 1000, base + 5000]):
            await log.append(make_batch([b"a", b"b"], base_timestamp=ts,
                                        timestamp_deltas=[0, 10]), now())
            assert log.log_end_offset == 2 * (i + 1)
        assert await log.offset_for_timestamp(base + 5) == (1, base + 10)
        assert await log.offset_for_timestamp(base + 2000) == (2, base + 3000)
        assert await log.offset_for_timestamp(base + 4000) == (6, base + 5000)
        assert await log.offset_for_timestamp(base + 9000) is None
        assert await log.max_timestamp() == (7, base + 5010)
        await node.close()

    run(body)


@pytest.mark.parametrize("step", [256, 1])
def test_delete_records_and_retention_delete_whole_batches_and_their_bytes(
        pg_server: PostgresServer, monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    # Truncation moves the log start in steps of STEP_BATCHES (one change each).
    monkeypatch.setattr(truncation, "STEP_BATCHES", step)
    name = schema()

    async def body() -> None:
        node = await started(pg_server, name)
        await node.create_topic("t", 1, {})
        log = node.partition("t", 0)
        old = now() - 10 * 86_400_000
        for i in range(6):
            await log.append(batch(2, ts=old + i), now())
        size = log.size_bytes
        assert await log.delete_records(3) == 3  # the batch holding 3 stays
        assert log.log_start_offset == 3
        assert log.size_bytes == size - size // 6
        with pytest.raises(OffsetOutOfRange):
            await log.read(2, 1 << 20)
        assert decode_batches(bytes((await log.read(3, 1 << 20)).batches[0]))[0][
            "base_offset"] == 2
        with pytest.raises(OffsetOutOfRange):
            await log.delete_records(99)
        assert await db(pg_server, f"SELECT count(*) FROM {name}.batches") == 5
        assert await db(pg_server, f"SELECT count(*) FROM {name}.batch_data") == 5

        # retention.bytes: the oldest go while what remains is at least it.
        await node.set_topic_configs("t", {"retention.bytes": str(3 * (size // 6)),
                                           "retention.ms": "-1"})
        changes = node.write_stats().changes
        await node.enforce_retention()
        assert log.log_start_offset == 6
        # Two batches went: in one change, or one change each.
        assert node.write_stats().changes - changes == (2 if step == 1 else 1)
        assert await db(pg_server, f"SELECT count(*) FROM {name}.batch_data") == 3
        # retention.ms: batches stamped ten days ago are past a day.
        await log.append(batch(1), now())
        await node.set_topic_configs("t", {"retention.ms": "86400000"})
        await node.enforce_retention()
        assert log.log_start_offset == 12
        assert await db(pg_server, f"SELECT count(*) FROM {name}.batches") == 1
        assert await db(pg_server, f"SELECT size_bytes FROM {name}.partitions p JOIN "
                                   f"{name}.topics USING (topic_id) WHERE name = 't'") \
            == log.size_bytes
        await node.close()

        node = await started(pg_server, name)
        assert node.partition("t", 0).log_start_offset == 12
        await node.set_topic_configs("t", {"cleanup.policy": ""})
        with pytest.raises(PolicyViolation):
            await node.partition("t", 0).delete_records(13)
        await node.close()

    run(body)


def test_retention_by_time_cuts_in_offset_order_whatever_the_time_index_says(
        pg_server: PostgresServer) -> None:
    """Retention by time keeps every batch from the first one stamped at or
    after the cutoff, found in offset order: a time index whose running
    maxima are out of offset order (as a commit that waited behind another
    writer stored them before pgstore.remote_txn locked first, or as any
    database written then holds) costs no recent batch. Read through the
    index's own order, the cut landed on the later batch with the smaller
    running max and deleted the three recent ones before it."""
    name = schema()

    async def body() -> None:
        node = await started(pg_server, name)
        await node.create_topic("t", 1, {})
        log = node.partition("t", 0)
        for i in range(4):
            await log.append(batch(1, ts=now() - 1_000 + i), now())
        # The premise: the index out of offset order (offset 3 below 0-2).
        moved = await db(pg_server, f"WITH u AS (UPDATE {name}.batches SET "
                                    "running_max_timestamp = running_max_timestamp - 10000 "
                                    "WHERE base_offset = 3 RETURNING 1) SELECT count(*) FROM u")
        assert moved == 1
        await node.set_topic_configs("t", {"retention.ms": "86400000"})
        await node.enforce_retention()
        assert log.log_start_offset == 0
        assert await db(pg_server, f"SELECT count(*) FROM {name}.batches") == 4
        await node.close()

    run(body)


def test_retention_vacuums_the_tables_once_a_quarter_of_the_data_retained_is_deleted(
        pg_server: PostgresServer) -> None:
    """The pass runs VACUUM itself (pgstore/retention.py) when it has deleted at
    least VACUUM_SHARE of what the partitions still hold, and not for less:
    PostgreSQL's own count of vacuums of batch_data says it ran."""
    name = schema()

    async def vacuums() -> int:
        found = await db(pg_server, "SELECT vacuum_count FROM pg_stat_user_tables "
                                    "WHERE schemaname = $1 AND relname = 'batch_data'", name)
        assert isinstance(found, int), found
        return found

    async def body() -> None:
        node = await started(pg_server, name)
        await node.create_topic("t", 1, {})
        log = node.partition("t", 0)
        for _ in range(20):
            await log.append(batch(50), now())
        per_batch = log.size_bytes // 20
        assert await vacuums() == 0
        # 2 of 20 batches deleted: a ninth of the 18 retained, under a quarter.
        await node.set_topic_configs("t", {"retention.bytes": str(18 * per_batch)})
        await node.enforce_retention()
        assert log.log_start_offset == 2 * 50
        assert node.retention.vacuums == 0 and await vacuums() == 0
        # 4 more: 6 deleted since the last vacuum (none), 14 retained: over a quarter.
        await node.set_topic_configs("t", {"retention.bytes": str(14 * per_batch)})
        await node.enforce_retention()
        assert log.log_start_offset == 6 * 50
        assert node.retention.vacuums == 1 and node.retention.deleted_since_vacuum == 0
        deadline = time.monotonic() + 10  # the statistics are shared at the vacuum's end
        while await vacuums() < 1:
            assert time.monotonic() < deadline, "no VACUUM of batch_data in pg_stat_user_tables"
            await asyncio.sleep(0.1)
        await node.close()

    run(body)


def test_a_write_whose_outcome_is_unknown_is_reread_before_offsets_are_assigned(
        pg_server: PostgresServer) -> None:
    name = schema()
    opened: list[FlakyConnection] = []

    async def body() -> None:
        node = PgNodeStorage(pg_server.dsn, PgNodeSettings(schema=name))
        node.writer = PgWriter(pg_server.dsn, connect=flaky(opened))
        await node.start()
        await node.create_topic("t", 1, {})
        log = node.partition("t", 0)
        await log.append(batch(2), now())
        # Committed, but the answer to the group's COMMIT is lost: both appends
        # fail in doubt; the next one waits for the reread and goes on after them.
        opened[-1].fail_commit = ConnectionResetError("the answer to COMMIT was lost")
        lost = await asyncio.gather(log.append(batch(3), now()), log.append(batch(1), now()),
                                    return_exceptions=True)
        assert [type(e) for e in lost] == [OutcomeUnknown, OutcomeUnknown]
        assert opened[-1].fail_commit is None  # the fault landed
        assert log.high_watermark == 2  # not yet known
        assert (await log.append(batch(0 + 1), now())).base_offset == 6
        # Not committed at all: nothing lands, and the next offsets follow the row.
        opened[-1].fail_statement = ConnectionResetError("gone before the commit")
        with pytest.raises(StoreUnavailable):
            await log.append(batch(4), now())
        after = await log.append(batch(1), now())
        rows = await db(pg_server, f"SELECT string_agg(base_offset::text, ',' ORDER BY "
                                   f"base_offset) FROM {name}.batches")
        assert rows == "0,2,5,6,7"
        assert after.base_offset == 7 and log.high_watermark == log.log_end_offset == 8
        assert [decode_batches(bytes(b))[0]["base_offset"]
                for b in (await log.read(0, 1 << 20)).batches] == [0, 2, 5, 6, 7]
        await node.close()

    run(body)


def test_a_store_error_is_retriable(pg_server: PostgresServer) -> None:
    # The premise of answering a lost write with KAFKA_STORAGE_ERROR.
    assert issubclass(OutcomeUnknown, StorageError) and issubclass(StoreUnavailable, StorageError)


def test_a_partition_nobody_reads_keeps_only_its_newest_batch_in_memory(
        pg_server: PostgresServer) -> None:
    async def body() -> None:
        node = await started(pg_server, schema())
        await node.create_topic("t", 2, {})
        unread, read = node.partition("t", 0), node.partition("t", 1)
        await read.read(0, 1 << 20)
        await reshared(node.catalog.tail_budget)
        for _ in range(4):
            await asyncio.gather(unread.append(batch(2), now()), read.append(batch(2), now()))
        assert (len(unread.tail), len(read.tail)) == (1, 4)
        assert (unread.tail_share, read.tail_share) == (0, node.settings.tail_cache_bytes)
        first = await unread.read(0, 1 << 20)  # from PostgreSQL; now it is read too
        await reshared(node.catalog.tail_budget)
        assert [d["base_offset"] for b in first.batches
                for d in decode_batches(bytes(b))] == [0, 2, 4, 6]  # type: ignore[arg-type]
        assert unread.tail_share == read.tail_share == node.settings.tail_cache_bytes // 2
        await node.close()

    run(body)


def test_reads_below_a_small_tail_come_from_the_database_in_offset_order(
        pg_server: PostgresServer) -> None:
    async def body() -> None:
        # A tail of 1 KiB: the newest batch or two stay in memory.
        node = await started(pg_server, schema(), tail_cache_bytes=1024)
        await node.create_topic("t", 1, {})
        log = node.partition("t", 0)
        for _ in range(20):
            await log.append(make_batch([b"x" * 200] * 2, base_timestamp=now()), now())
        assert 0 < len(log.tail) < 20 and log.tail.nbytes <= 1024
        tail_start = log.tail.first_offset(default=-1)
        offsets: list[int] = []
        at = 0
        while at < log.high_watermark:  # a consumer reading 1 KiB at a time
            result = await log.read(at, 1024)
            assert result.batches, f"nothing read at {at}"
            for data in result.batches:
                [decoded] = decode_batches(bytes(data))  # type: ignore[arg-type]
                offsets.append(decoded["base_offset"])
                at = decoded["base_offset"] + 2
        assert offsets == list(range(0, 40, 2))
        assert tail_start > 0  # the premise: some reads went below the tail
        await node.close()

    run(body)


def test_an_append_to_a_partition_deleted_elsewhere_answers_unknown_partition(
        pg_server: PostgresServer) -> None:
    name = schema()

    async def body() -> None:
        node = await started(pg_server, name)
        await node.create_topic("t", 1, {})
        log = node.partition("t", 0)
        await log.append(batch(), now())
        waiter = log.waiter()
        # Deleted behind this gateway's back (another gateway, an operator):
        # the fence finds no row, the reread finds none either.
        await db(pg_server, f"DELETE FROM {name}.topics WHERE name = 't' RETURNING 1")
        with pytest.raises(UnknownPartition):
            await log.append(batch(), now())
        assert log.deleted and waiter.done()  # its fetchers wake
        with pytest.raises(UnknownPartition):
            log.append(batch(), now())
        await node.close()

    run(body)
