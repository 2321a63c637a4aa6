"""A transaction whose partition (or whose partition and coordinator slot)
moves two or more times while it is open (issue 22), at engine level on a
throwaway PostgreSQL: two gateways' engines in one process, wired as
kafka_gateway/server.py wires them (``test_pgstore_txn_slot_move.Gateway``).

Its batches of one partition are stored by the coordinator while it leads
the partition (its own: ordinals from 0) and by the partition's leader
while that one does not coordinate the id (the leader's: ordinals from
``REMOTE_ORDINALS``), interleaved in time by the moves. The commit must
publish them in the producer's sequence order, offsets contiguous, the
COMMIT marker last, and the coordinator's log must then know its new end:

- A -> B -> A (the coordinator leads the partition at the commit);
- A -> B -> A -> B (it does not);
- the slot moves to B while A leads the partition, then the partition
  moves to B (the new coordinator leads it, with a batch it recovered);
- the leader's batches straddle the sequences' wrap (2^31-1 to 0);
- and a commit with no move issues the statements it issued before.

Each test asserts its premise (who stored which batch: own or leader's
ordinal, in ``pending_batches`` before the commit).
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
from test_pgstore_txn_slot_move import LEASE, Gateway, gateway, now, run

from pgstore.migrate import quoted
from pgstore.remote_txn import REMOTE_ORDINALS
from pgstore.txn_publication import pending_bytes
from pgstore.writer import PgChange
from tablets import batch as batch_header
from testkit import postgres
from testkit.batches import decode_batches, make_batch
from testkit.pg_engines import move_partition, move_slot, until
from testkit.postgres import PostgresServer

pg_server = postgres.server_fixture("module")
RECORDS = 2  # per batch: offsets contiguous across batches is then a real check


class Cluster:
    """Gateways a (node 1) and b (node 2) over one schema, with one
    partition t-0 and a transactional id a coordinates."""

    def __init__(self, pg: PostgresServer, schema: str, a: Gateway, b: Gateway, txn_id: str,
                 log_id: int) -> None:
        self.pg = pg
        self.schema = schema
        self.a = a
        self.b = b
        self.txn_id = txn_id
        self.log_id = log_id

    async def lead(self, gw: Gateway) -> None:
        """Move t-0 to ``gw`` (a new leader epoch) and wait until both
        gateways know it."""
        other = self.b if gw is self.a else self.a
        await move_partition(self.pg, self.schema, self.log_id, gw.cluster.node_id)
        await until(lambda: gw.cluster.leads("t", 0) and not other.cluster.leads("t", 0),
                    f"t-0 led by node {gw.cluster.node_id}", 4 * LEASE)

    async def pending(self) -> list[tuple[int, int]]:
        """(ordinal, base sequence) of every pending row, by ordinal."""
        conn = await asyncpg.connect(self.pg.dsn)
        try:
            rows = await conn.fetch(f"SELECT ordinal, header FROM {quoted(self.schema)}"
                                    ".pending_batches ORDER BY ordinal")
        finally:
            await conn.close()
        return [(int(r["ordinal"]), struct.unpack_from(">i", r["header"], 53)[0])
                for r in rows]

    async def row_end(self) -> int:
        conn = await asyncpg.connect(self.pg.dsn)
        try:
            return int(await conn.fetchval(
                f"SELECT log_end_offset FROM {quoted(self.schema)}.partitions "
                "WHERE log_id = $1", self.log_id))
        finally:
            await conn.close()

    async def committed(self, leader: Gateway) -> list[bytes]:
        """The values of t-0's data batches, read through its leader once its
        high watermark reached the row's log end; asserts the batches'
        offsets are contiguous from 0 and the COMMIT marker is last."""
        end = await self.row_end()
        log = leader.node.partition("t", 0)
        await until(lambda: log.high_watermark == end, f"t-0's high watermark at {end}", 10)
        read = await log.read(0, 1 << 22)
        values: list[bytes] = []
        controls = []
        expected = 0
        for data in read.batches:
            assert isinstance(data, bytes)
            header = batch_header.parse_batches(memoryview(data))[0]
            assert header.base_offset == expected, (header.base_offset, expected)
            expected = header.base_offset + header.last_offset_delta + 1
            controls.append(header.is_control)
            if not header.is_control:
                values += [r["value"] for b in decode_batches(data) for r in b["records"]]
        assert expected == end, (expected, end)
        assert controls and controls[-1] and not any(controls[:-1]), controls
        return values

    async def begin(self) -> tuple[int, int]:
        """The id's producer id and epoch, its transaction on t-0 begun at a."""
        pid, epoch = await self.a.txns.init_producer_id(self.txn_id, 60_000)
        await self.a.txns.add_partitions(self.txn_id, pid, epoch, [("t", 0)])
        return pid, epoch

    async def close(self) -> None:
        await self.a.node.close()
        await self.b.node.close()


async def cluster(pg: PostgresServer) -> Cluster:
    """a and b sharing the slots, t-0 led by a, an id a coordinates."""
    schema = f"moves_{uuid.uuid4().hex[:10]}"
    a = await gateway(pg, schema, 1)
    b = await gateway(pg, schema, 2)
    await a.node.create_topic("t", 1, {})
    await until(lambda: b.node.find_topic("t") is not None
                and a.cluster.leads("t", 0) != b.cluster.leads("t", 0), "t-0 led", 4 * LEASE)
    await until(lambda: any(a.cluster.coordinates(f"x{i}") for i in range(50))
                and all(a.cluster.coordinates(f"x{i}") != b.cluster.coordinates(f"x{i}")
                        for i in range(50)), "coordinator slots shared", 4 * LEASE)
    txn_id = next(f"x{i}" for i in range(50) if a.cluster.coordinates(f"x{i}"))
    conn = await asyncpg.connect(pg.dsn)
    try:
        log_id = int(await conn.fetchval(f"SELECT log_id FROM {quoted(schema)}.partitions"))
    finally:
        await conn.close()
    found = Cluster(pg, schema, a, b, txn_id, log_id)
    if not a.cluster.leads("t", 0):
        await found.lead(a)
    return found


def with_cluster(pg: PostgresServer, steps: Callable[[Cluster], Awaitable[None]]) -> None:
    """``steps`` on a fresh cluster (``cluster``), closed after."""
    async def body() -> None:
        c = await cluster(pg)
        try:
            await steps(c)
        finally:
            await c.close()

    run(body)


def values(n: int) -> list[bytes]:
    return [f"v{n}.{i}".encode() for i in range(RECORDS)]


def txn_batch(pid: int, epoch: int, n: int, seq: int | None = None,
              records: list[bytes] | None = None) -> bytes:
    """The producer's ``n``-th batch (sequence ``n * RECORDS`` unless given)."""
    return make_batch(list(records or values(n)), base_timestamp=now(), producer_id=pid,
                      producer_epoch=epoch,
                      base_sequence=n * RECORDS if seq is None else seq,
                      attributes=batch_header.ATTR_TRANSACTIONAL)


def expected(*batches: int) -> list[bytes]:
    return [v for n in batches for v in values(n)]


def test_a_to_b_to_a_publishes_in_sequence_order_where_the_coordinator_leads(
        pg_server: PostgresServer) -> None:
    async def steps(c: Cluster) -> None:
        a, b, txn_id = c.a, c.b, c.txn_id
        pid, epoch = await c.begin()
        await a.produce(txn_id, pid, epoch, txn_batch(pid, epoch, 0))  # a's own
        await c.lead(b)
        await b.produce(txn_id, pid, epoch, txn_batch(pid, epoch, 1))  # the leader's
        await c.lead(a)
        await a.produce(txn_id, pid, epoch, txn_batch(pid, epoch, 2))  # a's own
        # The premise: own, leader's, own, by sequence.
        assert await c.pending() == [(0, 0), (1, 2 * RECORDS),
                                     (REMOTE_ORDINALS, RECORDS)]

        await a.txns.end_txn(txn_id, pid, epoch, commit=True, connection=1)
        assert await c.committed(a) == expected(0, 1, 2)
        assert await c.pending() == []
        # a's log learnt its end: its next append lands right after the marker.
        end = await c.row_end()
        log = a.node.partition("t", 0)
        result = await log.append(make_batch([b"after"], base_timestamp=now()), now())
        assert result.base_offset == end
        assert await c.row_end() == end + 1

    with_cluster(pg_server, steps)


def test_a_to_b_to_a_to_b_publishes_in_sequence_order_where_the_coordinator_does_not_lead(
        pg_server: PostgresServer) -> None:
    async def steps(c: Cluster) -> None:
        a, b, txn_id = c.a, c.b, c.txn_id
        pid, epoch = await c.begin()
        await a.produce(txn_id, pid, epoch, txn_batch(pid, epoch, 0))
        await c.lead(b)
        await b.produce(txn_id, pid, epoch, txn_batch(pid, epoch, 1))
        await c.lead(a)
        await a.produce(txn_id, pid, epoch, txn_batch(pid, epoch, 2))
        await c.lead(b)
        await b.produce(txn_id, pid, epoch, txn_batch(pid, epoch, 3))
        assert await c.pending() == [(0, 0), (1, 2 * RECORDS), (REMOTE_ORDINALS, RECORDS),
                                     (REMOTE_ORDINALS + 1, 3 * RECORDS)]

        await a.txns.end_txn(txn_id, pid, epoch, commit=True, connection=1)
        assert await c.committed(b) == expected(0, 1, 2, 3)
        assert await c.pending() == []

    with_cluster(pg_server, steps)


def test_a_slot_move_then_a_partition_move_publish_in_sequence_order(
        pg_server: PostgresServer) -> None:
    async def steps(c: Cluster) -> None:
        a, b, txn_id = c.a, c.b, c.txn_id
        pid, epoch = await c.begin()
        await a.produce(txn_id, pid, epoch, txn_batch(pid, epoch, 0))  # a's own
        # The id's slot goes to b (and one of b's to a: the counts stay
        # even, so no pass moves either back); a goes on leading t-0.
        held = a.cluster.slot_held(txn_id)
        assert held is not None
        other = next(f"x{i}" for i in range(50) if b.cluster.coordinates(f"x{i}"))
        held_b = b.cluster.slot_held(other)
        assert held_b is not None
        await move_slot(pg_server, c.schema, held[0], 2)
        await move_slot(pg_server, c.schema, held_b[0], 1)
        await until(lambda: b.cluster.coordinates(txn_id) and txn_id in b.txns.txns
                    and txn_id not in a.txns.txns, "the id coordinated by b", 4 * LEASE)
        assert a.cluster.leads("t", 0)
        await a.produce(txn_id, pid, epoch, txn_batch(pid, epoch, 1))  # the leader's
        await c.lead(b)
        await b.produce(txn_id, pid, epoch, txn_batch(pid, epoch, 2))  # b's own
        assert await c.pending() == [(0, 0), (1, 2 * RECORDS), (REMOTE_ORDINALS, RECORDS)]

        await b.txns.end_txn(txn_id, pid, epoch, commit=True, connection=1)
        assert await c.committed(b) == expected(0, 1, 2)
        assert await c.pending() == []
        end = await c.row_end()
        result = await b.node.partition("t", 0).append(
            make_batch([b"after"], base_timestamp=now()), now())
        assert result.base_offset == end

    with_cluster(pg_server, steps)


async def store_as_leader(c: Cluster, instance: int, ordinal: int, batch: bytes) -> None:
    """A pending row as a leader stores one (``PgRemoteTxns.stage``'s SQL)."""
    s = quoted(c.schema)
    data = pending_bytes(batch, 0)
    conn = await asyncpg.connect(c.pg.dsn)
    try:
        data_id = await conn.fetchval(
            f"INSERT INTO {s}.batch_data (log_id, data) VALUES ($1, $2) RETURNING data_id",
            c.log_id, data)
        await conn.execute(
            f"INSERT INTO {s}.pending_batches (log_id, instance, ordinal, header, size, "
            "data_id) VALUES ($1, $2, $3, $4, $5, $6)", c.log_id, instance, ordinal,
            data[:batch_header.HEADER_SIZE], len(data), data_id)
    finally:
        await conn.close()


def test_the_leaders_batches_across_the_sequence_wrap_are_published_in_producer_order(
        pg_server: PostgresServer) -> None:
    """A long-lived producer's sequences wrap from 2^31-1 to 0, possibly
    inside a transaction: the batches are published around the wrap, not
    by the raw number (nor in the order their rows were stored here)."""
    async def steps(c: Cluster) -> None:
        a, txn_id = c.a, c.txn_id
        pid, epoch = await c.begin()
        instance = a.txns.describe(txn_id).instance
        top = (1 << 31) - 1
        first = [b"w0", b"w1"]  # sequences top-2, top-1
        second = [b"w2", b"w3", b"w4"]  # top, 0, 1: straddles the wrap
        third = [b"w5"]  # 2
        rows = [(2, third), (top - 2, first), (top, second)]
        for i, (seq, records) in enumerate(rows):
            await store_as_leader(c, instance, REMOTE_ORDINALS + i,
                                  txn_batch(pid, epoch, 0, seq, records))
        assert await c.pending() == [(REMOTE_ORDINALS + i, seq)
                                     for i, (seq, _) in enumerate(rows)]

        await a.txns.end_txn(txn_id, pid, epoch, commit=True, connection=1)
        assert await c.committed(a) == first + second + third

    with_cluster(pg_server, steps)


class StatementsOf:
    """Stands for the coordinator's writer: records the statements of each
    change it writes."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer
        self.changes: list[list[tuple[str, tuple[Any, ...]]]] = []

    def begin(self) -> Any:
        return self.writer.begin()

    def commit(self, change: PgChange) -> Any:
        self.changes.append([(step.sql, tuple(step.args))
                             for step in change._steps])
        return self.writer.commit(change)


# The statements of the commit below, one transactional id and one
# partition with two batches, on main before issue 22's reordering (counted
# there with this test): the id's lock, the slot's fence, the leader rows'
# lock and publication (none here), the partition's publication (fence,
# batches, marker, notice, end), the partitions' and the state's rows.
STATEMENTS_WITHOUT_MOVES = 11


def test_a_commit_with_no_move_keeps_its_statements_and_the_in_memory_plan(
        pg_server: PostgresServer) -> None:
    async def steps(c: Cluster) -> None:
        a, txn_id = c.a, c.txn_id
        pid, epoch = await c.begin()
        await a.produce(txn_id, pid, epoch, txn_batch(pid, epoch, 0))
        await a.produce(txn_id, pid, epoch, txn_batch(pid, epoch, 1))
        assert await c.pending() == [(0, 0), (1, RECORDS)]
        spy = StatementsOf(a.txns.completion.writer)
        a.txns.completion.writer = spy
        await a.txns.end_txn(txn_id, pid, epoch, commit=True, connection=1)
        statements = spy.changes[-1]
        assert len(statements) == STATEMENTS_WITHOUT_MOVES, "\n".join(
            sql for sql, _ in statements)
        # The leaders' rows only (ordinals from REMOTE_ORDINALS), then the
        # coordinator's own batches from its in-memory plan.
        remote = [args for sql, args in statements if "pending_batches r" in sql]
        assert remote and all(args[2] == REMOTE_ORDINALS for args in remote), remote
        assert any("unnest(" in sql and args[3] == [0, 1] for sql, args in statements)
        log = a.node.partition("t", 0)
        assert await c.committed(a) == expected(0, 1)
        # The offsets it reserved in memory were the commit's: no reread.
        assert not log.appends.in_doubt
        assert log.log_end_offset == await c.row_end()

    with_cluster(pg_server, steps)
