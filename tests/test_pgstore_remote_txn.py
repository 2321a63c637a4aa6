"""A transactional Produce to a partition led by a gateway that does not
coordinate the transactional id (pgstore.remote_txn, txn.remote_produce):
two gateways' engines in one process, each with its transaction
coordinator, on a throwaway PostgreSQL. Gateway a coordinates the id;
gateway b leads the partition.

- b checks the batch on the id's stored state (Kafka's answers: an unknown
  id or producer, an old epoch, a partition not added), stores it as a
  pending row of a's transaction, and a's commit publishes it, with a's
  own batch of another partition, once: b's log holds the batches in
  order, then the COMMIT marker; a retry is answered without storing again;
- a batch b checked before the end began but appends after it (the
  transaction committed meanwhile) is refused, stores nothing and is never
  published; the lock taken by the end waits for an append in flight;
- an aborted transaction's batches stored by b are gone.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable

import asyncpg
import pytest

from pgstore.cluster import ClusterSettings
from pgstore.consumer_offsets import PgConsumerOffsets
from pgstore.membership import Listener
from pgstore.node import PgNodeSettings, PgNodeStorage
from pgstore.remote_txn import REMOTE_ORDINALS, RemoteTxnMoved
from tablets import batch as batch_header
from testkit import postgres
from testkit.batches import decode_batches, make_batch
from testkit.pg_engines import until
from testkit.postgres import PostgresServer
from txn.coordinator import TransactionCoordinator
from txn.errors import InvalidProducerIdMapping, InvalidTxnState, ProducerFenced
from txn.remote_produce import RemoteTransactions

pg_server = postgres.server_fixture("module")
TIMEOUT = 60
LEASE = 1.5
PARTITIONS = 4


def now() -> int:
    return int(time.time() * 1000)


def run(body: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(body(), TIMEOUT)

    asyncio.run(bounded())


class Gateway:
    """One gateway's engine and transaction coordinator, wired as the server does."""

    def __init__(self, node: PgNodeStorage) -> None:
        self.node = node
        cluster = node.cluster()
        assert cluster is not None
        self.cluster = cluster
        self.txns = TransactionCoordinator(node)
        self.txns.load()
        self.remote = RemoteTransactions(node.remote_transactions(), cluster.coordinates)
        self.txns.remote = self.remote

    async def produce(self, txn_id: str, pid: int, epoch: int, index: int,
                      batch: bytes) -> int:
        """A transactional Produce of ``batch`` to partition ``index``, led here,
        as kafka_gateway/apis/produce.py makes it for an id coordinated elsewhere."""
        assert not self.remote.coordinates(txn_id)
        log = self.node.partition("t", index)
        sink = self.remote.sink(await self.remote.read(txn_id), txn_id, pid, epoch, "t",
                                index, log.topic_id)
        return (await log.append(batch, now(), sink)).base_offset


async def gateway(pg: PostgresServer, schema: str, node_id: int) -> PgNodeStorage:
    node = PgNodeStorage(pg.dsn, PgNodeSettings(
        schema=schema, cluster=ClusterSettings(node_id=node_id, lease_seconds=LEASE)),
        offsets=PgConsumerOffsets)
    await node.start()
    await node.join_cluster([Listener("PLAINTEXT", f"gw{node_id}", 9000 + node_id)])
    return node


async def two_gateways(pg: PostgresServer) -> tuple[Gateway, Gateway, str, int, int]:
    """(a, b, a transactional id a coordinates, a partition b leads, one a leads)."""
    schema = f"remote_{uuid.uuid4().hex[:10]}"
    a_node = await gateway(pg, schema, 1)
    b_node = await gateway(pg, schema, 2)
    await a_node.create_topic("t", PARTITIONS, {})
    ca, cb = a_node.cluster(), b_node.cluster()
    assert ca is not None and cb is not None
    await until(lambda: b_node.find_topic("t") is not None
                and all(ca.leads("t", i) != cb.leads("t", i) for i in range(PARTITIONS))
                and any(cb.leads("t", i) for i in range(PARTITIONS))
                and any(ca.leads("t", i) for i in range(PARTITIONS)), "partitions shared",
                4 * LEASE)
    await until(lambda: any(ca.coordinates(f"x{i}") for i in range(50))
                and all(ca.coordinates(f"x{i}") != cb.coordinates(f"x{i}")
                        for i in range(50)), "coordinator slots shared", 4 * LEASE)
    txn_id = next(f"x{i}" for i in range(50) if ca.coordinates(f"x{i}"))
    b_led = next(i for i in range(PARTITIONS) if cb.leads("t", i))
    a_led = next(i for i in range(PARTITIONS) if ca.leads("t", i))
    return Gateway(a_node), Gateway(b_node), txn_id, b_led, a_led


def txn_batch(pid: int, epoch: int, values: list[bytes], seq: int) -> bytes:
    return make_batch(list(values), base_timestamp=now(), producer_id=pid,
                      producer_epoch=epoch, base_sequence=seq,
                      attributes=batch_header.ATTR_TRANSACTIONAL)


async def log_of(node: PgNodeStorage, index: int) -> list[tuple[int, bool, list[bytes]]]:
    """(base offset, control, values) of every batch of partition ``index``,
    read through ``node`` once it leads it and its high watermark is at the
    row's log end."""
    log = node.partition("t", index)
    read = await log.read(0, 1 << 22)
    out = []
    for data in read.batches:
        assert isinstance(data, bytes)
        header = batch_header.parse_batches(memoryview(data))[0]
        out.append((header.base_offset, header.is_control,  # a marker's values: none
                    [] if header.is_control else
                    [r["value"] for b in decode_batches(data) for r in b["records"]]))
    return out


async def count(pg: PostgresServer, sql: str) -> int:
    conn = await asyncpg.connect(pg.dsn)
    try:
        return int(await conn.fetchval(sql))
    finally:
        await conn.close()


def test_a_batch_stored_by_the_leader_is_committed_by_the_coordinator_once(
        pg_server: PostgresServer) -> None:
    async def body() -> None:
        a, b, txn_id, b_led, a_led = await two_gateways(pg_server)
        schema = a.node.settings.schema
        try:
            pid, epoch = await a.txns.init_producer_id(txn_id, 60_000)
            # Kafka's answers before the partition is added / for others.
            with pytest.raises(InvalidTxnState):
                await b.produce(txn_id, pid, epoch, b_led, txn_batch(pid, epoch, [b"0"], 0))
            await a.txns.add_partitions(txn_id, pid, epoch, [("t", b_led), ("t", a_led)])
            with pytest.raises(ProducerFenced):
                await b.produce(txn_id, pid, epoch + 1, b_led,
                                txn_batch(pid, epoch + 1, [b"0"], 0))
            with pytest.raises(InvalidProducerIdMapping):
                await b.produce(txn_id, pid + 1, epoch, b_led, txn_batch(pid + 1, epoch, [b"0"], 0))
            unknown = next(f"nobody{i}" for i in range(100) if a.cluster.coordinates(f"nobody{i}"))
            with pytest.raises(InvalidProducerIdMapping):
                await b.produce(unknown, pid, epoch, b_led, txn_batch(pid, epoch, [b"0"], 0))
            # Three batches through b, in sequence, one retried.
            first = txn_batch(pid, epoch, [b"b0", b"b1"], 0)
            assert await b.produce(txn_id, pid, epoch, b_led, first) == -1
            assert await b.produce(txn_id, pid, epoch, b_led,
                                   txn_batch(pid, epoch, [b"b2"], 2)) == -1
            assert await b.produce(txn_id, pid, epoch, b_led, first) == -1  # a retry
            assert await b.produce(txn_id, pid, epoch, b_led,
                                   txn_batch(pid, epoch, [b"b3", b"b4", b"b5"], 3)) == -1
            assert await count(pg_server, f"SELECT count(*) FROM {schema}.pending_batches") == 3
            # And one of a's own partition through a's own sink.
            own = a.txns.sink_for(txn_id, pid, epoch, "t", a_led)
            await a.node.partition("t", a_led).append(txn_batch(pid, epoch, [b"a0"], 0), now(),
                                                      own)
            assert await log_of(b.node, b_led) == []  # nothing visible before the commit
            await a.txns.end_txn(txn_id, pid, epoch, True)
            led = b.node.partition("t", b_led)
            await until(lambda: led.high_watermark == 7, "b's log end moved by the commit", 5)
            assert await log_of(b.node, b_led) == [
                (0, False, [b"b0", b"b1"]), (2, False, [b"b2"]),
                (3, False, [b"b3", b"b4", b"b5"]), (6, True, [])]
            mine = a.node.partition("t", a_led)
            await until(lambda: mine.high_watermark == 2, "a's log end moved by the commit", 5)
            assert [(o, c) for o, c, _ in await log_of(a.node, a_led)] == [(0, False), (1, True)]
            assert await count(pg_server, f"SELECT count(*) FROM {schema}.pending_batches") == 0
            # The next transaction's batch through b goes after the marker.
            await a.txns.add_partitions(txn_id, pid, epoch, [("t", b_led)])
            await b.produce(txn_id, pid, epoch, b_led, txn_batch(pid, epoch, [b"n"], 6))
            await a.txns.end_txn(txn_id, pid, epoch, True)
            await until(lambda: led.high_watermark == 9, "b's log end moved again", 5)
            assert (await log_of(b.node, b_led))[-2:] == [(7, False, [b"n"]), (8, True, [])]
        finally:
            await a.node.close()
            await b.node.close()

    run(body)


def test_a_batch_arriving_after_the_end_began_is_refused_and_never_published(
        pg_server: PostgresServer) -> None:
    async def body() -> None:
        a, b, txn_id, b_led, _ = await two_gateways(pg_server)
        schema = a.node.settings.schema
        try:
            pid, epoch = await a.txns.init_producer_id(txn_id, 60_000)
            await a.txns.add_partitions(txn_id, pid, epoch, [("t", b_led)])
            log = b.node.partition("t", b_led)
            await b.produce(txn_id, pid, epoch, b_led, txn_batch(pid, epoch, [b"in"], 0))
            # Checked on the state read before the end...
            late = b.remote.sink(await b.remote.read(txn_id), txn_id, pid, epoch, "t", b_led,
                                 log.topic_id)
            # b's append in flight (its PostgreSQL transaction, as b makes
            # it: fenced on the rows, share-locked, then the pending row),
            # not committed when the end begins: the end waits for it, and
            # publishes its batch.
            remote = b.node.remote_transactions()
            meta = await b.remote.read(txn_id)
            assert meta is not None
            held = batch_header.stamp(memoryview(txn_batch(pid, epoch, [b"held"], 1)),
                                      batch_header.parse_batches(memoryview(
                                          txn_batch(pid, epoch, [b"held"], 1)))[0], 0, 0)
            holder = await asyncpg.connect(pg_server.dsn)
            tx = holder.transaction()
            await tx.start()
            assert await holder.fetchval(remote._sql.fence, log.log_id, log.leader_epoch,
                                         txn_id, pid, epoch, meta.instance, log.topic_id,
                                         b_led) == 1
            await holder.execute(remote._sql.put, log.log_id, held, meta.instance,
                                 REMOTE_ORDINALS, held[:batch_header.HEADER_SIZE], len(held))
            ending = asyncio.ensure_future(a.txns.end_txn(txn_id, pid, epoch, True))
            await asyncio.sleep(0.5)
            assert not ending.done(), "the commit did not wait for the append holding the row"
            await tx.commit()
            await holder.close()
            await ending
            # ... and appended after it began: refused, nothing stored.
            with pytest.raises(RemoteTxnMoved):
                await log.append(txn_batch(pid, epoch, [b"late"], 1), now(), late)
            await until(lambda: log.high_watermark == 3, "b's log end moved by the commit", 5)
            assert await log_of(b.node, b_led) == [(0, False, [b"in"]), (1, False, [b"held"]),
                                                   (2, True, [])]
            assert await count(pg_server, f"SELECT count(*) FROM {schema}.pending_batches") == 0
            # Read again, the state says why: no open transaction.
            with pytest.raises(InvalidTxnState):
                await b.produce(txn_id, pid, epoch, b_led, txn_batch(pid, epoch, [b"late"], 1))
        finally:
            await a.node.close()
            await b.node.close()

    run(body)


def test_an_aborted_transaction_leaves_nothing_of_the_leaders_batches(
        pg_server: PostgresServer) -> None:
    async def body() -> None:
        a, b, txn_id, b_led, _ = await two_gateways(pg_server)
        schema = a.node.settings.schema
        try:
            pid, epoch = await a.txns.init_producer_id(txn_id, 60_000)
            await a.txns.add_partitions(txn_id, pid, epoch, [("t", b_led)])
            await b.produce(txn_id, pid, epoch, b_led, txn_batch(pid, epoch, [b"x", b"y"], 0))
            await b.produce(txn_id, pid, epoch, b_led, txn_batch(pid, epoch, [b"z"], 2))
            assert await count(pg_server, f"SELECT count(*) FROM {schema}.pending_batches") == 2
            await a.txns.end_txn(txn_id, pid, epoch, False)
            assert await count(pg_server, f"SELECT count(*) FROM {schema}.pending_batches") == 0
            log_id = b.node.partition("t", b_led).log_id
            assert await count(pg_server, f"SELECT count(*) FROM {schema}.batch_data "
                                          f"WHERE log_id = {log_id}") == 0
            with pytest.raises(InvalidTxnState):
                await b.produce(txn_id, pid, epoch, b_led, txn_batch(pid, epoch, [b"w"], 3))
            assert await log_of(b.node, b_led) == []
        finally:
            await a.node.close()
            await b.node.close()

    run(body)


def test_the_restarted_coordinator_commits_the_leaders_batches_once(
        pg_server: PostgresServer) -> None:
    """The coordinator restarts (kill -9 between produce and commit): it
    rebuilds the open transaction from the store, where b's rows (ordinals
    from REMOTE_ORDINALS) sit next to its own. Those are b's, published by
    the commit's ``stage_remote_commit``: taken as the coordinator's own too,
    the commit published them twice, the second time finding them gone
    (MissingPending, answered KAFKA_STORAGE_ERROR)."""
    async def body() -> None:
        a, b, txn_id, b_led, a_led = await two_gateways(pg_server)
        schema = a.node.settings.schema
        a2: Gateway | None = None
        try:
            pid, epoch = await a.txns.init_producer_id(txn_id, 60_000)
            await a.txns.add_partitions(txn_id, pid, epoch, [("t", b_led), ("t", a_led)])
            await b.produce(txn_id, pid, epoch, b_led, txn_batch(pid, epoch, [b"b0", b"b1"], 0))
            await b.produce(txn_id, pid, epoch, b_led, txn_batch(pid, epoch, [b"b2"], 2))
            own = a.txns.sink_for(txn_id, pid, epoch, "t", a_led)
            await a.node.partition("t", a_led).append(txn_batch(pid, epoch, [b"a0"], 0), now(),
                                                      own)
            assert await count(pg_server, f"SELECT count(*) FROM {schema}.pending_batches "
                                          f"WHERE ordinal >= {REMOTE_ORDINALS}") == 2
            await a.node.close()  # the coordinator goes; its transaction stays open
            a2 = Gateway(await gateway(pg_server, schema, 1))
            restarted = a2
            await until(lambda: restarted.cluster.coordinates(txn_id)
                        and restarted.cluster.leads("t", a_led)
                        and b.cluster.leads("t", b_led), "the slot and partitions back", 6 * LEASE)
            await until(lambda: txn_id in restarted.txns.open_txns.by_id,
                        "the open transaction loaded", 5)
            await a2.txns.end_txn(txn_id, pid, epoch, True, connection=1)  # a new connection
            led = b.node.partition("t", b_led)
            await until(lambda: led.high_watermark == 4, "b's log end moved by the commit", 5)
            assert await log_of(b.node, b_led) == [
                (0, False, [b"b0", b"b1"]), (2, False, [b"b2"]), (3, True, [])]
            mine = a2.node.partition("t", a_led)
            await until(lambda: mine.high_watermark == 2, "a's log end moved by the commit", 5)
            assert [(o, c) for o, c, _ in await log_of(a2.node, a_led)] == [(0, False), (1, True)]
            assert await count(pg_server, f"SELECT count(*) FROM {schema}.pending_batches") == 0
        finally:
            if a2 is not None:
                await a2.node.close()
            else:
                await a.node.close()
            await b.node.close()

    run(body)


def test_a_commit_that_waited_for_another_writer_keeps_the_time_index_in_offset_order(
        pg_server: PostgresServer) -> None:
    """The commit publishing b's batch waits for another writer's change on
    the partition row (one that stored a batch stamped after it). Its rows'
    running max timestamps still include that batch, and retention by time
    (cutoff before both) deletes nothing: before the fix the published batch
    kept its own, older running max, and the cut landed on it, deleting the
    newer batch before it (seen as a Spark reshard's lost records)."""
    async def body() -> None:
        a, b, txn_id, b_led, _ = await two_gateways(pg_server)
        schema = a.node.settings.schema
        log_id = b.node.partition("t", b_led).log_id
        writer = await asyncpg.connect(pg_server.dsn)
        try:
            pid, epoch = await a.txns.init_producer_id(txn_id, 60_000)
            await a.txns.add_partitions(txn_id, pid, epoch, [("t", b_led)])
            early, late = now() - 5_000, now()
            await b.produce(txn_id, pid, epoch, b_led,
                            make_batch([b"txn"], base_timestamp=early, producer_id=pid,
                                       producer_epoch=epoch, base_sequence=0,
                                       attributes=batch_header.ATTR_TRANSACTIONAL))
            # Another writer's change, as PostgreSQL holds it before its
            # commit: the row locked and moved, one batch stamped ``late``.
            other = make_batch([b"other"], base_timestamp=late)
            tx = writer.transaction()
            await tx.start()
            at = await writer.fetchval(
                f"UPDATE {schema}.partitions SET log_end_offset = log_end_offset + 1, "
                "size_bytes = size_bytes + $2 WHERE log_id = $1 RETURNING log_end_offset - 1",
                log_id, len(other))
            assert at == 0
            data_id = await writer.fetchval(
                f"INSERT INTO {schema}.batch_data (log_id, data) VALUES ($1, $2) "
                "RETURNING data_id", log_id, other)
            await writer.execute(
                f"INSERT INTO {schema}.batches (log_id, base_offset, last_offset, max_timestamp, "
                "running_max_timestamp, size, data_id, shifted) "
                "VALUES ($1, 0, 0, $2, $2, $3, $4, false)", log_id, late, len(other), data_id)
            commit = asyncio.ensure_future(a.txns.end_txn(txn_id, pid, epoch, True))
            waiting = ("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                       f"AND query LIKE '%{schema}%.partitions%'")
            for _ in range(200):  # the premise: the commit waits for the row
                if await count(pg_server, waiting) or commit.done():
                    break
                await asyncio.sleep(0.02)
            assert not commit.done() and await count(pg_server, waiting) == 1
            await tx.commit()
            await commit
            rows = await writer.fetch(
                f"SELECT base_offset, max_timestamp, running_max_timestamp FROM {schema}.batches "
                "WHERE log_id = $1 ORDER BY base_offset", log_id)
            assert [(r[0], r[1]) for r in rows][:2] == [(0, late), (1, early)]
            running = [r[2] for r in rows]
            assert running == sorted(running) and running[1] == late, rows
            # Retention by time, the cutoff before both records: nothing goes.
            led = b.node.partition("t", b_led)
            await until(lambda: led.high_watermark == 3, "b read the log end again", 5)
            await b.node.set_topic_configs("t", {"retention.ms": "60000"})
            await b.node.enforce_retention()
            assert led.log_start_offset == 0
            assert [(o, c) for o, c, _ in await log_of(b.node, b_led)] == [
                (0, False), (1, False), (2, True)]
        finally:
            await writer.close()
            await a.node.close()
            await b.node.close()

    run(body)
