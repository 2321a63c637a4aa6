"""A transaction's pending batches on PostgreSQL, from stored to published or
deleted: what ``pgstore.txn_storage`` answers the seam's ``stage_pending``,
``stage_commit``, ``abort_pending`` and ``recover_pending`` with, and the
pending rows found at start-up (or when a coordinator slot is gained).

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
  announced to every gateway (``log_notices``).
- **Moves** (``unmoved``): the tenure (the partition's leader epoch, the
  id's slot epoch) in which this process stored each transaction's own
  batches on a log is noted; a commit publishes them from memory only when
  that is the tenure now and none was recovered, else in SQL with the
  leaders' in the producer's order (``PgRemoteTxns.stage_remote_commit``).
- **An abort** (``abort`` here) deletes the pending rows and their bytes
  (the ABORT marker is the caller's append).

What it needs of a partition log is ``TxnPartition``
(``pgstore.txn_publication``); of the storage, the coordinator slots' holder
(``SlotHolding``, read at each write).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from asyncpg import Record

from tablets import batch as batch_header
from tablets.seam import AtomicChange, PartitionLog, PendingBlob, RecoveredBlob

from .remote_txn import REMOTE_ORDINALS
from .txn_publication import (
    PENDING_REF,
    MissingPending,
    PublicationFenced,
    TxnPartition,
    as_txn_change,
    log_id_of,
    parse_pending_ref,
    pending_bytes,
    plan_publication,
)
from .txn_slots import SlotHolding, fence_pending
from .txn_statements import TxnStatements
from .writer import PgChange


class PendingBatches:
    """Pending batches written through the caller's change, and those recovered."""

    def __init__(self, sql: TxnStatements, channel: str, slots: SlotHolding,
                 txn_partition: Callable[[PartitionLog], TxnPartition]) -> None:
        self._sql = sql
        self._channel = channel  # where a commit announces a log's new end
        self._slots = slots
        self._txn_partition = txn_partition
        # Pending rows found at start-up: (log id, instance) -> blobs in order.
        self._recovered: dict[tuple[int, int], list[RecoveredBlob]] = {}
        # The tenure in which this process stored a transaction's own
        # batches on a log: (log id, instance) -> (the partition's leader
        # epoch, the id's coordinator slot epoch, None without a cluster);
        # None once they span more than one (``unmoved``). Dropped when the
        # transaction's commit or abort here is durable; one whose slot moved
        # away while open is ended by another gateway, so its entries (a
        # tuple per partition) stay until this process restarts.
        self._tenures: dict[tuple[int, int], tuple[int, int | None] | None] = {}

    # ------------------------------------------------------------ loading
    def loaded(self, pending: Sequence[Record]) -> None:
        """Take the pending rows ``load`` read (start-up): they replace all."""
        self._recovered = {}
        self._tenures = {}
        self._take(pending)

    def reloaded(self, pending: Sequence[Record]) -> None:
        """Take the pending rows ``load_ids`` read: they replace their
        transactions' rows in memory."""
        for row in pending:
            self._recovered.pop((int(row["log_id"]), int(row["instance"])), None)
        self._take(pending)

    def _take(self, pending: Sequence[Record]) -> None:
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

    # ------------------------------------------------------------ writing
    def stage_pending(self, change: PgChange, log: TxnPartition, ref: bytes,
                      batch: bytes | memoryview, transactional_id: str | None = None) -> bytes:
        """As ``PgTransactionStorage.stage_pending``."""
        log_id, instance, ordinal = parse_pending_ref(ref)
        if log_id != log.log_id:
            raise ValueError(f"pending reference {ref.hex()} is not of log {log.log_id}")
        data = pending_bytes(batch, log.batch_epoch)
        fence_pending(change, self._sql, self._slots.slot_holder, transactional_id, log_id,
                      log.leader_epoch)
        # Noted even if the change then fails: a tenure too many only sends
        # the commit down the path that is always right (``unmoved``).
        tenure = (log.leader_epoch, self._slot_epoch(transactional_id))
        if self._tenures.setdefault((log_id, instance), tenure) != tenure:
            self._tenures[(log_id, instance)] = None
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
            self._tenures.pop((log_id, plan.instance), None)
            if not found:
                return
            end = found[0]
            part.published(end - plan.count, end, plan_bytes, max_ts)
            if base is not None and end != base + plan.count:
                # Another gateway's commit took the offsets reserved here: the
                # leader's view of its log end is wrong, reread it.
                part.in_doubt()

        return publish

    def abort(self, change: AtomicChange, log_ref: bytes, instance: int) -> None:
        """Add the deletion of ``instance``'s pending rows on the log and their
        bytes to ``change``."""
        pg = as_txn_change(change)
        log_id = log_id_of(log_ref)
        pg.execute(self._sql.abort, log_id, instance)

        def durable() -> None:
            self._recovered.pop((log_id, instance), None)
            self._tenures.pop((log_id, instance), None)

        pg.on_durable(durable)

    # ------------------------------------------------------------ moves
    def _slot_epoch(self, transactional_id: str | None) -> int | None:
        holder = self._slots.slot_holder
        held = None if holder is None or transactional_id is None else holder(transactional_id)
        return None if held is None else held[2]

    def unmoved(self, log_id: int, instance: int, leader_epoch: int,
                transactional_id: str) -> bool:
        """Whether every own batch of ``instance`` on ``log_id`` was stored by
        this process while it led the partition at ``leader_epoch`` (its
        epoch now) and held ``transactional_id``'s coordinator slot at the
        epoch it holds now: then no batch another gateway stored there for
        the transaction can come after any of them (docs/cluster-design.md,
        "A partition or a slot that moved during the transaction"). Not when
        one of them was recovered from the store (start-up, a slot gained)."""
        key = (log_id, instance)
        if key in self._recovered:
            return False
        return self._tenures.get(key) == (leader_epoch, self._slot_epoch(transactional_id))

    # ------------------------------------------------------------ recovered
    def forget_recovered(self, log_id: int, instance: int) -> None:
        self._recovered.pop((log_id, instance), None)
        self._tenures.pop((log_id, instance), None)

    def recover(self, log_ref: bytes, instance: int) -> list[RecoveredBlob]:
        return list(self._recovered.get((log_id_of(log_ref), instance), ()))
