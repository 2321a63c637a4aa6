"""Transaction coordinators in a cluster of PostgreSQL gateways (issue 22,
"Coordinators": an open transaction survives its coordinator's death and can
still be committed or aborted; its timeout keeps running), at engine level on
a throwaway PostgreSQL: two gateways' engines in one process, each with a
``TransactionCoordinator`` wired as kafka_gateway/server.py wires it.

- a transactional id's slot moves from a to b while a transaction of it is
  open with a batch stored: b reads the id (state, partitions, pending
  rows) before it answers for it, commits it (the batch and the COMMIT
  marker land in the log), and times out another one of the same slot from
  its persisted start (aborted, its pending rows deleted); a dropped both,
  and answers NOT_COORDINATOR for them;
- a stale coordinator (the slot moved in PostgreSQL, its own view pinned to
  what it held, as before its pass notices) has its commit and its timeout
  refused inside the PostgreSQL transaction (``CoordinatorMoved``:
  NOT_COORDINATOR): nothing of either lands, and it drops the ids, so a
  retried EndTxn is not answered from what its memory staged.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from collections.abc import Awaitable, Callable

import asyncpg
import pytest
from kio.schema.errors import ErrorCode

from kafka_gateway.errors import error_code
from pgstore.cluster import PgCluster
from pgstore.leadership import coordinator_slot
from pgstore.migrate import quoted
from pgstore.node import PgNodeStorage
from tablets import batch as batch_header
from tablets.errors import CoordinatorMoved
from testkit import postgres
from testkit.batches import make_batch
from testkit.pg_engines import move_slot, until
from testkit.pg_gateways import LEASE, join, started_node
from testkit.postgres import PostgresServer
from txn.coordinator import TransactionCoordinator

pg_server = postgres.server_fixture("module")
TIMEOUT = 60
TXN_TIMEOUT_MS = 8000


@dataclasses.dataclass
class Gateway:
    node: PgNodeStorage
    cluster: PgCluster
    txns: TransactionCoordinator
    skew_ms: list[int]  # added to the coordinator's clock (a test moves time on)


def clock_of(skew: list[int]) -> Callable[[], int]:
    return lambda: int(time.time() * 1000) + skew[0]


async def gateway(pg: PostgresServer, schema: str, node_id: int,
                  wired: bool = True) -> Gateway:
    node, cluster, _offsets = await started_node(pg, schema, node_id)
    skew = [0]
    txns = TransactionCoordinator(node, clock=clock_of(skew))
    if wired:  # as kafka_gateway/server.py wires it
        txns.in_cluster(cluster.coordinates)
        cluster.watch_coordination(txns.drop, txns.load_gained)
    txns.load()
    await join(node, node_id)
    return Gateway(node, cluster, txns, skew)


def run(body: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(body(), TIMEOUT)

    asyncio.run(bounded())


def ids_in_slot(slot: int, count: int) -> list[str]:
    return [t for t in (f"txn-{i}" for i in range(100_000)) if coordinator_slot(t) == slot][
        :count]


async def db(pg: PostgresServer, sql: str, *args: object) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(pg.dsn)
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


async def stored_state(pg: PostgresServer, schema: str, transactional_id: str) -> str:
    rows = await db(pg, f"SELECT state FROM {quoted(schema)}.txn_states "
                        "WHERE transactional_id = $1", transactional_id)
    assert rows, f"no state row for {transactional_id}"
    return str(json.loads(bytes(rows[0]["state"]))["state"])


async def log_rows(pg: PostgresServer, schema: str) -> tuple[int, int]:
    """(batches in the logs, pending transactional batches) of the schema."""
    s = quoted(schema)
    rows = await db(pg, f"SELECT (SELECT count(*) FROM {s}.batches) AS logged, "
                        f"(SELECT count(*) FROM {s}.pending_batches) AS pending")
    return int(rows[0]["logged"]), int(rows[0]["pending"])


async def open_txn(gw: Gateway, transactional_id: str, partition: int,
                   values: list[bytes | None]) -> tuple[int, int]:
    """InitProducerId, AddPartitionsToTxn and one transactional batch stored
    through ``gw`` (which coordinates the id and leads the partition)."""
    pid, epoch = await gw.txns.init_producer_id(transactional_id, TXN_TIMEOUT_MS)
    await gw.txns.add_partitions(transactional_id, pid, epoch, [("t", partition)])
    sink = gw.txns.sink_for(transactional_id, pid, epoch, "t", partition)
    batch = make_batch(values, base_timestamp=int(time.time() * 1000), producer_id=pid,
                       producer_epoch=epoch, base_sequence=0,
                       attributes=batch_header.ATTR_TRANSACTIONAL)
    await gw.node.partition("t", partition).append(batch, int(time.time() * 1000), sink)
    return pid, epoch


def test_an_open_transaction_follows_its_slot_to_the_new_coordinator(
        pg_server: PostgresServer) -> None:
    schema = f"txfo_{uuid.uuid4().hex[:10]}"

    async def body() -> None:
        a = await gateway(pg_server, schema, 1)
        await a.node.create_topic("t", 1, {})  # led by a: it is alone yet
        await until(lambda: a.cluster.leads("t", 0), "t-0 led by a", 3 * LEASE)
        slot = min(a.cluster.leadership.led_slots)  # type: ignore[union-attr]
        committed, timed_out = ids_in_slot(slot, 2)
        await until(lambda: a.cluster.coordinates(committed), "coordinated by a", 3 * LEASE)
        pid, epoch = await open_txn(a, committed, 0, [b"c1", b"c2"])
        await open_txn(a, timed_out, 0, [b"x1"])
        assert await log_rows(pg_server, schema) == (0, 2)

        b = await gateway(pg_server, schema, 2)
        assert committed not in b.txns.txns  # not b's: not loaded at its start
        await move_slot(pg_server, schema, slot, 2)
        await until(lambda: b.cluster.coordinates(committed), "coordinated by b", 3 * LEASE)
        await until(lambda: committed not in a.txns.txns, "dropped by a", 3 * LEASE)
        assert timed_out not in a.txns.txns and a.txns.open_count == 0
        assert a.txns.pending_bytes == 0  # its memory given back
        # a answers NOT_COORDINATOR now, b has both open, with their batches.
        with pytest.raises(CoordinatorMoved) as moved:
            await a.txns.end_txn(committed, pid, epoch, commit=True)
        assert error_code(moved.value) is ErrorCode.not_coordinator
        assert b.txns.describe(committed).is_open and b.txns.describe(timed_out).is_open
        assert b.txns.pending_of(committed) is not None
        assert b.txns.pending_of(committed)[0] > 0  # type: ignore[index]
        assert b.node.partition("t", 0).fenced  # the partition stays a's

        # b commits the first: its batch and the marker land in the log. (A
        # transaction loaded from the store counts every connection as opened
        # after it began, as after a restart: KAFKA-17754's check.)
        await b.txns.end_txn(committed, pid, epoch, commit=True, connection=1)
        assert await stored_state(pg_server, schema, committed) == "CompleteCommit"
        assert await log_rows(pg_server, schema) == (2, 1)
        # The second is past its timeout (counted from its persisted start)
        # on b's clock: b's expiry aborts it and deletes its pending rows.
        await b.txns.expire()
        assert await stored_state(pg_server, schema, timed_out) == "Ongoing"  # not yet
        b.skew_ms[0] = TXN_TIMEOUT_MS + 1000
        a.skew_ms[0] = TXN_TIMEOUT_MS + 1000
        await a.txns.expire()  # a holds nothing of them any more
        assert await stored_state(pg_server, schema, timed_out) == "Ongoing"
        await b.txns.expire()
        assert await stored_state(pg_server, schema, timed_out) == "CompleteAbort"
        assert await log_rows(pg_server, schema) == (2, 0)
        assert b.txns.stats.timeouts == 1 and a.txns.stats.timeouts == 0

        # Back to a: it reads the ids again (b's commit and abort), not its memory.
        await move_slot(pg_server, schema, slot, 1)
        await until(lambda: a.cluster.coordinates(committed), "coordinated by a again",
                    3 * LEASE)
        await until(lambda: committed not in b.txns.txns, "dropped by b", 3 * LEASE)
        assert a.txns.describe(committed).state.value == "CompleteCommit"
        assert a.txns.describe(timed_out).state.value == "CompleteAbort"
        await a.node.close()
        await b.node.close()

    run(body)


def test_a_stale_coordinator_neither_commits_nor_times_out(pg_server: PostgresServer) -> None:
    """Its slot moved in PostgreSQL and it has not noticed (its view pinned
    to what it held, its coordinator not told): its commit and its timeout
    are refused inside the PostgreSQL transaction."""
    schema = f"txfo_{uuid.uuid4().hex[:10]}"

    async def body() -> None:
        a = await gateway(pg_server, schema, 1, wired=False)
        await a.node.create_topic("t", 1, {})
        await until(lambda: a.cluster.leads("t", 0), "t-0 led by a", 3 * LEASE)
        slot = min(a.cluster.leadership.led_slots)  # type: ignore[union-attr]
        committed, timed_out = ids_in_slot(slot, 2)
        await until(lambda: a.cluster.coordinates(committed), "coordinated by a", 3 * LEASE)
        held = a.cluster.slot_held(committed)
        assert held is not None and held[:2] == (slot, 1)
        pid, epoch = await open_txn(a, committed, 0, [b"c1"])
        await open_txn(a, timed_out, 0, [b"x1"])
        assert await log_rows(pg_server, schema) == (0, 2)

        new_epoch = await move_slot(pg_server, schema, slot, 2)
        assert new_epoch > held[2]
        a.node.transaction_storage().slot_holder = lambda _key: held  # a's stale view
        with pytest.raises(CoordinatorMoved) as refused:
            await a.txns.end_txn(committed, pid, epoch, commit=True)
        assert error_code(refused.value) is ErrorCode.not_coordinator
        # What a's memory staged of the refused commit is dropped with the
        # id: a retry answers NOT_COORDINATOR again, never "committed".
        assert committed not in a.txns.txns
        with pytest.raises(CoordinatorMoved):
            await a.txns.end_txn(committed, pid, epoch, commit=True)
        a.skew_ms[0] = TXN_TIMEOUT_MS + 1000
        await a.txns.expire()  # the timeout's write is refused (and logged)
        assert a.txns.stats.timeouts == 1  # it was tried
        assert timed_out not in a.txns.txns and a.txns.open_count == 0

        # Nothing of either landed.
        assert await stored_state(pg_server, schema, committed) == "Ongoing"
        assert await stored_state(pg_server, schema, timed_out) == "Ongoing"
        assert await log_rows(pg_server, schema) == (0, 2)
        # Without the pin, a's own view refuses at once (no write tried).
        a.node.transaction_storage().slot_holder = lambda _key: None
        with pytest.raises(CoordinatorMoved):
            await a.txns.init_producer_id(ids_in_slot(slot, 3)[2], TXN_TIMEOUT_MS)
        await a.node.close()

    run(body)


class _FailingOnce:
    """The coordinator's writer, but its next commit fails with ``error``:
    before the change is sent (``landed`` False: nothing written), or after
    it committed (``landed`` True: a lost answer, the outcome unknown)."""

    def __init__(self, writer: object, error: Exception, landed: bool) -> None:
        self.writer, self.error, self.landed, self.used = writer, error, landed, False

    def begin(self) -> object:
        return self.writer.begin()  # type: ignore[attr-defined]

    def commit(self, change: object) -> asyncio.Future[None]:
        if self.used:
            return self.writer.commit(change)  # type: ignore[attr-defined, no-any-return]
        self.used = True
        failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def fail() -> None:
            if self.landed:
                await self.writer.commit(change)  # type: ignore[attr-defined]
            failed.set_exception(self.error)

        self.task = asyncio.ensure_future(fail())
        return failed


@pytest.mark.parametrize("landed", [False, True], ids=["not-written", "written"])
def test_an_end_whose_write_failed_is_answered_from_the_store_not_from_memory(
        pg_server: PostgresServer, landed: bool) -> None:
    """EndTxn(commit)'s write fails in the store (StoreUnavailable: nothing
    written; OutcomeUnknown: the answer lost after it committed): answered
    NOT_COORDINATOR. What the
    coordinator staged in memory (CompleteCommit) is not trusted: the id is
    read again from PostgreSQL, a retry meanwhile answers NOT_COORDINATOR,
    and the retried EndTxn commits the transaction (not written) or finds it
    committed (written); either way its batch is in the log once."""
    from pgstore.writer import OutcomeUnknown, StoreUnavailable

    schema = f"txfo_{uuid.uuid4().hex[:10]}"

    async def body() -> None:
        a = await gateway(pg_server, schema, 1)
        a.txns.reload = a.cluster.reload_coordinated  # as kafka_gateway/server.py wires it
        await a.node.create_topic("t", 1, {})
        await until(lambda: a.cluster.leads("t", 0), "t-0 led by a", 3 * LEASE)
        slot = min(a.cluster.leadership.led_slots)  # type: ignore[union-attr]
        [transactional_id] = ids_in_slot(slot, 1)
        await until(lambda: a.cluster.coordinates(transactional_id), "coordinated by a",
                    3 * LEASE)
        pid, epoch = await open_txn(a, transactional_id, 0, [b"v1"])
        error = (OutcomeUnknown("the connection broke during COMMIT") if landed
                 else StoreUnavailable("the connection broke before COMMIT"))
        failing = _FailingOnce(a.txns.completion.writer, error, landed)
        a.txns.completion.writer = failing  # type: ignore[assignment]
        # Answered NOT_COORDINATOR, which clients retry (Kafka's answer to a
        # failed write of its transaction log), never KAFKA_STORAGE_ERROR.
        with pytest.raises(CoordinatorMoved) as answered:
            await a.txns.end_txn(transactional_id, pid, epoch, commit=True)
        assert isinstance(answered.value.__cause__, type(error))
        assert error_code(answered.value) is ErrorCode.not_coordinator
        assert failing.used
        # Never "committed" from memory while the store is read again.
        if transactional_id not in a.txns.txns:
            with pytest.raises(CoordinatorMoved):
                await a.txns.end_txn(transactional_id, pid, epoch, commit=True)
        await until(lambda: transactional_id in a.txns.txns, "the id read again", 10)
        assert await stored_state(pg_server, schema, transactional_id) == (
            "CompleteCommit" if landed else "Ongoing")
        # The client's retry, on one of its connections (ids count from 0;
        # a recovered transaction takes an EndTxn from any of them).
        await a.txns.end_txn(transactional_id, pid, epoch, commit=True, connection=7)
        assert await stored_state(pg_server, schema, transactional_id) == "CompleteCommit"
        assert await log_rows(pg_server, schema) == (2, 0)  # the batch and its marker, once
        await a.node.close()

    run(body)
