"""A group's offsets read again after a commit was refused for them.

A transaction's commit on PostgreSQL is a compare-and-set of the group's
offset rows at the versions this gateway holds in memory
(``PgConsumerOffsets.stage`` with ``refused``). When another gateway
committed some of them since (``OffsetsMoved``), nothing of the commit was
written and the transaction is aborted; but until this gateway reads the
group again, every later commit over those partitions expects the same
stale versions and is refused too: a client retrying its transaction was
refused a dozen times in five seconds by one gateway (the exactly-once
chaos check on three gateways) until the group's slot happened to move.
So a refusal schedules one reread of the group (``load_group``: rows
another gateway committed take this gateway's next versions, what it has
in flight stays), and the client's next transaction expects what the
database holds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import asyncpg

from common.logtext import client_text

from .consumer_offsets import PgConsumerOffsets

log = logging.getLogger(__name__)


class GroupRereads:
    def __init__(self, offsets: Callable[[], PgConsumerOffsets],
                 pool: Callable[[], asyncpg.Pool | None]) -> None:
        self._offsets = offsets
        self._pool = pool
        self._running: dict[str, asyncio.Task[None]] = {}  # by group: one at a time
        self.rereads = 0  # done (tests read it)

    def schedule(self, group: str) -> None:
        """Read ``group`` again soon (once, however many refusals ask meanwhile)."""
        if group in self._running or self._pool() is None:
            return
        task = asyncio.get_running_loop().create_task(self._reread(group),
                                                      name="offsets reread")
        self._running[group] = task
        task.add_done_callback(lambda _: self._running.pop(group, None))

    async def _reread(self, group: str) -> None:
        pool = self._pool()
        if pool is None:
            return
        try:
            async with pool.acquire() as conn:
                await self._offsets().load_group(conn, group)
            self.rereads += 1
        except Exception as exc:  # the next refusal asks again
            log.warning("group %s: reading its offsets again failed: %r",
                        client_text(group), exc)

    async def close(self) -> None:
        for task in list(self._running.values()):
            task.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)
