"""The data of an open transaction: blobs written at Produce time, per partition.

A transactional batch is stored once, as a blob outside the log (named by
the engine, ``TransactionStorage.pending_ref``: the partition, the
transaction's node-wide instance, the arrival order). The coordinator keeps
the list of each open transaction's blobs, so EndTxn(commit) can write one
small log entry per blob without reading any of them; after a restart the
list is rebuilt (``TransactionStorage.recover_pending``). While the node's
budget allows, a blob's bytes are also kept in memory so the commit can put
them in the partition's in-memory tail, where consumers at the head of the
log read them without the disk.

A Produce takes its transaction's sink before its records are checked, and
a compressed or large batch is checked on a worker thread, so the
transaction may end before the batch would be stored. The sink therefore
counts the appends it expects (``PartitionSink.expect`` .. ``settled``):
EndTxn(commit) waits for them (``PendingData.drain``) before it stages the
commit, taking no new ones meanwhile, so a batch that will be acknowledged
is always in the commit; and every end (commit, abort, fence, timeout) is
marked synchronously when it is staged (``PendingData.end``), so a batch
still in flight then is refused with the error its producer would get for a
new one, leaving nothing behind: no blob, no sequence, no budget.

The stored bytes are bounded, per transaction (``gateway.txn.max.bytes``) and
node-wide (``gateway.txn.pending.disk.bytes``): a batch that would cross
either limit is refused before anything of it is written (``admit``), and
its transaction is made abort-only, so it can only abort and give its bytes back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from tablets.batch import HEADER_SIZE, record_count_of
from tablets.seam import AtomicChange, PendingBlob, TopicPartition, TransactionStorage

from .errors import ConcurrentTransactions, TxnDoomed, TxnError

NO_LIMIT = -1


@dataclass(slots=True)
class MemoryBudget:
    """Bytes of open transactions' blobs held in memory, node-wide."""

    limit: int
    used: int = 0

    def take(self, nbytes: int) -> bool:
        if self.used + nbytes > self.limit:
            return False
        self.used += nbytes
        return True

    def give_back(self, nbytes: int) -> None:
        self.used -= nbytes


@dataclass(slots=True)
class StoredBytes:
    """Bytes of open transactions' blobs in the store, node-wide, and the
    limits on them (``NO_LIMIT``: none)."""

    node_limit: int = NO_LIMIT  # gateway.txn.pending.disk.bytes
    txn_limit: int = NO_LIMIT  # gateway.txn.max.bytes
    used: int = 0

    def over(self, txn_bytes: int, nbytes: int) -> tuple[str, str] | None:
        """(which limit, why) if a batch of ``nbytes`` may not join a
        transaction storing ``txn_bytes`` already; None if it may."""
        if self.txn_limit != NO_LIMIT and txn_bytes + nbytes > self.txn_limit:
            return "transaction", (
                f"a batch of {nbytes} bytes would take the transaction's stored batches from "
                f"{txn_bytes} to {txn_bytes + nbytes} bytes, past gateway.txn.max.bytes="
                f"{self.txn_limit}")
        if self.node_limit != NO_LIMIT and self.used + nbytes > self.node_limit:
            return "node", (
                f"a batch of {nbytes} bytes would take the open transactions' stored batches "
                f"on this node from {self.used} to {self.used + nbytes} bytes, past "
                f"gateway.txn.pending.disk.bytes={self.node_limit}")
        return None


def _no_limit_action(limit: str, reason: str) -> None:
    pass


@dataclass(slots=True)
class PendingData:
    """The blobs of one open transaction (``instance``)."""

    instance: int
    budget: MemoryBudget
    storage: TransactionStorage
    stored: StoredBytes = field(default_factory=StoredBytes)
    # Called with (which limit, why) when a batch is refused for a limit:
    # the coordinator makes the transaction abort-only (``open_transactions.py``).
    make_abort_only: Callable[[str, str], None] = _no_limit_action
    blobs: dict[TopicPartition, list[PendingBlob]] = field(default_factory=dict)
    # Records of the blobs of each partition, by its key prefix (a topic
    # deleted and recreated under the transaction is another partition),
    # kept as they are added: a transactional Produce's offset bound
    # (``PartitionSink.pending_records``).
    records: dict[bytes, int] = field(default_factory=dict)
    next_ordinal: int = 0
    nbytes: int = 0  # bytes stored as blobs (on disk), counted in ``stored``
    held: int = 0  # bytes of them held in memory (from the budget)
    inflight: int = 0  # appends expected (their records being checked), not settled yet
    draining: bool = False  # a commit waits for the in-flight appends: no new ones
    # Why the transaction takes no more batches: the error a late one gets.
    ended: tuple[type[TxnError], str] | None = None
    _idle: asyncio.Future[None] | None = None
    # Why the transaction can only abort (a batch refused for a limit, an
    # offset-range conflict): every batch for it is refused from then on.
    refused: str | None = None
    # Whose transaction it is: the store fences its batches by the id's
    # coordinator slot (a cluster over PostgreSQL: pgstore/txn_slots.py).
    transactional_id: str | None = None

    def sink(self, tp: TopicPartition) -> PartitionSink:
        return PartitionSink(self, tp)

    def end(self, error: type[TxnError], message: str) -> None:
        """The transaction is committed, aborted or fenced (called when that is
        staged): a batch still in flight gets ``error`` and stores nothing."""
        self.ended = (error, message)

    def check_open(self) -> None:
        """Raises what a batch gets once the transaction has ended."""
        if self.ended is not None:
            error, message = self.ended
            raise error(message)

    async def drain(self) -> None:
        """Wait until every expected append has settled, refusing new ones
        meanwhile (``ConcurrentTransactions``), so none can starve the wait.
        The caller stages the transaction's end in the same event-loop step
        as this returns; if it is cancelled, appends are taken again."""
        self.draining = True
        try:
            while self.inflight:
                self._idle = asyncio.get_running_loop().create_future()
                await self._idle
        finally:
            self.draining = False
            self._idle = None

    def settled(self) -> None:
        """One in-flight append is over: wake the drain after the last."""
        self.inflight -= 1
        if self.inflight == 0 and self._idle is not None and not self._idle.done():
            self._idle.set_result(None)

    def release(self) -> None:
        """The transaction completed: its bytes go back to the node's counts."""
        self.budget.give_back(self.held)
        self.held = 0
        self.stored.used -= self.nbytes
        self.nbytes = 0
        self.blobs.clear()
        self.records.clear()

    @classmethod
    def recover(cls, storage: TransactionStorage, instance: int, budget: MemoryBudget,
                partitions: dict[TopicPartition, bytes],
                stored: StoredBytes | None = None) -> PendingData:
        """Rebuild an open transaction's blob lists from the store (start-up),
        and count their bytes in ``stored``.

        ``partitions`` maps the transaction's partitions (those still
        existing) to their log references.
        """
        pending = cls(instance, budget, storage, stored or StoredBytes())
        for tp, prefix in partitions.items():
            for blob in storage.recover_pending(prefix, instance):
                pending.next_ordinal = max(pending.next_ordinal, blob.ordinal + 1)
                pending.blobs.setdefault(tp, []).append(PendingBlob(blob.ref, blob.header, None))
                pending.records[prefix] = (pending.records.get(prefix, 0)
                                           + record_count_of(blob.header))
                pending.nbytes += blob.nbytes
        pending.stored.used += pending.nbytes
        return pending

    def abort(self, partitions: dict[TopicPartition, bytes], ops: AtomicChange) -> None:
        """Delete every blob of this transaction (its partitions and their log references)."""
        for prefix in partitions.values():
            self.storage.abort_pending(ops, prefix, self.instance)


@dataclass(slots=True)
class PartitionSink:
    """Where ``PartitionTablet.append`` puts one partition's transactional batches."""

    pending: PendingData
    tp: TopicPartition

    def expect(self) -> None:
        """An append of this partition will store a batch here once its records
        are checked; it settles with ``settled``."""
        self.pending.check_open()
        if self.pending.draining:
            raise ConcurrentTransactions(
                f"{self.tp[0]}-{self.tp[1]}: the transaction is being committed")
        self.pending.inflight += 1

    def settled(self) -> None:
        """An expected append's blob is registered (``added``), or it failed."""
        self.pending.settled()
    def admit(self, nbytes: int) -> None:
        """Raise TxnDoomed, before anything of it is stored, for a batch that
        would take the transaction or the node past a limit (the transaction
        is abort-only then), or whose transaction is abort-only already."""
        pending = self.pending
        if pending.refused is not None:
            raise TxnDoomed(f"{self.tp[0]}-{self.tp[1]}: the transaction can only abort: "
                            f"{pending.refused}")
        over = pending.stored.over(pending.nbytes, nbytes)
        if over is not None:
            limit, reason = over
            pending.refused = reason
            pending.make_abort_only(limit, reason)
            raise TxnDoomed(f"{self.tp[0]}-{self.tp[1]}: {reason}; the transaction can only "
                            "abort")

    def next_key(self, partition_prefix: bytes) -> bytes:
        """The key of the next blob; raises if the transaction ended meanwhile
        (before anything of the batch is stored)."""
        self.pending.check_open()
        ordinal = self.pending.next_ordinal
        self.pending.next_ordinal += 1
        return self.pending.storage.pending_ref(partition_prefix, self.pending.instance, ordinal)

    def pending_records(self, partition_prefix: bytes) -> int:
        return self.pending.records.get(partition_prefix, 0)

    @property
    def transactional_id(self) -> str | None:
        return self.pending.transactional_id

    def added(self, key: bytes, batch: bytes) -> None:
        pending = self.pending
        keep = pending.budget.take(len(batch))
        pending.held += len(batch) if keep else 0
        pending.nbytes += len(batch)
        pending.stored.used += len(batch)
        pending.blobs.setdefault(self.tp, []).append(
            PendingBlob(key, batch[:HEADER_SIZE], batch if keep else None))
        prefix = pending.storage.pending_log_ref(key)
        pending.records[prefix] = pending.records.get(prefix, 0) + record_count_of(batch)
