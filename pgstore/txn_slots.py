"""The transaction coordinator's slots in a cluster of gateways: the fence on
its writes, and what it reads when it gains a slot (``pgstore.txn_storage``
uses both; ``pgstore.cluster`` sets ``slot_holder`` and calls the reading).

A transactional id is coordinated by the leader of its coordinator slot
(``pgstore.leadership.coordinator_slot``). Every change the coordinator
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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from asyncpg import Record

from tablets.errors import CoordinatorMoved

from .migrate import Connection
from .txn_publication import PgTxnChange
from .txn_statements import TxnStatements

# A transactional id -> (its slot, this gateway's node id, the slot's epoch
# here), or None when this gateway does not coordinate it now.
SlotHolder = Callable[[str], "tuple[int, int, int] | None"]


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
