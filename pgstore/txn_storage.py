"""The transaction coordinator's side of the seam on PostgreSQL
(``seam.TransactionStorage``; the embedded engine's: ``tablets/txn_storage.py``).

    storage = PgTransactionStorage(writer, offsets, schema, partition=…,
                                   has_partition=…, txn_partition=…)
    await storage.load(conn)                 # start-up: counters, states, pending rows

A library the PostgreSQL engine plugs into: what it needs of a partition log
is only ``TxnPartition`` (``pgstore.txn_publication``), which the engine's log implements (or
adapts to, via ``txn_partition``).

What txn/ means, in pgstore's schema (docs/cluster-design.md, "What one
PostgreSQL transaction is"), and which module owns each part:

- **Counters, ``txn_states``, ``txn_partitions``**: the coordinator's own
  state, in memory as durable (``pgstore.txn_coordinator_state``).
- **Pending batches, a commit's publication, an abort**: stored once,
  published at the partition's log end under its leader-epoch fence, deleted
  (``pgstore.txn_pending``; its plan, references and errors:
  ``pgstore.txn_publication``; the SQL: ``pgstore.txn_statements``). Every
  partition of the transaction, its offsets (``stage_offsets``) and its
  state are in the one change, hence in one PostgreSQL transaction,
  whichever gateways lead the partitions.
- **Offsets** (``stage_offsets``, here): ``PgConsumerOffsets.stage`` as a
  compare-and-set: they land only if each row is, under its row lock, at
  the version this gateway's memory holds, so the conflict check txn/ ran
  on that memory holds inside the transaction.
- **Offsets staged by another gateway** (the group's coordinator, when it
  is not the transactional id's): ``stage_elsewhere`` there, then
  ``take_staged_offsets`` in the commit, ``discard_staged_offsets`` in an
  abort, ``settle_staged`` before the group's coordinator answers an
  OffsetFetch (``pgstore.txn_staged_offsets``).

In a cluster, every change of the coordinator's state is fenced by the
transactional id's coordinator slot, and a slot gained has its ids read
again (``load_ids``): ``pgstore.txn_slots``.

A change that fails (refused, the connection lost, the outcome unknown)
runs the failure hooks its parts registered: the offsets staged are
forgotten, each publishing partition is told its log end is in doubt
(``TxnPartition.in_doubt``). Those hooks run only for changes made by this
storage's ``begin`` and written by its ``commit``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Iterator, Mapping
from uuid import UUID

import asyncpg

from tablets.errors import StorageError
from tablets.seam import (
    AtomicChange,
    CommittedOffset,
    OffsetCommit,
    PartitionLog,
    PendingBlob,
    RecoveredBlob,
    TopicPartition,
)

from .consumer_offsets import PgConsumerOffsets
from .group_rereads import GroupRereads
from .log_notices import channel
from .migrate import Connection, quoted
from .schema import DEFAULT_SCHEMA
from .txn_coordinator_state import CoordinatorState
from .txn_pending import PendingBatches
from .txn_publication import (
    LOG_REF,
    PENDING_REF,
    OffsetsMoved,
    PgTxnChange,
    TxnPartition,
    as_txn_change,
    log_id_of,
    log_ref_of,
)
from .txn_slots import CoordinatorChange, SlotHolder, read_ids
from .txn_staged_offsets import StagedHook, StagedOffsets
from .txn_statements import TxnStatements
from .writer import PgChange, PgWriter


class PgTransactionStorage:
    """The engine's writer and tables, as the transaction coordinator sees them."""

    def __init__(self, writer: PgWriter, offsets: PgConsumerOffsets | None,
                 schema: str = DEFAULT_SCHEMA, *,
                 partition: Callable[[str, int], PartitionLog],
                 has_partition: Callable[[str, int], bool],
                 txn_partition: Callable[[PartitionLog], TxnPartition]) -> None:
        self.writer = writer
        self.schema = schema
        self._offsets = offsets
        self._partition = partition
        self._has_partition = has_partition
        self._txn_partition = txn_partition
        self._sql = TxnStatements(quoted(schema))
        self._state = CoordinatorState(self._sql, self)
        self._pending = PendingBatches(self._sql, channel(schema), self, txn_partition)
        self._pool: asyncpg.Pool | None = None  # reads of settle_staged
        self.group_rereads = GroupRereads(lambda: self.consumer_offsets, lambda: self._pool)
        self._staged: StagedOffsets | None = None
        self.slot_holder: SlotHolder | None = None  # in a cluster (pgstore.cluster)

    async def load(self, conn: Connection) -> None:
        """Read the counters, the coordinator's state and the pending rows (start-up)."""
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            counters = await conn.fetch(self._sql.load_counters)
            states = await conn.fetch(self._sql.load_states)
            partitions = await conn.fetch(self._sql.load_partitions)
            pending = await conn.fetch(self._sql.load_pending)
        self._state.loaded(counters, states, partitions)
        self._pending.loaded(pending)

    async def load_ids(self, conn: Connection, keep: Callable[[str], bool]) -> None:
        """Read again the ids ``keep`` selects, with their open transactions'
        partitions and pending rows, and the counters (this gateway gained
        their coordinator slot: another gateway may have written them since)."""
        counters, states, partitions, pending = await read_ids(conn, self._sql, keep)
        self._state.reloaded(keep, counters, states, partitions)
        self._pending.reloaded(pending)

    def connect_offsets(self, offsets: PgConsumerOffsets) -> None:
        """The consumer offsets, when made after this storage (the engine's
        start), before they are loaded: their loads read the staged offsets too."""
        self._offsets = offsets
        self._staged = None
        offsets.loaded_hook = self._staged_offsets().read_staged

    def connect_pool(self, pool: asyncpg.Pool) -> None:
        """The engine's pool of read connections (``settle_staged``)."""
        self._pool = pool

    def _staged_offsets(self) -> StagedOffsets:
        if self._staged is None:
            self._staged = StagedOffsets(self.writer, self.consumer_offsets, self.schema)
        return self._staged

    @property
    def consumer_offsets(self) -> PgConsumerOffsets:
        if self._offsets is None:
            raise StorageError("consumer offsets are not connected to this PostgreSQL store")
        return self._offsets

    def partition(self, name: str, index: int) -> PartitionLog:
        return self._partition(name, index)

    def has_partition(self, name: str, index: int) -> bool:
        return self._has_partition(name, index)

    # ---------------------------------------------------- atomic changes
    def begin(self) -> PgTxnChange:
        return CoordinatorChange()

    def commit(self, change: AtomicChange) -> asyncio.Future[None]:
        """Write ``change`` (one PostgreSQL transaction, grouped with others);
        when it fails, its failure hooks run before the future resolves."""
        txn_change = as_txn_change(change)
        future = self.writer.commit(txn_change)
        hooks = txn_change._failed
        if hooks:
            def settle(done: asyncio.Future[None]) -> None:
                if done.cancelled() or done.exception() is not None:
                    for hook in hooks:
                        hook()

            future.add_done_callback(settle)
        return future

    # ------------------------------ the coordinator's state (txn_coordinator_state)
    def counter(self, name: str) -> int | None:
        return self._state.counter(name)

    def set_counter(self, change: AtomicChange, name: str, value: int) -> None:
        self._state.set_counter(change, name, value)

    def txn_states(self) -> Iterator[tuple[str, bytes]]:
        return self._state.txn_states()

    def put_txn_state(self, change: AtomicChange, transactional_id: str, value: bytes) -> None:
        self._state.put_txn_state(change, transactional_id, value)

    def delete_txn_state(self, change: AtomicChange, transactional_id: str) -> None:
        self._state.delete_txn_state(change, transactional_id)

    def txn_partitions(self, transactional_id: str,
                       instance: int) -> Iterator[tuple[TopicPartition, UUID]]:
        return self._state.txn_partitions(transactional_id, instance)

    def put_txn_partition(self, change: AtomicChange, transactional_id: str, instance: int,
                          tp: TopicPartition, topic_id: UUID) -> None:
        self._state.put_txn_partition(change, transactional_id, instance, tp, topic_id)

    def delete_txn_partition(self, change: AtomicChange, transactional_id: str, instance: int,
                             tp: TopicPartition, topic_id: UUID) -> None:
        self._state.delete_txn_partition(change, transactional_id, instance, tp, topic_id)

    # ------------------------------------------------ pending data (txn_pending)
    def log_ref(self, log: PartitionLog) -> bytes:
        return log_ref_of(self._txn_partition(log).log_id)

    def pending_ref(self, log_ref: bytes, instance: int, ordinal: int) -> bytes:
        return PENDING_REF.pack(log_id_of(log_ref), instance, ordinal)

    def pending_log_ref(self, ref: bytes) -> bytes:
        return ref[:LOG_REF.size]

    def stage_pending(self, change: PgChange, log: TxnPartition, ref: bytes,
                      batch: bytes | memoryview, transactional_id: str | None = None) -> bytes:
        """Add a transactional batch to ``change`` (the engine's append): its
        bytes once, stamped with base offset 0 and the log's batch epoch, and
        its pending row, only while the partition is at that epoch and, in a
        cluster, ``transactional_id``'s coordinator slot is still this
        gateway's (``txn_slots.fence_pending``; else the change is refused:
        ``PublicationFenced``, ``PendingSlotMoved``). Returns the bytes stored."""
        return self._pending.stage_pending(change, log, ref, batch, transactional_id)

    def stage_commit(self, change: AtomicChange, log: PartitionLog,
                     blobs: list[PendingBlob], marker: bytes) -> Callable[[], None]:
        """Add the publication of ``blobs`` at the end of ``log``, then the
        COMMIT ``marker``, to ``change`` (``pgstore.txn_pending``); the result
        tells the log once the change is durable."""
        return self._pending.stage_commit(change, log, blobs, marker)

    def stage_offsets(self, change: AtomicChange, group: str,
                      commits: Mapping[TopicPartition, OffsetCommit], now_ms: int,
                      committer: str, members: Mapping[TopicPartition, str] | None,
                      ) -> dict[TopicPartition, CommittedOffset]:
        pg = as_txn_change(change)
        offsets = self.consumer_offsets
        def refused() -> OffsetsMoved:
            self.group_rereads.schedule(group)  # else every retry is refused the same way
            return OffsetsMoved(
                f"group {group}: offsets committed by another gateway since this one read "
                f"them; the transaction of {committer} was not committed")

        staged = offsets.stage(group, commits, now_ms, pg, committer, members,
                               refused=refused)
        pg.on_failure(lambda: offsets.forget(group, staged))
        return staged

    def abort_pending(self, change: AtomicChange, log_ref: bytes, instance: int) -> None:
        self._pending.abort(change, log_ref, instance)

    def forget_recovered(self, log_id: int, instance: int) -> None:
        """The pending rows of ``instance`` on ``log_id`` this storage
        recovered were published by another statement of a commit
        (``PgRemoteTxns.stage_remote_commit``)."""
        self._pending.forget_recovered(log_id, instance)

    def own_unmoved(self, log_id: int, instance: int, leader_epoch: int,
                    transactional_id: str) -> bool:
        """Whether this coordinator stored all its pending rows of ``instance``
        on ``log_id`` itself, at ``leader_epoch`` and its slot's epoch now
        (``PgRemoteTxns.stage_remote_commit`` decides by it where its own
        batches are published)."""
        return self._pending.unmoved(log_id, instance, leader_epoch, transactional_id)

    def recover_pending(self, log_ref: bytes, instance: int) -> list[RecoveredBlob]:
        return self._pending.recover(log_ref, instance)

    # ------------------------- offsets staged by another gateway (txn_staged_offsets)
    async def stage_elsewhere(self, transactional_id: str, producer_id: int, epoch: int,
                              group: str, commits: Mapping[TopicPartition, OffsetCommit],
                              members: Mapping[TopicPartition, str] | None = None,
                              exempt: Collection[TopicPartition] = ()) -> None:
        """Stage a transaction's offsets here, the group's coordinator, for
        the transactional id's coordinator, another gateway, to commit."""
        await self._staged_offsets().stage(transactional_id, producer_id, epoch, group, commits,
                                           members, exempt)

    def take_staged_offsets(self, change: AtomicChange, transactional_id: str,
                            producer_id: int, epoch: int, now_ms: int) -> None:
        """Add the commit of the offsets other gateways staged for the
        transaction to its commit ``change`` (a compare-and-set)."""
        self._staged_offsets().take(as_txn_change(change), transactional_id, producer_id,
                                    epoch, now_ms)

    def discard_staged_offsets(self, change: AtomicChange, transactional_id: str) -> None:
        """Add the deletion of the offsets other gateways staged for the
        transaction to its abort ``change``."""
        self._staged_offsets().discard(as_txn_change(change), transactional_id)

    def watch_staged(self, hook: StagedHook) -> dict[str, dict[str, list[TopicPartition]]]:
        """What was staged when the offsets were loaded (group -> transactional
        id -> partitions); ``hook`` hears the same of a group read again."""
        staged = self._staged_offsets()
        staged.hook = hook
        return staged.at_load

    async def settle_staged(self, group: str, transactional_ids: Collection[str]) -> set[str]:
        """Of the transactions that staged offsets of ``group`` here, those
        that ended since (the group read again when any did)."""
        if self._pool is None:
            raise StorageError("the PostgreSQL store is not started")
        async with self._pool.acquire() as conn:
            return await self._staged_offsets().settle(conn, group, transactional_ids)
