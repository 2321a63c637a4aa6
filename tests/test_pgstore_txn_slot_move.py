"""A transactional batch of the coordinator's own in flight while the
transactional id's coordinator slot moves to another gateway (issue 22; a
rebalance, not a kill: the old coordinator goes on and still leads the
partition), at engine level on a throwaway PostgreSQL: two gateways'
engines in one process, wired as kafka_gateway/server.py wires them.

The batch's write is fenced by the slot in its PostgreSQL transaction
(``pgstore.txn_slots.fence_pending``), so either

- it is still in flight (not in PostgreSQL) when the slot moves and the new
  coordinator reads the id's pending rows: it is refused, nothing of it
  stored, answered KAFKA_STORAGE_ERROR (retriable); the client's retry of
  the same batch goes to the partition's leader, which stores it for the
  transaction the other gateway coordinates now, and the commit through the
  new coordinator holds every acknowledged batch once; or
- it is in PostgreSQL, past its fence, when the slot is taken: the takeover
  waits for it, and the new coordinator, which reads the pending rows after
  its takeover, commits it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable

import asyncpg
from kio.schema.errors import ErrorCode

from kafka_gateway.errors import error_code
from pgstore.cluster import ClusterSettings, PgCluster
from pgstore.consumer_offsets import PgConsumerOffsets
from pgstore.membership import Listener
from pgstore.migrate import quoted
from pgstore.node import PgNodeSettings, PgNodeStorage
from tablets import batch as batch_header
from tablets.errors import StorageError
from tablets.seam import BlobSink
from testkit import postgres
from testkit.batches import decode_batches, make_batch
from testkit.pg_engines import HeldWrites, move_slot, until
from testkit.postgres import PostgresServer
from txn.coordinator import TransactionCoordinator
from txn.remote_produce import RemoteTransactions

pg_server = postgres.server_fixture("module")
TIMEOUT = 60
LEASE = 1.5


class Gateway:
    """One gateway's engine and transaction coordinator, wired as the server does."""

    def __init__(self, node: PgNodeStorage) -> None:
        self.node = node
        cluster = node.cluster()
        assert cluster is not None
        self.cluster: PgCluster = cluster
        self.txns = TransactionCoordinator(node)
        self.txns.in_cluster(cluster.coordinates)
        cluster.watch_coordination(self.txns.drop, self.txns.load_gained)
        self.txns.reload = cluster.reload_coordinated
        self.remote = RemoteTransactions(node.remote_transactions(), cluster.coordinates)
        self.txns.remote = self.remote
        self.txns.load()

    async def produce(self, txn_id: str, pid: int, epoch: int, batch: bytes) -> None:
        """A transactional Produce of ``batch`` to t-0 (led here), as
        kafka_gateway/apis/produce.py makes it: through the coordinator's own
        sink while this gateway coordinates the id, else on its stored state."""
        log = self.node.partition("t", 0)
        sink: BlobSink
        if self.remote.coordinates(txn_id):
            sink = self.txns.sink_for(txn_id, pid, epoch, "t", 0)
        else:
            sink = self.remote.sink(await self.remote.read(txn_id), txn_id, pid, epoch, "t", 0,
                                    log.topic_id)
        await log.append(batch, now(), sink)


def now() -> int:
    return int(time.time() * 1000)


def run(body: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(body(), TIMEOUT)

    asyncio.run(bounded())


async def gateway(pg: PostgresServer, schema: str, node_id: int) -> Gateway:
    node = PgNodeStorage(pg.dsn, PgNodeSettings(
        schema=schema, cluster=ClusterSettings(node_id=node_id, lease_seconds=LEASE)),
        offsets=PgConsumerOffsets)
    await node.start()
    gw = Gateway(node)
    await node.join_cluster([Listener("PLAINTEXT", f"gw{node_id}", 9000 + node_id)])
    return gw


def txn_batch(pid: int, epoch: int, value: bytes, seq: int) -> bytes:
    return make_batch([value], base_timestamp=now(), producer_id=pid, producer_epoch=epoch,
                      base_sequence=seq, attributes=batch_header.ATTR_TRANSACTIONAL)


async def pending_rows(pg: PostgresServer, schema: str) -> int:
    conn = await asyncpg.connect(pg.dsn)
    try:
        return int(await conn.fetchval(f"SELECT count(*) FROM {quoted(schema)}.pending_batches"))
    finally:
        await conn.close()


async def committed_values(pg: PostgresServer, gw: Gateway) -> list[bytes]:
    """The values of t-0's data batches, read through its leader ``gw`` once
    its high watermark reached the stored log end; the last batch is the
    COMMIT marker."""
    schema = gw.node.settings.schema
    conn = await asyncpg.connect(pg.dsn)
    try:
        end = int(await conn.fetchval(
            f"SELECT log_end_offset FROM {quoted(schema)}.partitions"))
    finally:
        await conn.close()
    log = gw.node.partition("t", 0)
    await until(lambda: log.high_watermark == end, f"t-0's high watermark at {end}", 10)
    read = await log.read(0, 1 << 22)
    values: list[bytes] = []
    controls = []
    for data in read.batches:
        assert isinstance(data, bytes)
        header = batch_header.parse_batches(memoryview(data))[0]
        controls.append(header.is_control)
        if not header.is_control:
            values += [r["value"] for b in decode_batches(data) for r in b["records"]]
    assert controls and controls[-1] and not any(controls[:-1]), controls
    return values


async def coordinated_by_a(pg: PostgresServer) -> tuple[Gateway, str, int, str]:
    """Gateway a, alone, leading t-0 and coordinating a transactional id
    (returned, with its slot); and the schema."""
    schema = f"slotmv_{uuid.uuid4().hex[:10]}"
    a = await gateway(pg, schema, 1)
    await a.node.create_topic("t", 1, {})
    await until(lambda: a.cluster.leads("t", 0), "t-0 led by a", 3 * LEASE)
    await until(lambda: any(a.cluster.coordinates(f"x{i}") for i in range(50)),
                "a coordinator slot led by a", 3 * LEASE)
    txn_id = next(f"x{i}" for i in range(50) if a.cluster.coordinates(f"x{i}"))
    held = a.cluster.slot_held(txn_id)
    assert held is not None
    return a, txn_id, held[0], schema


def test_a_batch_in_flight_when_the_slot_moves_is_refused_then_retried_through_the_leader(
        pg_server: PostgresServer) -> None:
    async def body() -> None:
        a, txn_id, slot, schema = await coordinated_by_a(pg_server)
        b: Gateway | None = None
        try:
            pid, epoch = await a.txns.init_producer_id(txn_id, 60_000)
            await a.txns.add_partitions(txn_id, pid, epoch, [("t", 0)])
            await a.produce(txn_id, pid, epoch, txn_batch(pid, epoch, b"v0", 0))
            acknowledged = [b"v0"]
            # The next batch's write is queued on a, not yet in PostgreSQL.
            log = a.node.partition("t", 0)
            held = HeldWrites(log.writer)
            log.writer = held  # type: ignore[assignment]
            second = txn_batch(pid, epoch, b"v1", 1)
            in_flight = asyncio.ensure_future(a.produce(txn_id, pid, epoch, second))
            await until(lambda: len(held.held) == 1, "the second batch's write queued", 5)

            b = await gateway(pg_server, schema, 2)
            await move_slot(pg_server, schema, slot, 2)  # a rebalance: a goes on
            await until(lambda: b.cluster.coordinates(txn_id), "coordinated by b", 3 * LEASE)
            await until(lambda: txn_id not in a.txns.txns, "dropped by a", 3 * LEASE)
            assert a.cluster.leads("t", 0)  # the partition stays a's
            # The premise: b read the id's pending rows while the write was in flight.
            assert not in_flight.done() and len(held.held) == 1
            assert await pending_rows(pg_server, schema) == 1
            assert b.txns.describe(txn_id).is_open

            assert held.release() == 1
            try:
                await in_flight
                acknowledged.append(b"v1")
                refused: StorageError | None = None
            except StorageError as exc:
                refused = exc
            log.writer = held.writer
            if refused is not None:
                # Nothing of it stored; the client retries it (same
                # sequence), through the leader, a, which does not
                # coordinate the id any more.
                assert await pending_rows(pg_server, schema) == 1
                await a.produce(txn_id, pid, epoch, second)
                acknowledged.append(b"v1")
                assert await pending_rows(pg_server, schema) == 2

            # b took a's batch (v0) as its own, recovered from the store; t-0
            # is not b's, so its commit publishes it with a's later one.
            storage = b.node.transaction_storage()
            log_ref = storage.log_ref(b.node.partition("t", 0))
            instance = b.txns.describe(txn_id).instance
            assert len(storage.recover_pending(log_ref, instance)) == 1
            await b.txns.end_txn(txn_id, pid, epoch, commit=True, connection=1)
            # Every acknowledged batch is in the commit, once, in order; nothing else.
            assert await committed_values(pg_server, a) == acknowledged
            assert await pending_rows(pg_server, schema) == 0
            assert storage.recover_pending(log_ref, instance) == []  # forgotten
            # And the batch that raced the move was refused, retriably.
            assert refused is not None, "the batch landed after the slot moved"
            assert error_code(refused) is ErrorCode.kafka_storage_error
        finally:
            await a.node.close()
            if b is not None:
                await b.node.close()

    run(body)


async def waiting_on_lock(pg: PostgresServer, table: str) -> bool:
    """Whether a backend waits for a row lock in a statement naming ``table``."""
    conn = await asyncpg.connect(pg.dsn)
    try:
        return bool(await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE $1 AND pid <> pg_backend_pid()", f"%.{table}%"))
    finally:
        await conn.close()


def test_a_batch_past_its_fence_when_the_slot_is_taken_is_waited_for_and_committed(
        pg_server: PostgresServer) -> None:
    async def body() -> None:
        a, txn_id, slot, schema = await coordinated_by_a(pg_server)
        s = quoted(schema)
        b: Gateway | None = None
        blocker = await asyncpg.connect(pg_server.dsn)
        try:
            pid, epoch = await a.txns.init_producer_id(txn_id, 60_000)
            await a.txns.add_partitions(txn_id, pid, epoch, [("t", 0)])
            await a.produce(txn_id, pid, epoch, txn_batch(pid, epoch, b"v0", 0))
            log_id = a.node.partition("t", 0).log_id
            instance = a.txns.describe(txn_id).instance
            # The next batch's pending row (ordinal 1) waits in PostgreSQL,
            # past its fence, behind an uncommitted row of the same key.
            block = blocker.transaction()
            await block.start()
            data_id = await blocker.fetchval(
                f"INSERT INTO {s}.batch_data (log_id, data) VALUES ($1, '\\x00') "
                "RETURNING data_id", log_id)
            await blocker.execute(
                f"INSERT INTO {s}.pending_batches (log_id, instance, ordinal, header, size, "
                "data_id) VALUES ($1, $2, 1, '\\x00', 1, $3)", log_id, instance, data_id)
            in_flight = asyncio.ensure_future(
                a.produce(txn_id, pid, epoch, txn_batch(pid, epoch, b"v1", 1)))
            await until_async(lambda: waiting_on_lock(pg_server, "pending_batches"),
                              "the second batch's write waiting in PostgreSQL", 5)

            b = await gateway(pg_server, schema, 2)
            move = asyncio.ensure_future(move_slot(pg_server, schema, slot, 2))
            # The premise: the takeover waits for the batch (its slot row lock).
            await until_async(lambda: waiting_on_lock(pg_server, "coordinator_slots"),
                              "the takeover waiting for the batch", 5)
            assert not move.done() and not in_flight.done()

            await block.rollback()
            await in_flight  # acknowledged
            await move
            await until(lambda: b.cluster.coordinates(txn_id), "coordinated by b", 3 * LEASE)
            await until(lambda: txn_id not in a.txns.txns, "dropped by a", 3 * LEASE)
            assert a.cluster.leads("t", 0)
            await b.txns.end_txn(txn_id, pid, epoch, commit=True, connection=1)
            assert await committed_values(pg_server, a) == [b"v0", b"v1"]
            assert await pending_rows(pg_server, schema) == 0
        finally:
            await blocker.close()
            await a.node.close()
            if b is not None:
                await b.node.close()

    run(body)


async def until_async(check: Callable[[], Awaitable[bool]], what: str, within: float) -> None:
    """``until`` for a check that reads PostgreSQL."""
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} within {within} s")
        await asyncio.sleep(0.05)
