"""Helpers of the tests that run several PostgreSQL engines (gateways) in one
process on a throwaway PostgreSQL: waiting for what a leadership pass does,
and handing a coordinator slot over as a pass would."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import asyncpg

from pgstore.migrate import quoted
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
    conn = await asyncpg.connect(pg.dsn)
    try:
        return int(await conn.fetchval(
            f"UPDATE {quoted(schema)}.coordinator_slots SET leader_node = $2, "
            "leader_epoch = leader_epoch + 1 WHERE slot = $1 RETURNING leader_epoch",
            slot, to_node))
    finally:
        await conn.close()
