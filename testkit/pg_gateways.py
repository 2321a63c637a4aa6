"""Two gateways' engines in one process on a throwaway PostgreSQL, each with
its ``TransactionCoordinator`` as the server wires it (the tests of offsets
staged across gateways and of a transaction's begin point use them).

    schema, a, b = await two_gateways(pg)       # 25 coordinator slots each
    txn_id, group = key_of(a.cluster, "txn"), key_of(b.cluster, "group")
    pid, epoch = await opened(a, txn_id, group)  # InitProducerId, AddOffsetsToTxn
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg

from pgstore.cluster import ClusterSettings, PgCluster
from pgstore.consumer_offsets import PgConsumerOffsets
from pgstore.leadership import coordinator_slot
from pgstore.membership import Listener
from pgstore.migrate import quoted
from pgstore.node import PgNodeSettings, PgNodeStorage
from tablets.errors import CounterMoved
from tablets.seam import OffsetCommit
from testkit.pg_engines import until
from testkit.postgres import PostgresServer
from txn import TransactionCoordinator
from txn.errors import ConcurrentTransactions

TIMEOUT = 90
LEASE = 1.5
T = TypeVar("T")
TOPIC = "in"


@dataclasses.dataclass
class Gateway:
    node: PgNodeStorage
    cluster: PgCluster
    offsets: PgConsumerOffsets
    txns: TransactionCoordinator


async def started_node(pg: PostgresServer, schema: str, node_id: int,
                       ) -> tuple[PgNodeStorage, PgCluster, PgConsumerOffsets]:
    """A cluster engine on ``schema``, started, not yet joined (``join``):
    what a test wires on it comes first, as kafka_gateway/server.py does."""
    node = PgNodeStorage(pg.dsn, PgNodeSettings(
        schema=schema, cluster=ClusterSettings(node_id=node_id, lease_seconds=LEASE)),
        offsets=PgConsumerOffsets)
    await node.start()
    cluster = node.cluster()
    assert cluster is not None
    offsets = node.consumer_offsets
    assert isinstance(offsets, PgConsumerOffsets)
    return node, cluster, offsets


async def join(node: PgNodeStorage, node_id: int) -> None:
    await node.join_cluster([Listener("PLAINTEXT", f"gw{node_id}", 9000 + node_id)])


async def gateway(pg: PostgresServer, schema: str, node_id: int) -> Gateway:
    node, cluster, offsets = await started_node(pg, schema, node_id)
    txns = TransactionCoordinator(node)
    txns.load()
    await join(node, node_id)
    return Gateway(node, cluster, offsets, txns)


def key_of(cluster: PgCluster, prefix: str, skip: int = 0) -> str:
    """A key (group or transactional id) coordinated by ``cluster`` in the
    lowest slot it leads (a rebalancing pass hands over the highest ones)."""
    assert cluster.leadership is not None
    slot = min(cluster.leadership.led_slots)
    keys = (f"{prefix}-{i}" for i in range(100_000) if coordinator_slot(f"{prefix}-{i}") == slot)
    for _ in range(skip):
        next(keys)
    return next(keys)


async def two_gateways(pg: PostgresServer) -> tuple[str, Gateway, Gateway]:
    schema = f"staged_{uuid.uuid4().hex[:10]}"
    a = await gateway(pg, schema, 1)
    b = await gateway(pg, schema, 2)
    await until(lambda: a.cluster.leadership is not None
                and len(a.cluster.leadership.led_slots) == 25
                and b.cluster.leadership is not None
                and len(b.cluster.leadership.led_slots) == 25, "slots balanced", 6 * LEASE)
    await a.node.create_topic(TOPIC, 2, {})
    return schema, a, b


async def close(*gateways: Gateway) -> None:
    for each in gateways:
        await each.node.close()


def run(body: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(body(), TIMEOUT)

    asyncio.run(bounded())


def run_two(pg: PostgresServer, body: Callable[[str, Gateway, Gateway], Awaitable[None]],
            ) -> None:
    """``body(schema, a, b)`` on two gateways over a new schema (``two_gateways``),
    both closed after it, within ``TIMEOUT``."""
    async def both() -> None:
        schema, a, b = await two_gateways(pg)
        try:
            await body(schema, a, b)
        finally:
            await close(a, b)

    run(both)


async def rows(pg: PostgresServer, schema: str, table: str, group: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(pg.dsn)
    try:
        return list(await conn.fetch(
            f"SELECT * FROM {quoted(schema)}.{table} WHERE group_id = $1 "
            "ORDER BY topic, partition", group))
    finally:
        await conn.close()


async def retried(call: Callable[[], Awaitable[T]]) -> T:
    """A request a client retries: a gateway whose transaction-instance
    counter another gateway moved refuses a begin (AddPartitionsToTxn,
    AddOffsetsToTxn) once with CONCURRENT_TRANSACTIONS (docs/cluster.md,
    "producer ids across gateways")."""
    for _ in range(3):
        try:
            return await call()
        except (CounterMoved, ConcurrentTransactions):
            pass
    return await call()


async def opened(gw: Gateway, transactional_id: str, group: str) -> tuple[int, int]:
    """InitProducerId and AddOffsetsToTxn on the id's coordinator."""
    pid, epoch = await gw.txns.init_producer_id(transactional_id, 60_000)
    await retried(lambda: gw.txns.add_offsets(transactional_id, pid, epoch, group))
    return pid, epoch


def at(offset: int, partition: int = 0) -> dict[tuple[str, int], OffsetCommit]:
    return {(TOPIC, partition): OffsetCommit(offset, -1, "m")}
