"""The transaction coordinator's side of the seam on PostgreSQL
(``seam.TransactionStorage``; the embedded engine's: ``tablets/txn_storage.py``).

    storage = PgTransactionStorage(writer, offsets, schema, partition=…,
                                   has_partition=…, txn_partition=…)
    await storage.load(conn)                 # start-up: counters, states, pending rows

A library the PostgreSQL engine plugs into: what it needs of a partition log
is only ``TxnPartition`` (below), which the engine's log implements (or
adapts to, via ``txn_partition``).

What txn/ means, in pgstore's schema (docs/cluster-design.md, "What one
PostgreSQL transaction is"):

- **Counters** (producer ids, transaction instances) are ``counters`` rows,
  set as a compare-and-set from the value this gateway last set or loaded:
  two gateways taking one block of ids from one view cannot both land.
- **The coordinator's state**: ``txn_states`` (one row per transactional id)
  and ``txn_partitions`` (one per partition of an open transaction), loaded
  at start-up and kept in memory as each change lands.
- **Pending batches**: a transactional batch's bytes are stored once, in
  ``batch_data``, named by a ``pending_batches`` row (``stage_pending``, in
  the append's change, fenced by the leader epoch and, in a cluster, the
  transactional id's coordinator slot). References are opaque
  bytes: a ``log_ref`` is the partition's ``log_id`` (8 bytes), a pending
  ``ref`` that, then the instance (8) and the ordinal (4).
- **A commit** (``stage_commit``) publishes a partition's pending batches at
  its log end: each pending row becomes a ``batches`` row naming the same
  ``batch_data`` (``shifted``: the bytes keep base offset 0, patched when
  read), never a copy of the bytes; then the COMMIT marker, a new batch; the
  partition row's log end moves in the same statement that checks its
  leader epoch (``publish_fence``), so a partition another gateway took
  since refuses the whole change and nothing of it lands; the new end is
  announced to every gateway (``log_notices``). Every partition of the
  transaction, its offsets (``stage_offsets``) and its state are in the one
  change, hence in one PostgreSQL transaction, whichever gateways lead the
  partitions.
- **An abort** (``abort_pending``) deletes the pending rows and their bytes
  (the ABORT marker is the caller's append).
- **Offsets** (``stage_offsets``): ``PgConsumerOffsets.stage`` as a
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
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from uuid import UUID

import asyncpg
from asyncpg import Record

from tablets import batch as batch_header
from tablets.errors import CounterMoved, StorageError
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
from .remote_txn import REMOTE_ORDINALS
from .schema import DEFAULT_SCHEMA
from .txn_publication import (
    LOG_REF,
    PENDING_REF,
    MissingPending,
    OffsetsMoved,
    PgTxnChange,
    PublicationFenced,
    TxnPartition,
    as_txn_change,
    log_id_of,
    log_ref_of,
    parse_pending_ref,
    pending_bytes,
    plan_publication,
)
from .txn_slots import (
    CoordinatorChange,
    SlotHolder,
    fence_coordinator,
    fence_pending,
    read_ids,
)
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
        self._channel = channel(schema)
        # In memory, as durable (the counters: as last staged, for the
        # compare-and-set of the next).
        self._counters: dict[str, int] = {}
        self._states: dict[str, bytes] = {}
        self._txn_partitions: dict[tuple[str, int], dict[tuple[UUID, int], str]] = {}
        # Pending rows found at start-up: (log id, instance) -> blobs in order.
        self._recovered: dict[tuple[int, int], list[RecoveredBlob]] = {}
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
        self._counters = {row["name"]: int(row["value"]) for row in counters}
        self._states = {}
        self._txn_partitions = {}
        self._recovered = {}
        self._take(states, partitions, pending)

    async def load_ids(self, conn: Connection, keep: Callable[[str], bool]) -> None:
        """Read again the ids ``keep`` selects, with their open transactions'
        partitions and pending rows, and the counters (this gateway gained
        their coordinator slot: another gateway may have written them since)."""
        counters, states, partitions, pending = await read_ids(conn, self._sql, keep)
        for row in counters:  # never back: a change of this gateway may be in flight
            name, value = row["name"], int(row["value"])
            self._counters[name] = max(self._counters.get(name, value), value)
        for transactional_id in [t for t in self._states if keep(t)]:
            del self._states[transactional_id]  # deleted (expired) by another gateway
        for key in [k for k in self._txn_partitions if keep(k[0])]:
            del self._txn_partitions[key]
        for row in pending:
            self._recovered.pop((int(row["log_id"]), int(row["instance"])), None)
        self._take(states, partitions, pending)

    def _take(self, states: Sequence[Record], partitions: Sequence[Record],
              pending: Sequence[Record]) -> None:
        self._states.update(
            (row["transactional_id"], bytes(row["state"])) for row in states)
        for row in partitions:
            key = (row["transactional_id"], int(row["instance"]))
            self._txn_partitions.setdefault(key, {})[(row["topic_id"], row["partition"])] = (
                row["topic"])
        for row in pending:
            log_id, instance, ordinal = int(row["log_id"]), int(row["instance"]), row["ordinal"]
            if ordinal >= REMOTE_ORDINALS:
                # Stored by another gateway, the partition's leader: the
                # commit publishes those rows itself (``stage_remote_commit``),
                # an abort deletes them by instance. Taken as the
                # coordinator's own too, a commit would publish them twice
                # and be refused (MissingPending).
                continue
            self._recovered.setdefault((log_id, instance), []).append(RecoveredBlob(
                PENDING_REF.pack(log_id, instance, ordinal), ordinal, bytes(row["header"]),
                int(row["size"])))

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

    # ------------------------------------------------ the coordinator's state
    def counter(self, name: str) -> int | None:
        return self._counters.get(name)

    def set_counter(self, change: AtomicChange, name: str, value: int) -> None:
        expected = self._counters.get(name)
        pg = as_txn_change(change)
        # The row as the database has it, read first (and locked): when another
        # gateway moved it, the compare-and-set below refuses this change, and
        # the next one starts from what was read here, so a lagging gateway
        # loses one attempt, not one per value the other took.
        seen: list[int] = []
        pg.fetch(self._sql.read_counter, name,
                 into=lambda rows: seen.extend(int(row["value"]) for row in rows))
        pg.fence(self._sql.counter, name, value, expected, refused=lambda: (
            CounterMoved(f"counter {name}: not at {expected} any more (another gateway "
                         f"set it); {value} not written")))
        self._counters[name] = value

        def failed() -> None:  # not written (in doubt: the next set is refused)
            if self._counters.get(name) == value:
                newest = max([*seen, *([] if expected is None else [expected])], default=None)
                if newest is None:
                    self._counters.pop(name, None)
                else:
                    self._counters[name] = newest

        pg.on_failure(failed)

    def txn_states(self) -> Iterator[tuple[str, bytes]]:
        yield from list(self._states.items())

    def put_txn_state(self, change: AtomicChange, transactional_id: str, value: bytes) -> None:
        pg = as_txn_change(change)
        fence_coordinator(pg, self._sql, self.slot_holder, transactional_id)
        pg.execute(self._sql.put_state, transactional_id, value)
        pg.on_durable(lambda: self._states.__setitem__(transactional_id, value))

    def delete_txn_state(self, change: AtomicChange, transactional_id: str) -> None:
        pg = as_txn_change(change)
        fence_coordinator(pg, self._sql, self.slot_holder, transactional_id)
        pg.execute(self._sql.delete_state, transactional_id)

        def durable() -> None:
            self._states.pop(transactional_id, None)

        pg.on_durable(durable)

    def txn_partitions(self, transactional_id: str,
                       instance: int) -> Iterator[tuple[TopicPartition, UUID]]:
        rows = self._txn_partitions.get((transactional_id, instance), {})
        for (topic_id, partition), topic in sorted(rows.items(), key=lambda r: (r[1], r[0][1])):
            yield (topic, partition), topic_id

    def put_txn_partition(self, change: AtomicChange, transactional_id: str, instance: int,
                          tp: TopicPartition, topic_id: UUID) -> None:
        pg = as_txn_change(change)
        fence_coordinator(pg, self._sql, self.slot_holder, transactional_id)
        pg.execute(self._sql.put_partition, transactional_id, instance, topic_id, tp[1], tp[0])

        def durable() -> None:
            self._txn_partitions.setdefault((transactional_id, instance), {})[
                (topic_id, tp[1])] = tp[0]

        pg.on_durable(durable)

    def delete_txn_partition(self, change: AtomicChange, transactional_id: str, instance: int,
                             tp: TopicPartition, topic_id: UUID) -> None:
        pg = as_txn_change(change)
        fence_coordinator(pg, self._sql, self.slot_holder, transactional_id)
        pg.execute(self._sql.delete_partition, transactional_id, instance, topic_id, tp[1])

        def durable() -> None:
            key = (transactional_id, instance)
            rows = self._txn_partitions.get(key, {})
            rows.pop((topic_id, tp[1]), None)
            if not rows:
                self._txn_partitions.pop(key, None)

        pg.on_durable(durable)

    # ------------------------------------------------------- pending data
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
        log_id, instance, ordinal = parse_pending_ref(ref)
        if log_id != log.log_id:
            raise ValueError(f"pending reference {ref.hex()} is not of log {log.log_id}")
        data = pending_bytes(batch, log.batch_epoch)
        fence_pending(change, self._sql, self.slot_holder, transactional_id, log_id,
                      log.leader_epoch)
        change.execute(self._sql.put_pending, log_id, data, instance, ordinal,
                       data[:batch_header.HEADER_SIZE], len(data))
        change.nbytes += len(data)
        return data

    def stage_commit(self, change: AtomicChange, log: PartitionLog,
                     blobs: list[PendingBlob], marker: bytes) -> Callable[[], None]:
        """Add the publication of ``blobs`` at the end of ``log``, then the
        COMMIT ``marker``, to ``change`` (see the module's docstring); the
        result tells the log once the change is durable."""
        pg = as_txn_change(change)
        part = self._txn_partition(log)
        log_id, epoch = part.log_id, part.publish_epoch
        plan = plan_publication(log_id, blobs)
        marker_view = memoryview(marker)
        marker_header = batch_header.parse_batches(marker_view)[0]
        plan_bytes = plan.nbytes + len(marker)
        max_ts = max([*plan.max_timestamps, marker_header.max_timestamp])
        # Where this gateway expects the commit, when it leads the partition:
        # its appends after it take the offsets after it. PostgreSQL has the
        # last word: the offsets are the row's, under its lock, so a commit
        # another gateway published in between moves this one, not refuses it.
        base = part.reserve(plan.count)
        pg.fence(self._sql.publish_fence, log_id, epoch, plan.count, plan_bytes,
                 refused=lambda: PublicationFenced(
                     f"log {log_id}: not at leader epoch {epoch} any more: the "
                     "transaction's commit was not written"))
        if blobs:
            pg.fence(self._sql.publish_blobs, log_id, plan.instance, plan.count,
                     plan.ordinals, plan.deltas, plan.last_deltas, plan.max_timestamps,
                     plan.running,
                     refused=lambda: MissingPending(
                         f"log {log_id}: pending batches of the commit are not stored "
                         "(aborted meanwhile?): the commit was not written"))
        expected = None if base is None else base + plan.count - 1
        stamped = batch_header.stamp(marker_view, marker_header, expected or 0,
                                     part.batch_epoch)
        pg.execute(self._sql.publish_marker, log_id, stamped, marker_header.max_timestamp,
                   len(stamped), expected)
        pg.nbytes += len(stamped)
        found: list[int] = []  # none: the log was deleted (the fences let it pass)
        pg.execute(self._sql.publish_notify, log_id, self._channel, plan.count, plan_bytes,
                   max_ts)
        pg.fetch(self._sql.log_end, log_id,
                 into=lambda rows: found.__setitem__(slice(None), [int(r[0]) for r in rows]))
        if base is not None:
            pg.on_failure(part.in_doubt)

        def publish() -> None:
            self._recovered.pop((log_id, plan.instance), None)
            if not found:
                return
            end = found[0]
            part.published(end - plan.count, end, plan_bytes, max_ts)
            if base is not None and end != base + plan.count:
                # Another gateway's commit took the offsets reserved here: the
                # leader's view of its log end is wrong, reread it.
                part.in_doubt()

        return publish

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
        pg = as_txn_change(change)
        log_id = log_id_of(log_ref)
        pg.execute(self._sql.abort, log_id, instance)

        def durable() -> None:
            self._recovered.pop((log_id, instance), None)

        pg.on_durable(durable)

    def forget_recovered(self, log_id: int, instance: int) -> None:
        """The pending rows of ``instance`` on ``log_id`` this storage
        recovered were published by another statement of a commit
        (``PgRemoteTxns.stage_remote_commit``)."""
        self._recovered.pop((log_id, instance), None)

    def recover_pending(self, log_ref: bytes, instance: int) -> list[RecoveredBlob]:
        return list(self._recovered.get((log_id_of(log_ref), instance), ()))

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
