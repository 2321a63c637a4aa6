"""The transactional ids: in memory, in order, and in the store.

Every change of an id's state is one ``put`` into the store write that makes
it durable (the state record, the partitions not written yet, and the
node-wide counter of transaction instances when this change took a new one).
Requests for one id are served one at a time: ``lock``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tablets.seam import AtomicChange, TransactionStorage

from .errors import TransactionalIdNotFound
from .ordered import SortedIds
from .partitions import TxnPartitions
from .state import TxnMetadata, TxnState

_INSTANCE = "txn.instance"


class TxnRegistry:
    def __init__(self, storage: TransactionStorage, partitions: TxnPartitions) -> None:
        self.storage = storage
        self.partitions = partitions
        self.txns: dict[str, TxnMetadata] = {}
        self.ordered = SortedIds()  # the keys of txns, in order (the console pages them)
        self._locks: dict[str, asyncio.Lock] = {}
        self._last_instance = storage.counter(_INSTANCE) or 0

    def load(self, keep: Callable[[str], bool] | None = None) -> list[TxnMetadata]:
        """Read every transactional id (start-up), or those ``keep`` selects
        that are not in memory (a coordinator slot gained: their instances
        were taken, and counted, by the gateway that began them); returns them."""
        loaded = []
        for transactional_id, value in self.storage.txn_states():
            if keep is not None and (transactional_id in self.txns or not keep(transactional_id)):
                continue
            meta = TxnMetadata.decode(transactional_id, value)
            self.register(meta)
            if keep is None:
                self._last_instance = max(self._last_instance, meta.instance)
            self.partitions.load(meta)
            loaded.append(meta)
        return loaded

    def register(self, meta: TxnMetadata) -> None:
        if meta.transactional_id not in self.txns:
            self.ordered.add(meta.transactional_id)
        self.txns[meta.transactional_id] = meta

    def forget(self, meta: TxnMetadata) -> None:
        """The id expired and its deletion is durable."""
        del self.txns[meta.transactional_id]
        self.ordered.discard(meta.transactional_id)
        self._locks.pop(meta.transactional_id, None)

    def lock(self, transactional_id: str) -> asyncio.Lock:
        lock = self._locks.get(transactional_id)
        if lock is None:
            lock = self._locks[transactional_id] = asyncio.Lock()
        return lock

    def next_instance(self) -> int:
        """A new node-wide transaction instance (persisted by the next ``put``
        of the transaction that takes it); ahead of the storage's counter,
        which another gateway sharing it may have moved."""
        self._last_instance = max(self._last_instance,
                                  self.storage.counter(_INSTANCE) or 0) + 1
        return self._last_instance

    def put(self, meta: TxnMetadata, ops: AtomicChange) -> None:
        """Add the id's state to ``ops``."""
        self.storage.put_txn_state(ops, meta.transactional_id, meta.encode())
        self.partitions.put_unsaved(meta, ops)
        # The counter is set by the change that begins the transaction (its
        # instance above the counter as the storage holds it), not again:
        # setting it back to an instance another gateway already passed is
        # refused by a store shared by gateways (every later change of the
        # transaction, and every InitProducerId of a new id, whose instance
        # is 0, failed once another gateway began a transaction).
        if meta.instance > (self.storage.counter(_INSTANCE) or 0):
            self.storage.set_counter(ops, _INSTANCE, meta.instance)

    def describe(self, transactional_id: str) -> TxnMetadata:
        meta = self.txns.get(transactional_id)
        if meta is None:
            raise TransactionalIdNotFound(f"transactional id {transactional_id!r} is unknown")
        return meta

    def matching(self, states: set[TxnState] | None = None,
             producer_ids: set[int] | None = None) -> list[TxnMetadata]:
        return [meta for meta in self.txns.values()
                if (not states or meta.state in states)
                and (not producer_ids or meta.producer_id in producer_ids)]
