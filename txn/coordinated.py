"""Which transactional ids this coordinator holds, in a cluster of gateways
(``coordinates``, wired by the server to the engine's ``ClusterView``): none
at start-up, those of a slot when it is gained (``load_gained``: read from
the store before the slot answers for them; a transaction open there is open
here, its timeout counted from its persisted start), and none of a slot it
lost (``drop``: no timeout, no commit from here; requests answer
NOT_COORDINATOR). A write the store refused for the coordinator's fence
(``refused``) or whose outcome is unknown (``_in_doubt``) drops the id until
it is read again. On one gateway, every id is coordinated here and ``load``
reads them all.

A part of ``TransactionCoordinator`` (``coordinator.py``), which sets the
attributes declared here.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
from collections.abc import Awaitable, Callable

from common.logtext import client_text
from tablets.errors import CoordinatorMoved

from .errors import InvalidTxnState
from .open_transactions import OpenTransactions
from .partitions import TxnPartitions
from .pending_offsets import PendingOffsets
from .registry import TxnRegistry
from .state import TxnMetadata

log = logging.getLogger("txn.coordinator")


class CoordinatedIds:
    """The ids held here, as a part of ``TransactionCoordinator``."""

    registry: TxnRegistry
    open_txns: OpenTransactions
    partitions: TxnPartitions
    pending_offsets: PendingOffsets
    # Ids whose write the store refused for the coordinator's fence: not
    # coordinated here until their slot is gained again (or lost).
    _moved: set[str]
    # Whether this gateway coordinates a transactional id now (a node
    # alone: every one; in a cluster: ``ClusterView.coordinates``).
    coordinates: Callable[[str], bool]
    _keep: Callable[[str], bool] | None  # what ``load`` takes (None: all)
    # In a cluster: reads the ids a predicate selects from the store again
    # (``ClusterView.reload_coordinated``), for an id whose write failed
    # with its outcome unknown (``_in_doubt``); None: a node alone, whose
    # failed write stops the node's writes for good.
    reload: Callable[[Callable[[str], bool]], Awaitable[None]] | None
    _reloads: set[asyncio.Task[None]]

    @property
    def txns(self) -> dict[str, TxnMetadata]:
        """Every transactional id's state, by id."""
        return self.registry.txns

    def load(self) -> None:
        """Read every transactional id this gateway coordinates (start-up);
        rebuild open transactions' blob lists."""
        self._take(self.registry.load(self._keep))
        log.info("loaded %d transactional ids, %d open transactions", len(self.txns),
                 len(self.open_txns.by_id))

    def in_cluster(self, coordinates: Callable[[str], bool]) -> None:
        """Coordinate only the ids ``coordinates`` says (before ``load``)."""
        self.coordinates = self._keep = coordinates

    def load_gained(self, gained: Callable[[str], bool]) -> None:
        """This gateway gained the coordinator slots of the ids ``gained``
        selects, and the store has read them again: take those not in memory
        (``ClusterView.watch_coordination``). An open transaction's timeout
        runs from its persisted start, so one past it is aborted by the next
        expiry pass."""
        self._moved = {t for t in self._moved if not gained(t)}
        loaded = self._take(self.registry.load(gained))
        if loaded:
            log.info("coordinator slot gained: loaded %d transactional ids, %d of them with "
                     "an open transaction", loaded, sum(
                         1 for t in self.open_txns.by_id if gained(t)))

    def _take(self, metas: builtins.list[TxnMetadata]) -> int:
        for meta in metas:
            if meta.is_open:
                self.open_txns.recover(meta)
                for group, commits in meta.offsets.items():
                    self.pending_offsets.hold(group, commits)
        return len(metas)

    def drop(self, was_here: Callable[[str], bool]) -> None:
        """This gateway stopped coordinating the ids ``was_here`` selects
        (``ClusterView.watch_coordination``): forget them, with their open
        transactions' memory (no timeout or commit from here any more; the
        gateway that gained the slot reads them from the store). A batch of
        theirs still being checked stores nothing (INVALID_TXN_STATE: the
        producer aborts)."""
        self._moved = {t for t in self._moved if not was_here(t)}
        gone = [meta for transactional_id, meta in self.registry.txns.items()
                if was_here(transactional_id)]
        for meta in gone:
            opened = self.open_txns.by_id.pop(meta.transactional_id, None)
            if opened is not None:
                opened.data.end(InvalidTxnState, f"the coordinator of {meta.transactional_id} "
                                "moved to another gateway before this batch was stored")
                opened.data.release()
                for group, commits in meta.offsets.items():
                    self.pending_offsets.release(group, commits)
            self.partitions.forget(meta.transactional_id)
            self.registry.forget(meta)
        if gone:
            log.info("coordinator slot lost: dropped %d transactional ids", len(gone))

    def check_coordinates(self, transactional_id: str) -> None:
        """NOT_COORDINATOR for an id this gateway stopped coordinating while
        its request waited (the protocol layer checked it on arrival)."""
        if transactional_id in self._moved or not self.coordinates(transactional_id):
            raise CoordinatorMoved(f"transactional id {transactional_id!r}: its coordinator "
                                   "slot moved to another gateway")

    def refused(self, transactional_id: str) -> None:
        """The store refused a write for the id (its slot's epoch moved): what
        memory holds of it may be ahead of the store (a commit staged, an
        epoch bumped), so it is dropped and not coordinated here (a retry
        answers NOT_COORDINATOR, never "already committed") until its slot is
        gained again, which reads it from the store."""
        self.drop(lambda t: t == transactional_id)
        self._moved.add(transactional_id)

    def _in_doubt(self, transactional_id: str) -> None:
        """A write for the id failed in the store (a lost connection, a
        failover: it may or may not have landed): memory may be ahead of the
        store (a commit staged as CompleteCommit), so the id is dropped as for
        a refused write, and read again from the store; until then its
        requests answer NOT_COORDINATOR (retriable), never from memory. A
        retried EndTxn then finds what the store holds: the commit, or the
        transaction still open."""
        if self.reload is None:
            return
        self.refused(transactional_id)
        reload = self.reload

        def keep(t: str) -> bool:
            return t == transactional_id

        async def again() -> None:
            pause = 0.05
            while transactional_id in self._moved and self.coordinates(transactional_id):
                try:
                    await reload(keep)
                except Exception as exc:  # the store is still away: try again
                    log.warning("transactional id %s: reading it again failed, retrying: %r",
                                client_text(transactional_id), exc)
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, 2.0)
                    continue
                self.load_gained(keep)

        task = asyncio.get_running_loop().create_task(again(), name="txn id reload")
        self._reloads.add(task)
        task.add_done_callback(self._reloads.discard)
