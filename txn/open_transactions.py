"""Open transactions: beginning one, who touched it, and marking it abort-only.

A transaction begins with the first AddPartitionsToTxn, AddOffsetsToTxn or
TxnOffsetCommit after its producer's session began or its last transaction
ended: it takes a new node-wide instance (its blobs are stored under it) and
the consumer-offsets version of that moment (``conflicts.py``). What it keeps
in memory only is an ``OpenTransaction``: its pending data (``pending.py``)
and the connections that carried its requests (KAFKA-17754, at EndTxn).

A change that begins one is refused when another gateway sharing the store
moved the instance counter (``write_begin``: CONCURRENT_TRANSACTIONS).

An open transaction becomes *abort-only* when its offsets conflict
(``conflicts.py``) or one of its batches would cross a pending-bytes limit
(``pending.py``): the reason is persisted with its state, every later batch
of it is refused, and EndTxn(commit) aborts it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from common.logtext import client_text
from tablets.errors import ChangeRefused
from tablets.seam import AtomicChange, ChangeWriter, ConsumerOffsetStore

from .errors import ConcurrentTransactions, InvalidTxnState
from .partitions import TxnPartitions
from .pending import MemoryBudget, PendingData, StoredBytes
from .registry import TxnRegistry
from .state import TxnMetadata, TxnState
from .stats import TxnStats

log = logging.getLogger(__name__)


@dataclass(slots=True)
class OpenTransaction:
    """What an open transaction keeps in memory only."""

    data: PendingData
    connections: set[int] = field(default_factory=set)
    # The newest connection id when this transaction began.
    newest_connection: int = -1


class OpenTransactions:
    def __init__(self, registry: TxnRegistry, partitions: TxnPartitions,
                 offsets: ConsumerOffsetStore, writer: ChangeWriter, budget: MemoryBudget,
                 stored: StoredBytes, stats: TxnStats, clock: Callable[[], int],
                 newest_connection: Callable[[], int]) -> None:
        self.registry = registry
        self.partitions = partitions
        self.offsets = offsets
        self.writer = writer
        self.budget = budget
        self.stored = stored
        self.stats = stats
        self.clock = clock
        self.newest_connection = newest_connection
        self.by_id: dict[str, OpenTransaction] = {}

    def recover(self, meta: TxnMetadata) -> None:
        """Rebuild an open transaction loaded from the store (start-up)."""
        data = PendingData.recover(self.registry.storage, meta.instance, self.budget,
                                   self.partitions.prefixes(meta), self.stored)
        data.make_abort_only = self._abort_only_over_limit(meta, meta.instance)
        data.refused = meta.abort_only
        data.transactional_id = meta.transactional_id
        self.by_id[meta.transactional_id] = OpenTransaction(data)

    def touch(self, meta: TxnMetadata, connection: int) -> OpenTransaction:
        """Begin the transaction if it is not open yet; note who touched it."""
        now = self.clock()
        if not meta.is_open:
            meta.instance = self.registry.next_instance()
            meta.move(TxnState.ONGOING)
            meta.started_ms = now
            meta.begin_version = self.offsets.last_version
            meta.partitions.clear()
            meta.groups.clear()
            meta.offsets.clear()
            meta.members.clear()
            meta.abort_only = None
            data = PendingData(meta.instance, self.budget, self.registry.storage, self.stored,
                               self._abort_only_over_limit(meta, meta.instance),
                               transactional_id=meta.transactional_id)
            self.by_id[meta.transactional_id] = OpenTransaction(
                data, newest_connection=self.newest_connection())
        meta.updated_ms = now
        opened = self.by_id[meta.transactional_id]
        opened.connections.add(connection)
        return opened

    async def write_begin(self, meta: TxnMetadata, ops: AtomicChange,
                          before: TxnMetadata | None) -> None:
        """Write a change that may begin the transaction (``before``: the
        state then). A store shared by gateways refuses it when another
        gateway moved a counter it sets (the transaction's instance):
        nothing was written, so the transaction did not begin, here either;
        the client's retry begins it with a new instance: it is answered
        CONCURRENT_TRANSACTIONS, which clients retry (AddPartitionsToTxn and
        AddOffsetsToTxn), as they do while Kafka completes a previous
        transaction; a storage error would fail the transaction."""
        try:
            await self.writer.commit(ops)
        except ChangeRefused as refused:
            if before is not None:
                opened = self.by_id.pop(meta.transactional_id, None)
                if opened is not None:
                    opened.data.end(InvalidTxnState, f"the transaction of "
                                    f"{meta.transactional_id} did not begin")
                for name in TxnMetadata.__slots__:
                    setattr(meta, name, getattr(before, name))
            raise ConcurrentTransactions(
                f"{meta.transactional_id}: another gateway began a transaction at the same "
                "moment; retry") from refused

    def pop(self, transactional_id: str) -> OpenTransaction:
        """The transaction ends (its end is being staged)."""
        return self.by_id.pop(transactional_id)

    async def make_abort_only(self, meta: TxnMetadata, reason: str) -> None:
        """Its offsets conflict: the transaction can only abort (persisted)."""
        if meta.abort_only is None:
            self.stats.conflicts += 1
            log.warning("transaction %s (producer %d epoch %d) conflicts and can only abort: %s",
                        client_text(meta.transactional_id), meta.producer_id, meta.epoch, reason)
            meta.abort_only = reason
            self.by_id[meta.transactional_id].data.refused = reason  # its batches too
            ops = self.writer.begin()
            self.registry.put(meta, ops)
            await self.writer.commit(ops)

    def _abort_only_over_limit(self, meta: TxnMetadata,
                               instance: int) -> Callable[[str, str], None]:
        """What makes this transaction abort-only when one of its batches is
        refused for a pending-bytes limit. Called from the tablet's append (not
        under the id's lock): the reason is set at once and its write queued,
        and writes land in order, so every later change of the id keeps it."""

        def over_limit(limit: str, reason: str) -> None:
            if not meta.is_open or meta.instance != instance or meta.abort_only is not None:
                return
            self.stats.over_limit[limit] += 1
            log.warning("transaction %s (producer %d epoch %d) can only abort: %s",
                        meta.transactional_id, meta.producer_id, meta.epoch, reason)
            meta.abort_only = reason
            ops = self.writer.begin()
            self.registry.put(meta, ops)
            # A failed write fails the store, and every later request with it.
            self.writer.commit(ops).add_done_callback(
                lambda done: done.cancelled() or done.exception())

        return over_limit
