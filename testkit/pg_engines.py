"""Helpers of the tests that run several PostgreSQL engines (gateways) in one
process on a throwaway PostgreSQL: waiting for what a leadership pass does,
handing a coordinator slot or a partition over as a pass would, and holding
a partition's writes in flight (``HeldWrites``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import asyncpg

from pgstore.migrate import quoted
from pgstore.writer import PgChange, PgWriter
from testkit.postgres import PostgresServer


async def until(check: Callable[[], bool], what: str, within: float) -> float:
    """Seconds until ``check()`` holds; fails naming ``what`` after ``within``."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > within:
            raise AssertionError(f"not {what} within {within} s")
        await asyncio.sleep(0.05)
    return time.monotonic() - start


async def move_slot(pg: PostgresServer, schema: str, slot: int, to_node: int) -> int:
    """Hand a slot over as a leadership pass would (leader and epoch moved);
    returns the new epoch."""
    return await _hand_over(pg, schema, "coordinator_slots", "slot", slot, to_node)


async def _hand_over(pg: PostgresServer, schema: str, table: str, key: str, value: int,
                     to_node: int) -> int:
    """The row of ``table`` whose ``key`` is ``value`` led by ``to_node`` at
    the next epoch, which is returned."""
    conn = await asyncpg.connect(pg.dsn)
    try:
        return int(await conn.fetchval(
            f"UPDATE {quoted(schema)}.{table} SET leader_node = $2, "
            f"leader_epoch = leader_epoch + 1 WHERE {key} = $1 RETURNING leader_epoch",
            value, to_node))
    finally:
        await conn.close()


class HeldWrites:
    """Stands for a partition log's writer (``log.writer = HeldWrites(log.writer)``):
    the changes its appends queue wait here, in flight, until ``release``
    hands them to the real writer; each one's future then takes its outcome."""

    def __init__(self, writer: PgWriter) -> None:
        self.writer = writer
        self.held: list[tuple[PgChange, asyncio.Future[None]]] = []

    def begin(self) -> PgChange:
        return self.writer.begin()

    def commit(self, change: PgChange) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.held.append((change, future))
        return future

    def release(self) -> int:
        """Queue every held change on the real writer, in order; returns how many."""
        held, self.held = self.held, []
        for change, future in held:
            def settle(done: asyncio.Future[None], future: asyncio.Future[None] = future,
                       ) -> None:
                if future.done():
                    return
                if done.cancelled():
                    future.cancel()
                elif (error := done.exception()) is not None:
                    future.set_exception(error)
                else:
                    future.set_result(None)

            self.writer.commit(change).add_done_callback(settle)
        return len(held)


async def move_partition(pg: PostgresServer, schema: str, log_id: int, to_node: int) -> int:
    """Hand a partition's leadership over as a leadership pass would (leader
    and epoch moved); returns the new epoch."""
    return await _hand_over(pg, schema, "partitions", "log_id", log_id, to_node)
