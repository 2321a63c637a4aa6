"""pgstore.txn_storage on a throwaway PostgreSQL, with the small partition
log of ``testkit.pg_txn_log`` (real rows, written and read back):

- a transaction over two partitions, one led by this gateway (it reserves
  the offsets), one by another (the database assigns them after that
  gateway's own append), commits in one PostgreSQL transaction: batches
  referencing the pending bytes (never copied), both markers, both log
  ends, the offsets and the state, and both log ends announced;
- the writer's connection killed (pg_terminate_backend) in the middle of
  that transaction: nothing of it is visible, the logs are told their end
  is in doubt, the offsets are forgotten; the commit then lands whole;
- an abort deletes the pending rows and their bytes (100 MiB, timed), and
  only that transaction's;
- a restart: the counters, states, partitions and pending batches are read
  back, the pending ones in order, and a commit of the recovered blobs reads
  back the bytes produced;
- a partition whose epoch another node bumped refuses the whole commit, and
  its transactional appends;
- two gateways committing the same group's partition from one view: exactly
  one wins, and of the loser nothing lands; two taking one block of a
  counter: likewise.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import asyncpg
import pytest

from pgstore.batch_log import BatchLog
from pgstore.consumer_offsets import PgConsumerOffsets
from pgstore.log_notices import LogEnd, channel
from pgstore.migrate import quoted
from pgstore.txn_publication import (
    OffsetsMoved,
    PublicationFenced,
    log_ref_of,
)
from pgstore.txn_storage import PgTransactionStorage
from pgstore.writer import PgWriter
from tablets import batch as batch_header
from tablets.control import commit_marker
from tablets.errors import CounterMoved, StorageError
from tablets.seam import CommittedOffset, OffsetCommit, PendingBlob
from testkit import postgres
from testkit.batches import make_batch
from testkit.pg_schemas import connect_as, migrated_schema
from testkit.pg_txn_log import TxnLog
from testkit.postgres import PostgresServer

pg_server = postgres.server_fixture("module")
T = TypeVar("T")
APP = "txn-writer"
EPOCH = 5
PRODUCER = 7


@dataclass
class Gateway:
    """One gateway's transaction storage over the shared database."""

    writer: PgWriter
    offsets: PgConsumerOffsets
    storage: PgTransactionStorage

    async def produce(self, log: TxnLog, instance: int, ordinal: int,
                      data: bytes) -> PendingBlob:
        """A transactional append, as the engine's PartitionLog does it."""
        change = self.writer.begin()
        ref = self.storage.pending_ref(log_ref_of(log.log_id), instance, ordinal)
        stored = self.storage.stage_pending(change, log, ref, data)
        await self.writer.commit(change)
        return PendingBlob(ref, stored[:batch_header.HEADER_SIZE], stored)

    def stage_transaction(self, tid: str, parts: list[tuple[TxnLog, list[PendingBlob]]],
                          offsets: dict[tuple[str, int], int] | None = None,
                          ) -> tuple[Any, Callable[[], None]]:
        """A transaction's commit as txn/commit.py stages it: each partition's
        publication, the offsets, then the state."""
        change = self.storage.begin()
        marker = commit_marker(PRODUCER, 0, 2000)
        publishers = [self.storage.stage_commit(change, log, blobs, marker)  # type: ignore[arg-type]
                      for log, blobs in parts]
        staged: dict[tuple[str, int], CommittedOffset] = {}
        if offsets:
            staged = self.storage.stage_offsets(
                change, "g", {tp: OffsetCommit(o) for tp, o in offsets.items()}, 2000, tid,
                None)
        self.storage.put_txn_state(change, tid, b"COMPLETE_COMMIT")

        def publish() -> None:
            for each in publishers:
                each()
            if staged:
                self.offsets.publish("g", staged)

        return change, publish


async def open_gateway(pg: PostgresServer, schema: str, admin: asyncpg.Connection,
                       logs: dict[tuple[str, int], TxnLog] | None = None) -> Gateway:
    writer = PgWriter(pg.dsn, connect=connect_as(APP))
    await writer.start()
    offsets = PgConsumerOffsets(writer, schema)
    await offsets.load(admin)
    known = logs if logs is not None else {}
    storage = PgTransactionStorage(
        writer, offsets, schema, partition=lambda name, index: known[(name, index)],  # type: ignore[arg-type,return-value]
        has_partition=lambda name, index: (name, index) in known,
        txn_partition=lambda log: log)  # type: ignore[arg-type,return-value]
    await storage.load(admin)
    return Gateway(writer, offsets, storage)


Body = Callable[[asyncpg.Pool, asyncpg.Connection, str], Awaitable[T]]


def run(pg: PostgresServer, body: Body[T]) -> T:
    schema = migrated_schema(pg, "txn")

    async def main() -> T:
        pool = await asyncpg.create_pool(pg.dsn, min_size=1, max_size=4)
        admin = await asyncpg.connect(pg.dsn)
        try:
            return await body(pool, admin, schema)
        finally:
            await admin.close()
            await pool.close()

    return asyncio.run(main())


async def new_topic(admin: asyncpg.Connection, schema: str, partitions: int) -> list[int]:
    topic_id = uuid.uuid4()
    await admin.execute(f"INSERT INTO {schema}.topics (topic_id, name, created_ms) "
                        "VALUES ($1, $2, 0)", topic_id, f"t-{topic_id.hex[:8]}")
    return [int(await admin.fetchval(
        f"INSERT INTO {schema}.partitions (topic_id, partition, leader_epoch) "
        "VALUES ($1, $2, $3) RETURNING log_id", topic_id, index, EPOCH))
        for index in range(partitions)]


@dataclass
class PendingPair:
    """A gateway and one pending batch of transaction instance 1 on each of
    two logs of one topic (``a`` led here)."""

    gateway: Gateway
    a: TxnLog
    b: TxnLog
    blobs_a: list[PendingBlob]
    blobs_b: list[PendingBlob]


@asynccontextmanager
async def pending_pair(pg: PostgresServer, pool: asyncpg.Pool, admin: asyncpg.Connection,
                       schema: str, b_leads: bool = True) -> AsyncIterator[PendingPair]:
    a_id, b_id = await new_topic(admin, schema, 2)
    a = await TxnLog.open(pool, schema, a_id)
    b = await TxnLog.open(pool, schema, b_id, leads=b_leads)
    gateway = await open_gateway(pg, schema, admin)
    try:
        yield PendingPair(gateway, a, b, [await gateway.produce(a, 1, 0, txn_batch(3, "a0"))],
                          [await gateway.produce(b, 1, 1, txn_batch(2, "b0"))])
    finally:
        await gateway.writer.close()


def txn_batch(records: int, tag: str, sequence: int = 0, timestamp: int = 1000) -> bytes:
    return make_batch([f"{tag}-{i}".encode() for i in range(records)],
                      base_timestamp=timestamp, producer_id=PRODUCER, producer_epoch=0,
                      base_sequence=sequence, attributes=batch_header.ATTR_TRANSACTIONAL)


async def snapshot(admin: asyncpg.Connection, schema: str) -> dict[str, Any]:
    """Everything a commit writes, as the database has it."""
    async def rows(sql: str) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in await admin.fetch(sql)]

    return {
        "partitions": await rows(f"SELECT log_id, log_end_offset, size_bytes, leader_epoch "
                                 f"FROM {schema}.partitions ORDER BY log_id"),
        "batches": await rows(f"SELECT log_id, base_offset, last_offset, data_id, shifted "
                              f"FROM {schema}.batches ORDER BY log_id, base_offset"),
        "batch_data": await rows(f"SELECT log_id, data_id FROM {schema}.batch_data "
                                 "ORDER BY log_id, data_id"),
        "pending": await rows(f"SELECT log_id, instance, ordinal, data_id "
                              f"FROM {schema}.pending_batches ORDER BY 1, 2, 3"),
        "offsets": await rows(f"SELECT group_id, topic, partition, committed_offset, committer "
                              f"FROM {schema}.consumer_offsets ORDER BY 1, 2, 3"),
        "states": await rows(f"SELECT transactional_id, state FROM {schema}.txn_states "
                             "ORDER BY 1"),
    }


def bases_of(batches: list[bytes]) -> list[int]:
    return [batch_header.base_offset_of(b) for b in batches]


def is_commit_marker(data: bytes) -> bool:
    header = batch_header.parse_batches(data)[0]
    return header.is_control and header.is_transactional


def same_batch(read: bytes, produced: bytes) -> bool:
    """The bytes read back are those produced, but for the base offset and the
    leader epoch (stamped by the log)."""
    return read[8:12] == produced[8:12] and read[16:] == produced[16:]


async def durable(gateway: Gateway, change: Any, publish: Callable[[], None]) -> None:
    await gateway.storage.commit(change)
    publish()


# ------------------------------------------------------------------ tests
def test_a_commit_over_two_partitions_led_by_two_gateways_is_one_transaction(
        pg_server: PostgresServer) -> None:
    async def body(pool: asyncpg.Pool, admin: asyncpg.Connection, schema: str) -> None:
        a_id, b_id = await new_topic(admin, schema, 2)
        a = await TxnLog.open(pool, schema, a_id)  # led here: reserves its offsets
        b = await TxnLog.open(pool, schema, b_id, leads=False)  # led by another gateway
        gateway = await open_gateway(pg_server, schema, admin)
        heard: list[str] = []
        await admin.add_listener(channel(schema), lambda *args: heard.append(args[3]))
        try:
            produced = [txn_batch(3, "a0"), txn_batch(2, "a1", 3), txn_batch(4, "b0", 5)]
            blobs_a = [await gateway.produce(a, 1, 0, produced[0]),
                       await gateway.produce(a, 1, 1, produced[1])]
            blobs_b = [await gateway.produce(b, 1, 2, produced[2])]
            # The other gateway claims b (its epoch moves past the one this
            # gateway last saw: not checked for a partition led elsewhere)
            # and appends meanwhile: the commit goes after it.
            await admin.execute(f"UPDATE {quoted(schema)}.partitions "
                                "SET leader_epoch = leader_epoch + 1 WHERE log_id = $1", b_id)
            other = await BatchLog.open(pool, schema, b_id)
            assert await other.append([make_batch([b"x", b"y"], base_timestamp=500)]) == [0]
            before = await snapshot(admin, schema)
            pending_data = {row[3] for row in before["pending"]}
            assert len(pending_data) == 3
            assert a.high_watermark == 0

            change, publish = gateway.stage_transaction(
                "tx", [(a, blobs_a), (b, blobs_b)], {("t", 0): 42})
            await durable(gateway, change, publish)

            after = await snapshot(admin, schema)
            # a: 3 + 2 records, then its marker; b: after the other's 2, 4, then its marker.
            assert a.publications == [(0, 6)] and a.high_watermark == 6
            assert b.publications == [(2, 7)] and b.high_watermark == 7
            ends = {row[0]: row[1] for row in after["partitions"]}
            assert ends == {a_id: 6, b_id: 7}
            read_a, read_b = await a.read(), await b.read()
            assert bases_of(read_a) == [0, 3, 5] and bases_of(read_b) == [0, 2, 6]
            assert same_batch(read_a[0], produced[0]) and same_batch(read_a[1], produced[1])
            assert same_batch(read_b[1], produced[2])
            assert is_commit_marker(read_a[2]) and is_commit_marker(read_b[2])
            # The pending rows moved into the index, naming the same bytes: none copied.
            assert after["pending"] == []
            moved = {row[3]: row[4] for row in after["batches"] if row[3] in pending_data}
            assert moved == dict.fromkeys(pending_data, True)  # shifted: patched when read
            new_data = {row[1] for row in after["batch_data"]} - {
                row[1] for row in before["batch_data"]}
            assert len(new_data) == 2  # the markers' bytes, nothing else
            # b's marker was written before its offset was known: stored shifted too.
            assert {row[0]: row[4] for row in after["batches"] if row[3] in new_data} == {
                a_id: False, b_id: True}
            sizes = {row[0]: row[2] for row in after["partitions"]}
            assert sizes[a_id] == sum(len(b) for b in read_a)
            # The offsets (with the committer) and the state, in the same transaction.
            assert after["offsets"] == [("g", "t", 0, 42, "tx")]
            assert after["states"] == [("tx", b"COMPLETE_COMMIT")]
            assert gateway.offsets.committed("g", "t", 0).offset == 42  # type: ignore[union-attr]
            for _ in range(100):
                if len(heard) >= 2:
                    break
                await asyncio.sleep(0.05)
            # Both publications announced to every gateway: offsets, bytes, newest timestamp.
            notices = sorted((LogEnd.parse(payload) for payload in heard), key=lambda n: n.log_id)
            assert [(n.log_id, n.base, n.end) for n in notices] == sorted(
                [(a_id, 0, 6), (b_id, 2, 7)])
            assert {n.log_id: n.nbytes for n in notices} == {
                a_id: sizes[a_id], b_id: sum(len(b) for b in read_b[1:])}
            assert all(n.max_timestamp > 0 for n in notices)
        finally:
            await gateway.writer.close()

    run(pg_server, body)


def test_a_commit_whose_connection_is_killed_mid_group_leaves_nothing(
        pg_server: PostgresServer) -> None:
    async def body(pool: asyncpg.Pool, admin: asyncpg.Connection, schema: str) -> None:
        async with pending_pair(pg_server, pool, admin, schema, b_leads=False) as pair:
            gateway, a, b, blobs_a, blobs_b = (pair.gateway, pair.a, pair.b, pair.blobs_a,
                                               pair.blobs_b)
            a_id, b_id = a.log_id, b.log_id
            before = await snapshot(admin, schema)
            blocker = await asyncpg.connect(pg_server.dsn)
            try:
                # The state is the change's last statement: holding its table
                # makes the writer wait there, with the partitions, batches,
                # markers and offsets already written in its transaction.
                blocking = blocker.transaction()
                await blocking.start()
                await blocker.execute(f"LOCK TABLE {schema}.txn_states IN EXCLUSIVE MODE")
                change, publish = gateway.stage_transaction(
                    "tx", [(a, blobs_a), (b, blobs_b)], {("t", 0): 42})
                failing = asyncio.ensure_future(durable(gateway, change, publish))
                waiting = None
                for _ in range(200):  # until the writer waits on the lock (at most 20 s)
                    waiting = await admin.fetchval(
                        "SELECT pid FROM pg_stat_activity WHERE application_name = $1 "
                        "AND wait_event_type = 'Lock'", APP)
                    if waiting is not None:
                        break
                    await asyncio.sleep(0.1)
                assert waiting is not None, "the commit never waited on the lock"
                # It had written the rest: the rows it inserted are there, uncommitted.
                assert await admin.fetchval(
                    "SELECT count(*) FROM pg_locks WHERE pid = $1 AND mode = 'RowExclusiveLock' "
                    "AND relation = $2::regclass", waiting, f"{schema}.batches") == 1
                assert await admin.fetchval("SELECT pg_terminate_backend($1)", waiting)
                with pytest.raises(StorageError):
                    await asyncio.wait_for(failing, 30)
                await blocking.rollback()
            finally:
                await blocker.close()
            assert await snapshot(admin, schema) == before
            assert a.publications == [] and b.publications == []
            assert a.doubts == 1  # its reservation is undone by a reload
            assert gateway.offsets.latest("g", "t", 0) is None  # forgotten
            assert list(gateway.storage.txn_states()) == []
            # Written again (the coordinator's retry), it lands whole.
            await a.reload()
            change, publish = gateway.stage_transaction(
                "tx", [(a, blobs_a), (b, blobs_b)], {("t", 0): 42})
            await durable(gateway, change, publish)
            after = await snapshot(admin, schema)
            assert {row[0]: row[1] for row in after["partitions"]} == {a_id: 4, b_id: 3}
            assert after["pending"] == [] and after["offsets"] == [("g", "t", 0, 42, "tx")]
            assert after["states"] == [("tx", b"COMPLETE_COMMIT")]
            assert dict(gateway.storage.txn_states()) == {"tx": b"COMPLETE_COMMIT"}
            assert gateway.writer.connects == 2

    run(pg_server, body)


ABORT_BLOBS = 100
ABORT_BLOB_BYTES = 1 << 20


def test_an_abort_deletes_the_pending_bytes(pg_server: PostgresServer) -> None:
    async def body(pool: asyncpg.Pool, admin: asyncpg.Connection, schema: str) -> None:
        (log_id,) = await new_topic(admin, schema, 1)
        log = await TxnLog.open(pool, schema, log_id)
        gateway = await open_gateway(pg_server, schema, admin)
        try:
            kept = await gateway.produce(log, 2, 0, txn_batch(1, "other transaction"))
            payload = os.urandom(ABORT_BLOB_BYTES)  # incompressible, as produced batches are
            storing = time.perf_counter()
            for start in range(0, ABORT_BLOBS, 10):  # 100 MiB, in changes of 10 MiB
                change = gateway.writer.begin()
                for ordinal in range(start, start + 10):
                    data = make_batch([payload], base_timestamp=1000, producer_id=PRODUCER,
                                      producer_epoch=0, base_sequence=ordinal,
                                      attributes=batch_header.ATTR_TRANSACTIONAL)
                    ref = gateway.storage.pending_ref(log_ref_of(log_id), 1, ordinal)
                    gateway.storage.stage_pending(change, log, ref, data)
                await gateway.writer.commit(change)
            storing = time.perf_counter() - storing
            stored = await admin.fetchval(
                f"SELECT sum(octet_length(data)) FROM {schema}.batch_data "
                "WHERE data_id IN (SELECT data_id FROM "
                f"{schema}.pending_batches WHERE instance = 1)")
            assert stored >= ABORT_BLOBS * ABORT_BLOB_BYTES

            change = gateway.storage.begin()
            gateway.storage.abort_pending(change, log_ref_of(log_id), 1)
            gateway.storage.put_txn_state(change, "tx", b"COMPLETE_ABORT")
            started = time.perf_counter()
            await gateway.storage.commit(change)
            elapsed = time.perf_counter() - started
            print(f"\n{stored / 2**20:.0f} MiB of pending batches stored in {storing:.2f} s "
                  f"({ABORT_BLOBS} rows, changes of 10); their abort: {elapsed * 1000:.0f} ms")
            after = await snapshot(admin, schema)
            # Only the other transaction's blob is left, rows and bytes.
            assert after["pending"] == [(log_id, 2, 0, after["pending"][0][3])]
            assert [row[1] for row in after["batch_data"]] == [after["pending"][0][3]]
            assert gateway.storage.recover_pending(log_ref_of(log_id), 2) == []  # (start-up only)
            assert kept.key == gateway.storage.pending_ref(log_ref_of(log_id), 2, 0)
            assert elapsed < 60, f"the abort of 100 MiB took {elapsed:.1f} s"
            # The deleted bytes are dead TOAST rows until vacuum frees them
            # (autovacuum does in a server; here by hand, timed).
            size = f"SELECT pg_total_relation_size('{schema}.batch_data')"
            dead = await admin.fetchval(size)
            started = time.perf_counter()
            await admin.execute(f"VACUUM {schema}.batch_data")
            vacuumed = time.perf_counter() - started
            freed = await admin.fetchval(size)
            print(f"batch_data: {dead / 2**20:.1f} MiB after the abort, {freed / 2**20:.1f} MiB "
                  f"after a VACUUM of {vacuumed * 1000:.0f} ms")
            assert dead >= ABORT_BLOBS * ABORT_BLOB_BYTES, "the abort's bytes were never stored"
            assert freed < dead / 10, f"VACUUM left {freed} of {dead} bytes"
        finally:
            await gateway.writer.close()

    run(pg_server, body)


def test_a_restart_reads_back_the_state_and_the_pending_batches_in_order(
        pg_server: PostgresServer) -> None:
    async def body(pool: asyncpg.Pool, admin: asyncpg.Connection, schema: str) -> None:
        a_id, b_id = await new_topic(admin, schema, 2)
        a = await TxnLog.open(pool, schema, a_id)
        topic_id = await admin.fetchval(
            f"SELECT topic_id FROM {schema}.partitions WHERE log_id = $1", a_id)
        first = await open_gateway(pg_server, schema, admin)
        produced = {ordinal: txn_batch(ordinal + 1, f"p{ordinal}", ordinal)
                    for ordinal in range(3)}
        try:
            for ordinal in (2, 0, 1):  # stored out of order
                await first.produce(a, 9, ordinal, produced[ordinal])
            await first.produce(a, 10, 0, txn_batch(1, "another"))
            change = first.storage.begin()
            first.storage.set_counter(change, "producer.ids", 1000)
            first.storage.put_txn_state(change, "tx", b"ONGOING")
            first.storage.put_txn_partition(change, "tx", 9, ("t", 0), topic_id)
            first.storage.put_txn_partition(change, "tx", 9, ("t", 1), topic_id)
            await first.storage.commit(change)
            change = first.storage.begin()
            first.storage.delete_txn_partition(change, "tx", 9, ("t", 1), topic_id)
            await first.storage.commit(change)
        finally:
            await first.writer.close()

        again = await open_gateway(pg_server, schema, admin)  # a new process
        try:
            storage = again.storage
            assert storage.counter("producer.ids") == 1000
            assert storage.counter("other") is None
            assert dict(storage.txn_states()) == {"tx": b"ONGOING"}
            assert list(storage.txn_partitions("tx", 9)) == [(("t", 0), topic_id)]
            recovered = storage.recover_pending(log_ref_of(a_id), 9)
            assert [r.ordinal for r in recovered] == [0, 1, 2]
            assert all(same_batch(r.header, produced[r.ordinal][:batch_header.HEADER_SIZE])
                       for r in recovered)
            assert [batch_header.record_count_of(r.header) for r in recovered] == [1, 2, 3]
            assert [r.nbytes for r in recovered] == [len(produced[o]) for o in range(3)]
            assert all(storage.pending_log_ref(r.ref) == storage.log_ref(a)  # type: ignore[arg-type]
                       for r in recovered)
            assert [r.ordinal for r in storage.recover_pending(log_ref_of(a_id), 10)] == [0]
            assert storage.recover_pending(log_ref_of(b_id), 9) == []
            # The recovered blobs (bytes not in memory) commit as produced.
            a = await TxnLog.open(pool, schema, a_id)
            blobs = [PendingBlob(r.ref, r.header, None) for r in recovered]
            change, publish = again.stage_transaction("tx", [(a, blobs)])
            await durable(again, change, publish)
            read = await a.read()
            assert bases_of(read) == [0, 1, 3, 6]
            assert all(same_batch(read[o], produced[o]) for o in range(3))
            assert is_commit_marker(read[3])
            assert storage.recover_pending(log_ref_of(a_id), 9) == []
        finally:
            await again.writer.close()

    run(pg_server, body)


def test_a_partition_fenced_by_another_node_refuses_the_whole_commit(
        pg_server: PostgresServer) -> None:
    async def body(pool: asyncpg.Pool, admin: asyncpg.Connection, schema: str) -> None:
        async with pending_pair(pg_server, pool, admin, schema) as pair:
            gateway, a, b, blobs_a, blobs_b = (pair.gateway, pair.a, pair.b, pair.blobs_a,
                                               pair.blobs_b)
            b_id = b.log_id
            # Another node takes b.
            await admin.execute(f"UPDATE {schema}.partitions SET leader_epoch = leader_epoch "
                                "+ 1 WHERE log_id = $1", b_id)
            before = await snapshot(admin, schema)
            change, publish = gateway.stage_transaction(
                "tx", [(a, blobs_a), (b, blobs_b)], {("t", 0): 42})
            with pytest.raises(PublicationFenced, match=f"log {b_id}: not at leader epoch"):
                await durable(gateway, change, publish)
            assert await snapshot(admin, schema) == before
            assert a.publications == [] and b.publications == []
            assert (a.doubts, b.doubts) == (1, 1)
            assert gateway.offsets.latest("g", "t", 0) is None
            # Nor does its transactional append land any more.
            with pytest.raises(PublicationFenced):
                await gateway.produce(b, 1, 2, txn_batch(1, "b1"))
            assert await snapshot(admin, schema) == before
            # The partition still led here commits alone.
            await a.reload()
            change, publish = gateway.stage_transaction("tx", [(a, blobs_a)])
            await durable(gateway, change, publish)
            assert a.publications == [(0, 4)]

    run(pg_server, body)


def test_a_commit_naming_a_log_deleted_meanwhile_lands_for_the_rest(
        pg_server: PostgresServer) -> None:
    """The topic of one partition was deleted through another gateway, whose
    notice has not reached this coordinator: the commit still names the log.
    It lands for the other partition and takes nothing of the deleted one
    (before, it was refused, and the client's EndTxn failed with
    KAFKA_STORAGE_ERROR; seen in CI on the three-gateway cluster)."""
    async def body(pool: asyncpg.Pool, admin: asyncpg.Connection, schema: str) -> None:
        async with pending_pair(pg_server, pool, admin, schema) as pair:
            gateway, a, b, blobs_a, blobs_b = (pair.gateway, pair.a, pair.b, pair.blobs_a,
                                               pair.blobs_b)
            a_id, b_id = a.log_id, b.log_id
            await admin.execute(f"DELETE FROM {schema}.partitions WHERE log_id = $1", b_id)
            assert await admin.fetchval(  # the premise: its pending rows went with it
                f"SELECT count(*) FROM {schema}.pending_batches WHERE log_id = $1", b_id) == 0
            change, publish = gateway.stage_transaction(
                "tx", [(a, blobs_a), (b, blobs_b)], {("t", 0): 42})
            await durable(gateway, change, publish)
            after = await snapshot(admin, schema)
            assert [row[:2] for row in after["partitions"]] == [(a_id, 4)]
            assert {row[0] for row in after["batches"]} == {a_id}
            assert {row[0] for row in after["batch_data"]} == {a_id}
            assert after["pending"] == []
            assert after["offsets"] == [("g", "t", 0, 42, "tx")]
            assert a.publications == [(0, 4)] and b.publications == []

    run(pg_server, body)


def test_two_gateways_committing_one_partitions_offsets_exactly_one_wins(
        pg_server: PostgresServer) -> None:
    async def body(pool: asyncpg.Pool, admin: asyncpg.Connection, schema: str) -> None:
        a_id, b_id = await new_topic(admin, schema, 2)
        one = await open_gateway(pg_server, schema, admin)
        try:
            await one.offsets.commit("g", {("t", 0): OffsetCommit(5)}, 0)
            two = await open_gateway(pg_server, schema, admin)  # the same view of g
            try:
                a = await TxnLog.open(pool, schema, a_id)
                b = await TxnLog.open(pool, schema, b_id)
                blobs_a = [await one.produce(a, 1, 0, txn_batch(1, "one"))]
                blobs_b = [await two.produce(b, 2, 0, txn_batch(1, "two"))]
                before = await snapshot(admin, schema)
                # Both claim an overlapping range of g's partition (t, 0).
                staged = [one.stage_transaction("tx1", [(a, blobs_a)], {("t", 0): 10}),
                          two.stage_transaction("tx2", [(b, blobs_b)], {("t", 0): 12,
                                                                       ("t", 1): 3})]
                results = await asyncio.gather(
                    *(durable(gw, change, publish) for gw, (change, publish)
                      in zip((one, two), staged, strict=True)), return_exceptions=True)
                failures = [r for r in results if isinstance(r, BaseException)]
                assert len(failures) == 1, results
                assert isinstance(failures[0], OffsetsMoved), failures
                winner, loser = ((one, two) if results[0] is None else (two, one))
                won, lost = ("tx1", "tx2") if winner is one else ("tx2", "tx1")
                after = await snapshot(admin, schema)
                offsets = {(row[1], row[2]): (row[3], row[4]) for row in after["offsets"]}
                assert offsets[("t", 0)] == ((10, "tx1") if won == "tx1" else (12, "tx2"))
                assert all(committer == won for _, committer in offsets.values())
                assert [row[0] for row in after["states"]] == [won]
                # Of the loser, nothing: not its partition's publication either.
                lost_log = a if lost == "tx1" else b
                ends = {row[0]: row[1] for row in after["partitions"]}
                assert ends[lost_log.log_id] == 0 and lost_log.publications == []
                assert lost_log.doubts == 1
                assert len([r for r in after["pending"] if r[0] == lost_log.log_id]) == 1
                assert loser.offsets.latest("g", "t", 0).offset == 5  # type: ignore[union-attr]
                assert before["offsets"] == [("g", "t", 0, 5, "")]
            finally:
                await two.writer.close()
        finally:
            await one.writer.close()

    run(pg_server, body)


def test_a_commit_refused_for_moved_offsets_reads_the_group_again(
        pg_server: PostgresServer) -> None:
    """Another gateway committed the group's offsets since this one read
    them: this gateway's transaction commit is refused (OffsetsMoved), and
    the group is read again, so its next transaction over that partition
    commits. Before, every later commit expected the same stale version and
    was refused until the group's slot moved (found by the chaos check on
    three gateways: 12 refusals in 5 s)."""
    async def body(pool: asyncpg.Pool, admin: asyncpg.Connection, schema: str) -> None:
        async with pending_pair(pg_server, pool, admin, schema) as pair:
            one = pair.gateway
            one.storage.connect_pool(pool)
            await one.offsets.commit("g", {("t", 0): OffsetCommit(5)}, 0)
            two = await open_gateway(pg_server, schema, admin)  # the same view of g
            try:
                await two.offsets.commit("g", {("t", 0): OffsetCommit(6)}, 0)
            finally:
                await two.writer.close()
            change, publish = one.stage_transaction("tx", [(pair.a, pair.blobs_a)],
                                                    {("t", 0): 7})
            with pytest.raises(OffsetsMoved):
                await durable(one, change, publish)
            for _ in range(100):  # read again in the background (at most 10 s)
                if one.storage.group_rereads.rereads:
                    break
                await asyncio.sleep(0.1)
            assert one.storage.group_rereads.rereads == 1
            committed = one.offsets.committed("g", "t", 0)
            assert committed is not None and committed.offset == 6
            # The client's next transaction (its pending batch was aborted
            # with the refused one in Kafka's flow; a new one here).
            blob = await one.produce(pair.a, 2, 0, txn_batch(1, "retry"))
            change, publish = one.stage_transaction("tx", [(pair.a, [blob])], {("t", 0): 7})
            await durable(one, change, publish)
            offsets = (await snapshot(admin, schema))["offsets"]
            assert offsets == [("g", "t", 0, 7, "tx")]

    run(pg_server, body)


def test_two_gateways_taking_one_counter_block_exactly_one_wins(
        pg_server: PostgresServer) -> None:
    async def body(pool: asyncpg.Pool, admin: asyncpg.Connection, schema: str) -> None:
        one = await open_gateway(pg_server, schema, admin)
        two = await open_gateway(pg_server, schema, admin)
        try:
            change = one.storage.begin()
            one.storage.set_counter(change, "producer.ids", 1000)
            await one.storage.commit(change)
            await two.storage.load(admin)  # both now hold the same view: 1000
            assert two.storage.counter("producer.ids") == 1000
            changes = []
            for gateway in (one, two):
                change = gateway.storage.begin()
                gateway.storage.set_counter(change, "producer.ids", 2000)
                gateway.storage.put_txn_state(change, f"by-{id(gateway)}", b"x")
                changes.append(gateway.storage.commit(change))
            results = await asyncio.gather(*changes, return_exceptions=True)
            assert sum(r is None for r in results) == 1, results
            assert any(isinstance(r, CounterMoved) for r in results), results
            assert await admin.fetchval(
                f"SELECT value FROM {schema}.counters WHERE name = 'producer.ids'") == 2000
            assert await admin.fetchval(f"SELECT count(*) FROM {schema}.txn_states") == 1
            # The loser read the row (locked) before its compare-and-set failed:
            # its view is the database's now, so its next set lands, no reload.
            loser = two if results[1] is not None else one
            assert loser.storage.counter("producer.ids") == 2000
            change = loser.storage.begin()
            loser.storage.set_counter(change, "producer.ids", 3000)
            await loser.storage.commit(change)
            assert await admin.fetchval(
                f"SELECT value FROM {schema}.counters WHERE name = 'producer.ids'") == 3000
        finally:
            await one.writer.close()
            await two.writer.close()

    run(pg_server, body)


def test_a_counter_set_again_to_its_value_lands_and_never_moves_back(
        pg_server: PostgresServer) -> None:
    """A transaction's state is rewritten with its instance at every put: the
    counter set again to the value it holds must land (every EndTxn failed
    when it did not); a value below it never does."""
    async def body(pool: asyncpg.Pool, admin: asyncpg.Connection, schema: str) -> None:
        one = await open_gateway(pg_server, schema, admin)
        try:
            for value in (7, 7, 7):
                change = one.storage.begin()
                one.storage.set_counter(change, "txn.instance", value)
                await one.storage.commit(change)
            change = one.storage.begin()
            one.storage.set_counter(change, "txn.instance", 3)
            with pytest.raises(CounterMoved):
                await one.storage.commit(change)
            assert await admin.fetchval(
                f"SELECT value FROM {schema}.counters WHERE name = 'txn.instance'") == 7
            assert one.storage.counter("txn.instance") == 7
        finally:
            await one.writer.close()

    run(pg_server, body)


def test_a_commit_another_gateway_made_after_a_transaction_began_is_seen_as_moved(
        pg_server: PostgresServer) -> None:
    """The begin version across gateways (docs/cluster-design.md, "Offsets
    written by a commit that crosses gateways"): the coordinator's gateway
    takes it from its own counter when the transaction begins; a commit by a
    gateway whose counter is behind is refused by the compare-and-set until
    this gateway reads the group again, and then it is seen as committed now,
    so the conflict check finds the partition moved."""
    from txn.conflicts import offset_conflict

    async def body(pool: asyncpg.Pool, admin: asyncpg.Connection, schema: str) -> None:
        coordinator = await open_gateway(pg_server, schema, admin)
        other = await open_gateway(pg_server, schema, admin)
        try:
            for offset in range(20):  # the coordinator's counter runs ahead
                await coordinator.offsets.commit("busy", {("t", 9): OffsetCommit(offset)}, 0)
            await coordinator.offsets.commit("g", {("t", 0): OffsetCommit(100)}, 0)
            begin_version = coordinator.offsets.last_version  # the transaction begins
            # The hung worker's successor commits through the other gateway
            # (a plain OffsetCommit), whose counter is far behind.
            await other.offsets.commit("g", {("t", 0): OffsetCommit(120)}, 0)
            landed = other.offsets.version("g", "t", 0)
            assert landed < begin_version  # the other counter's version says "older"
            commits = {("t", 0): OffsetCommit(150)}
            # From its stale view the check passes, but the commit is refused.
            assert offset_conflict(coordinator.offsets, "g", commits, begin_version,
                                   "tx") is None
            change, publish = coordinator.stage_transaction("tx", [], {("t", 0): 150})
            with pytest.raises(OffsetsMoved):
                await durable(coordinator, change, publish)
            # Read again, the commit is seen as made after the begin: a conflict.
            await coordinator.offsets.load_group(admin, "g")
            seen = coordinator.offsets.committed("g", "t", 0)
            assert seen is not None and seen.offset == 120 and seen.version > begin_version
            reason = offset_conflict(coordinator.offsets, "g", commits, begin_version, "tx")
            assert reason is not None and "after this transaction began" in reason
            # A transaction begun now commits, as a compare-and-set against that row.
            change, publish = coordinator.stage_transaction("tx2", [], {("t", 0): 160})
            await durable(coordinator, change, publish)
            assert (await snapshot(admin, schema))["offsets"][1] == ("g", "t", 0, 160, "tx2")
        finally:
            await coordinator.writer.close()
            await other.writer.close()

    run(pg_server, body)
