"""What a gateway of a cluster does with the partitions and coordinator slots
it gains, and with the partitions it loses (``pgstore.cluster`` calls it on
every ``LeadershipChange``; the routing answers are ``pgstore.cluster_view``'s):

- **A partition gained** at an epoch is *opened* (``Opening.partitions``):
  its row and producers are read again (another gateway may have written
  since), the log takes that epoch and is unfenced. A partition *lost* is
  closed at once (``close``): its tail is dropped, its long-polls woken,
  its appends fenced (and in PostgreSQL the epoch already moved, so nothing
  of a write in flight lands).
- **A coordinator slot gained** (``Opening.slots``) has the committed
  offsets and generations of its groups read again (``load_group``) before
  ``coordinates`` says yes for its keys. The offsets' writes are fenced by
  the slot's epoch (``PgConsumerOffsets.slot_holder``). The transactional
  ids of a slot gained are read again too (``PgTransactionStorage.load_ids``)
  and handed to the watchers' ``gained`` (the transaction coordinator)
  before ``coordinates`` says yes; the coordinator's writes are fenced by
  the slot's epoch (``pgstore.txn_slots``).

What it needs of the cluster is ``OpeningHost``, read anew at every step
(the leadership is a new one after each rejoin).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import asyncpg

from tablets.in_memory_batches import InMemoryBatches

from .log_sql import load_row
from .migrate import quoted
from .placement import coordinator_slot
from .producer_rows import PgProducerRows

if TYPE_CHECKING:
    from .leadership import Leadership
    from .partition_log import PgPartitionLog
    from .topics import PgTopicCatalog
    from .txn_storage import PgTransactionStorage

log = logging.getLogger(__name__)


class OpeningHost(Protocol):
    """The state of the cluster (``PgCluster``) that opening reads and sets."""

    node_id: int
    catalog: PgTopicCatalog
    leadership: Leadership | None
    open_slots: set[int]  # gained and loaded: ``coordinates`` says yes for their keys
    gained_watchers: list[Callable[[Callable[[str], bool]], None]]

    def current(self) -> bool:
        """This process is the node's live incarnation, as last read."""
        ...

    async def refresh_topics(self) -> None: ...


def logs_by_id(catalog: PgTopicCatalog) -> dict[int, PgPartitionLog]:
    return {p.log_id: p for p in catalog.logs()}


class Opening:
    """Opens the partitions and slots this gateway gained (see the module's
    docstring); ``pool`` gives the cluster's pool for it (None before it
    joined)."""

    def __init__(self, host: OpeningHost, pool: Callable[[], asyncpg.Pool | None],
                 schema: str, offsets: object | None,
                 txns: PgTransactionStorage | None) -> None:
        self.host = host
        self._pool = pool
        self.schema = schema
        self._offsets = offsets  # PgConsumerOffsets (load_group), or None
        self._txns = txns  # the transaction coordinator's storage (load_ids), or None
        self.opened = 0  # partitions opened so far (statistics, tests)

    async def partitions(self, gained: dict[int, int]) -> None:
        """Open the partitions gained (log id -> epoch) that are still led
        here at that epoch once their row and producers are read."""
        pool, host = self._pool(), self.host
        assert pool is not None
        if not host.current():
            return
        by_id = logs_by_id(host.catalog)
        if any(log_id not in by_id for log_id in gained):
            await host.refresh_topics()  # a topic another gateway made
            by_id = logs_by_id(host.catalog)
        sql = host.catalog.context.sql
        async with pool.acquire() as conn:
            for log_id, epoch in sorted(gained.items()):
                partition = by_id.get(log_id)
                if partition is None or partition.deleted:
                    continue
                row = await load_row(conn, sql, log_id, partition.mean_batch_bytes)
                producers = await PgProducerRows.fetch(conn, sql, log_id)
                if (row is None or row.leader_epoch != epoch or not host.current()
                        or host.leadership is None
                        or host.leadership.partition_epoch(log_id) != epoch):
                    continue  # moved again meanwhile: the next change says so
                partition.leader_epoch = epoch
                partition.reset_from(row)
                partition.producer_rows.loaded = producers.loaded
                partition.producer_states.load()
                partition.fenced = False
                partition.catch_up()  # a commit noticed after the row was read
                self.opened += 1
        log.info("node %d opened %d partitions", host.node_id, len(gained))

    async def slots(self, slots: set[int]) -> None:
        """Reread the committed offsets of the slots' groups and the slots'
        transactional ids (another coordinator may have written them), then
        coordinate them."""
        pool, host = self._pool(), self.host
        assert pool is not None
        load_group = getattr(self._offsets, "load_group", None)
        in_slots: Callable[[str], bool] = lambda key: coordinator_slot(key) in slots  # noqa: E731
        if self._txns is not None:
            async with pool.acquire() as conn:
                await self._txns.load_ids(conn, in_slots)
        if load_group is not None:
            async with pool.acquire() as conn:
                s = quoted(self.schema)
                groups = await conn.fetch(
                    f"SELECT group_id FROM {s}.consumer_offsets UNION "
                    f"SELECT group_id FROM {s}.group_generations")
                for row in groups:
                    if coordinator_slot(row["group_id"]) in slots:
                        await load_group(conn, row["group_id"])
        lead = host.leadership
        if lead is not None and host.current():
            opened = {s for s in slots if lead.slot_epoch(s) is not None}
            for gained in host.gained_watchers:  # in the same step as the slots open
                gained(lambda key: coordinator_slot(key) in opened)
            host.open_slots |= opened


def close(partition: PgPartitionLog) -> None:
    """This gateway no longer leads the partition: refuse its writes, drop its
    tail, wake its long-polls (their next read is refused)."""
    partition.fenced = True
    partition.tail = InMemoryBatches()
    partition.wake_waiters()
