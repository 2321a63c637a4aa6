"""The data of an open transaction: blobs written at Produce time, per partition.

A transactional batch is stored once, as a blob outside the log
(``keys.blob_key``: the partition, the transaction's node-wide instance, the
arrival order). The coordinator keeps the list of each open transaction's
blobs, so EndTxn(commit) can write one small log entry per blob without
reading any of them; after a restart the list is rebuilt by one scan of the
transaction's key range. While the node's budget allows, a blob's bytes are
also kept in memory so the commit can put them in the partition's in-memory
tail, where consumers at the head of the log read them without the disk.

The stored bytes are bounded, per transaction (``gateway.txn.max.bytes``) and
node-wide (``gateway.txn.pending.disk.bytes``): a batch that would cross
either limit is refused before anything of it is written (``admit``), and
its transaction is doomed, so it can only abort and give its bytes back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tablets import keys
from tablets.batch import HEADER_SIZE
from tablets.consumer_offsets import TopicPartition
from tablets.store import Ops, RocksStore
from tablets.tablet import PendingBlob

from .errors import TxnDoomed

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


def _no_doom(limit: str, reason: str) -> None:
    pass


@dataclass(slots=True)
class PendingData:
    """The blobs of one open transaction (``instance``)."""

    instance: int
    budget: MemoryBudget
    stored: StoredBytes = field(default_factory=StoredBytes)
    # Called with (which limit, why) when a batch is refused for a limit:
    # the coordinator dooms the transaction.
    doom: Callable[[str, str], None] = _no_doom
    blobs: dict[TopicPartition, list[PendingBlob]] = field(default_factory=dict)
    next_ordinal: int = 0
    nbytes: int = 0  # bytes stored as blobs (on disk), counted in ``stored``
    held: int = 0  # bytes of them held in memory (from the budget)
    # Why the transaction can only abort (a batch refused for a limit, an
    # offset-range conflict): every batch for it is refused from then on.
    refused: str | None = None

    def sink(self, tp: TopicPartition) -> PartitionSink:
        return PartitionSink(self, tp)

    def release(self) -> None:
        """The transaction completed: its bytes go back to the node's counts."""
        self.budget.give_back(self.held)
        self.held = 0
        self.stored.used -= self.nbytes
        self.nbytes = 0
        self.blobs.clear()

    @classmethod
    def recover(cls, store: RocksStore, instance: int, budget: MemoryBudget,
                partitions: dict[TopicPartition, bytes],
                stored: StoredBytes | None = None) -> PendingData:
        """Rebuild an open transaction's blob lists from the store (start-up),
        and count their bytes in ``stored``.

        ``partitions`` maps the transaction's partitions (those still
        existing) to their key prefixes.
        """
        pending = cls(instance, budget, stored or StoredBytes())
        for tp, prefix in partitions.items():
            for key, value in store.scan(*keys.blob_range(prefix, instance)):
                pending.next_ordinal = max(pending.next_ordinal, keys.blob_ordinal(key) + 1)
                pending.blobs.setdefault(tp, []).append(
                    PendingBlob(key, bytes(value[:HEADER_SIZE]), None))
                pending.nbytes += len(value)
        pending.stored.used += pending.nbytes
        return pending

    def abort(self, partitions: dict[TopicPartition, bytes], ops: Ops) -> None:
        """Delete every blob of this transaction (its partitions and their prefixes)."""
        for prefix in partitions.values():
            ops.delete_range(*keys.blob_range(prefix, self.instance))


@dataclass(slots=True)
class PartitionSink:
    """Where ``PartitionTablet.append`` puts one partition's transactional batches."""

    pending: PendingData
    tp: TopicPartition

    def admit(self, nbytes: int) -> None:
        """Raise TxnDoomed, before anything of it is stored, for a batch that
        would take the transaction or the node past a limit (the transaction
        is doomed then), or whose transaction was doomed so already."""
        pending = self.pending
        if pending.refused is not None:
            raise TxnDoomed(f"{self.tp[0]}-{self.tp[1]}: the transaction can only abort: "
                            f"{pending.refused}")
        over = pending.stored.over(pending.nbytes, nbytes)
        if over is not None:
            limit, reason = over
            pending.refused = reason
            pending.doom(limit, reason)
            raise TxnDoomed(f"{self.tp[0]}-{self.tp[1]}: {reason}; the transaction can only "
                            "abort")

    def next_key(self, partition_prefix: bytes) -> bytes:
        ordinal = self.pending.next_ordinal
        self.pending.next_ordinal += 1
        return keys.blob_key(partition_prefix, self.pending.instance, ordinal)

    def added(self, key: bytes, batch: bytes) -> None:
        pending = self.pending
        keep = pending.budget.take(len(batch))
        pending.held += len(batch) if keep else 0
        pending.nbytes += len(batch)
        pending.stored.used += len(batch)
        pending.blobs.setdefault(self.tp, []).append(
            PendingBlob(key, batch[:HEADER_SIZE], batch if keep else None))
