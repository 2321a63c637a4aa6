"""The transaction coordinator's slots in a cluster of gateways: the fence on
its writes, and what it reads when it gains a slot (``pgstore.txn_storage``
uses both; ``pgstore.cluster`` sets ``slot_holder`` and calls the reading).

A transactional id is coordinated by the leader of its coordinator slot
(``pgstore.placement.coordinator_slot``). Every change the coordinator
makes to an id (its state row, the rows of its open transaction's
partitions: hence every begin, commit, abort, fence and timeout) begins with
the slot's fence: the slot is still this gateway's, at the epoch it gained
it, checked under the slot row's share lock inside the same PostgreSQL
transaction; else the change is refused (``CoordinatorMoved``:
NOT_COORDINATOR) and nothing of it lands. A takeover (an UPDATE of the row)
waits for a change already past the fence, and a change after it finds no
row. So a gateway that lost the slot (paused, cut off, or simply not told
yet) can neither commit, abort nor time out a transaction it no longer
coordinates.

The coordinator's own transactional batches (a Produce to a partition it
leads, ``PgTransactionStorage.stage_pending``) carry the same fence, in the
one statement that also checks the partition's leader epoch
(``fence_pending``): a gaining gateway reads the id's pending rows
(``read_ids``) only after the takeover committed, so a batch either landed
before the takeover (which waited for its share lock) and is read, or is
refused (``PendingSlotMoved``: nothing stored, not acknowledged; the
client retries it, KAFKA_STORAGE_ERROR, and its retry goes through the
partition's leader as a batch of a transaction coordinated elsewhere,
``pgstore.remote_txn``). Without it, a batch whose write was in flight on
the old coordinator when the slot moved could land after the new one read
the pending rows, acknowledged but never in the commit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from asyncpg import Record

from tablets.errors import CoordinatorMoved, StorageError

from .migrate import Connection
from .txn_publication import PgTxnChange, PublicationFenced
from .txn_statements import TxnStatements
from .writer import PgChange

# A transactional id -> (its slot, this gateway's node id, the slot's epoch
# here), or None when this gateway does not coordinate it now.
SlotHolder = Callable[[str], "tuple[int, int, int] | None"]


class SlotHolding(Protocol):
    """Where the coordinator's writers read ``slot_holder`` at each write
    (``PgTransactionStorage``: ``pgstore.cluster`` sets it after the storage
    is made; None without a cluster)."""

    @property
    def slot_holder(self) -> SlotHolder | None: ...


class CoordinatorChange(PgTxnChange):
    """A change of the transaction coordinator: remembers the ids it fenced,
    so a change touching one id many times (a commit over 3,000 partitions)
    carries one fence."""

    __slots__ = ("fenced",)

    def __init__(self) -> None:
        super().__init__()
        self.fenced: set[str] = set()


def fence_coordinator(change: PgTxnChange, sql: TxnStatements, holder: SlotHolder | None,
                      transactional_id: str) -> None:
    """Begin ``change`` with the fence of ``transactional_id``'s slot (see the
    module's docstring); raises ``CoordinatorMoved`` at once when this gateway
    does not hold the slot now. Nothing without a cluster (``holder`` None)."""
    if holder is None:
        return
    if isinstance(change, CoordinatorChange):
        if transactional_id in change.fenced:
            return
        change.fenced.add(transactional_id)
    held = holder(transactional_id)
    if held is None:
        raise CoordinatorMoved(f"transactional id {transactional_id!r}: this gateway does not "
                               "coordinate it")
    slot, node, epoch = held
    change.fence(sql.slot_held, slot, node, epoch, refused=lambda: CoordinatorMoved(
        f"transactional id {transactional_id!r}: coordinator slot {slot} left node {node} "
        f"(epoch {epoch}) before the write; nothing of it was stored"))


class PendingSlotMoved(StorageError):
    """A transactional batch of the coordinator's own was refused: the
    transactional id's coordinator slot left this gateway (or the partition
    its leader epoch) before the batch was stored; nothing of it was. A
    StorageError (KAFKA_STORAGE_ERROR), not NOT_COORDINATOR, which no
    client expects from Produce: librdkafka and the Java client retry the
    batch (the Java client refreshing its metadata too), with the same
    sequence, and the retry is stored through the partition's leader."""


def fence_pending(change: PgChange, sql: TxnStatements, holder: SlotHolder | None,
                  transactional_id: str | None, log_id: int, epoch: int) -> None:
    """Begin ``change`` (a transactional append) with its fence: the
    partition at ``epoch`` and, in a cluster, the transactional id's slot
    still this gateway's (see the module's docstring), in one statement.
    Raises ``PendingSlotMoved`` at once when this gateway does not hold the
    slot now. Without a cluster, or without an id (a caller storing for no
    coordinator of its own), the partition's alone."""
    if holder is None or transactional_id is None:
        change.fence(sql.pending_fence, log_id, epoch, refused=lambda: PublicationFenced(
            f"log {log_id}: not at leader epoch {epoch} any more: transactional batch not "
            "stored"))
        return
    held = holder(transactional_id)
    if held is None:
        raise PendingSlotMoved(f"transactional id {transactional_id!r}: this gateway does not "
                               "coordinate it any more: transactional batch not stored")
    slot, node, slot_epoch = held
    change.fence(sql.pending_slot_fence, log_id, epoch, slot, node, slot_epoch,
                 refused=lambda: PendingSlotMoved(
                     f"transactional id {transactional_id!r}: coordinator slot {slot} left "
                     f"node {node} (epoch {slot_epoch}), or log {log_id} is not at leader "
                     f"epoch {epoch} any more: transactional batch not stored"))


async def read_ids(conn: Connection, sql: TxnStatements, keep: Callable[[str], bool],
                   ) -> tuple[list[Record], list[Record], list[Record], list[Record]]:
    """(counters, states, partitions, pending rows) of the transactional ids
    ``keep`` selects, in one snapshot: what the coordinator needs of them
    when it gains their slot (another gateway wrote them since start-up)."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        counters = await conn.fetch(sql.load_counters)
        states = [row for row in await conn.fetch(sql.load_states)
                  if keep(row["transactional_id"])]
        ids: Sequence[str] = [row["transactional_id"] for row in states]
        partitions = await conn.fetch(sql.load_partitions_of, ids) if ids else []
        pending = await conn.fetch(sql.load_pending_of, ids) if ids else []
    return counters, states, list(partitions), list(pending)
