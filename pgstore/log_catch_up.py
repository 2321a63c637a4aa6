"""A gateway's leaders learn of commits other gateways published into their
partitions (docs/cluster.md, "Commits that cross gateways"), held by
``PgCluster``:

    catch_up = LogCatchUp(dsn, schema, node_id, catalog, pool=lambda: pool)
    await catch_up.start()      # one listening connection, resynced
    ...
    await catch_up.close()

Each notice (``pgstore.log_notices.LogEnd``) goes to the partition's log
(``PgPartitionLog.noticed``: the leader moves its log end and high watermark
and wakes its long-polls; a gateway that does not lead it only notes it).
After every (re)connection of the listener, the log ends of the partitions
this gateway leads are read again (``resync``): notices sent while it was
down are lost. The listening connection is named
``kafka-gateway-log-notices-<node.id>`` (``application_name``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from .connect import connect as connect_any
from .log_notices import LogEnd, LogNotices
from .migrate import quoted

if TYPE_CHECKING:
    import asyncpg

    from .partition_log import PgPartitionLog
    from .topics import PgTopicCatalog

APPLICATION = "kafka-gateway-log-notices"  # then -<node.id>


class LogCatchUp:
    def __init__(self, dsn: str, schema: str, node_id: int, catalog: PgTopicCatalog,
                 pool: Callable[[], asyncpg.Pool | None]) -> None:
        self.schema = schema
        self.catalog = catalog
        self._pool = pool  # the cluster's (reads)
        self._logs: dict[int, PgPartitionLog] = {}  # by log id, rebuilt on a miss
        self.resyncs = 0
        named = functools.partial(connect_any, server_settings={
            "application_name": f"{APPLICATION}-{node_id}"})
        self.notices = LogNotices(dsn, schema, self.noticed, self.resync, connect=named)

    async def start(self) -> None:
        await self.notices.start()

    async def close(self) -> None:
        await self.notices.close()

    def noticed(self, notice: LogEnd) -> None:
        """A commit (of any gateway) added to a log: its leader, if this
        gateway, moves its end and wakes its long-polls."""
        found = self._logs.get(notice.log_id)
        if found is None or found.deleted:
            self._logs = {p.log_id: p for p in self.catalog.logs()}
            found = self._logs.get(notice.log_id)
        if found is not None:
            found.noticed(notice)

    async def resync(self) -> None:
        """The listener (re)connected: the ends of the partitions led here
        are read again (``PgPartitionLog.resynced``)."""
        led = [p for p in self.catalog.logs() if not p.fenced and not p.deleted]
        pool = self._pool()
        if pool is None or not led:
            return
        async with pool.acquire() as conn:
            rows = await conn.fetch(
                f"SELECT log_id, log_end_offset FROM {quoted(self.schema)}.partitions "
                "WHERE log_id = ANY($1::bigint[])", [p.log_id for p in led])
        ends = {int(row["log_id"]): int(row["log_end_offset"]) for row in rows}
        for partition in led:
            if partition.log_id in ends:
                partition.resynced(ends[partition.log_id])
        self.resyncs += 1
