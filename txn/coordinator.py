"""The transaction coordinator, YDB-style: pending data outside the log, one
atomic write per commit, optimistic offset-range conflict checks.

Kafka's coordinator logs PrepareCommit, writes a marker to every partition
(each its own disk write, on other brokers) and logs CompleteCommit. Here a
transaction's batches wait as blobs outside the log (``pending.py``), and
EndTxn(commit) is ONE store write holding: a log entry per blob at the end of
each partition, a COMMIT control batch after them, the transaction's consumer
offsets, and the transaction marked complete. EndTxn(abort) deletes the
blobs. So no reader ever sees data of an open or aborted transaction, at any
isolation level.

Kafka's states, collapsed (``state.py`` keeps all eight names, for
DescribeTransactions and ListTransactions): Empty, Ongoing, CompleteCommit,
CompleteAbort and Dead are entered; PrepareCommit, PrepareAbort and
PrepareEpochFence never are. A commit or an abort goes from Ongoing straight
to Complete* in its one write, and a fence (InitProducerId, a timeout) aborts
and bumps the epoch in one write too, so no state waits between the two
halves of an end.

Requests for one transactional id are served one at a time (a lock per id);
a transactional Produce only checks, synchronously, that its batches belong
to the open transaction of its transactional id, producer id and epoch. Its
records may then be checked on a worker thread: EndTxn(commit) waits for
such in-flight batches before it stages the commit, and a batch whose
transaction ended meanwhile (aborted, fenced, timed out) stores nothing and
gets the error a new batch would (``pending.py``).

Fences, in the order they are checked:

- KIP-98: producer id and epoch (PRODUCER_FENCED / INVALID_PRODUCER_EPOCH);
- KIP-447: group generation and member at TxnOffsetCommit, when sent;
- the offset-range check (``conflicts.py``) at TxnOffsetCommit and EndTxn;
- KAFKA-17754: an EndTxn must come from a connection that carried a request
  of the transaction it ends, or from one opened after that transaction
  began; a delayed EndTxn of an earlier transaction, retried by the client
  elsewhere and answered already, can neither commit nor abort a later
  transaction of the same producer (the connection it waited on existed
  before the later transaction began, which the client could begin only
  after the retry was answered). A delayed Produce cannot either: its
  sequence number repeats or precedes the producer's (``tablets.producer_rules``).

The coordinator is the front of parts that each own one concern:

- ``sessions.py``: producer sessions and epochs (InitProducerId, the fences
  of KIP-98 and KIP-360, timeouts, expiry of ids);
- ``open_transactions.py``: open transactions (beginning one, the connections that carried
  it, marking it abort-only);
- ``commit.py``: EndTxn, and the commit or abort staged in one write;
- ``registry.py``: the ids in memory, in order and in the store;
- ``partitions.py``, ``pending.py``, ``pending_offsets.py``, ``conflicts.py``:
  a transaction's partitions, batches, staged offsets and their check;
- ``offset_commit.py``: TxnOffsetCommit, and ``remote_offsets.py`` for a
  transaction another gateway coordinates (a cluster).

Here: AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit and the
transactional Produce's sink.

In a cluster of gateways, this coordinator holds only the transactional
ids whose coordinator slot this gateway holds (``coordinated.py``). The
store fences every write by the slot's epoch besides (``pgstore.txn_slots``).

State is persisted with every change, through the storage seam
(``tablets.seam.TransactionStorage``: the id's state record, and a record per
partition of the open transaction), so after ``kill -9`` an open transaction
is still open, with every partition it added, and a completed one is
complete. Adding a partition writes its record only, so
AddPartitionsToTxn costs the same with 3 partitions in the transaction or
3,000.

Each partition is remembered with the id of the topic it was added as
(``partitions.py``): a topic deleted and recreated under the same name while
the transaction is open is another topic, which the commit (or abort) never
touches and a Produce of the transaction cannot write to.
"""

from __future__ import annotations

import builtins
import contextlib
import copy
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping

from common.clock import now_ms
from tablets.errors import CoordinatorMoved, StorageError
from tablets.seam import ChangeWriter, NodeStorage, OffsetCommit, TopicPartition

from .commit import TxnCompletion
from .coordinated import CoordinatedIds
from .errors import ConcurrentTransactions, InvalidTxnState
from .offset_commit import TxnOffsetCommits
from .open_transactions import OpenTransactions
from .ordered import SortedIds
from .partitions import TxnPartitions
from .pending import MemoryBudget, PartitionSink, StoredBytes
from .pending_offsets import PendingOffsets
from .producer_ids import ProducerIds
from .registry import TxnRegistry
from .remote_offsets import RemoteOffsets, StagingStorage
from .remote_produce import RemoteTransactions
from .sessions import Sessions
from .state import TxnMetadata, TxnState
from .stats import TxnSettings, TxnStats

__all__ = ["TransactionCoordinator", "TxnSettings", "TxnStats"]

log = logging.getLogger(__name__)


class TransactionCoordinator(CoordinatedIds):
    def __init__(self, node: NodeStorage, settings: TxnSettings | None = None,
                 clock: Callable[[], int] = now_ms,
                 newest_connection: Callable[[], int] = lambda: -1) -> None:
        storage = node.transaction_storage()  # the engine is started
        self.storage = storage
        self._writer: ChangeWriter = storage
        self.offsets = storage.consumer_offsets
        self.settings = settings or TxnSettings()
        self.clock = clock
        self.budget = MemoryBudget(self.settings.pending_memory_bytes)
        self.stored = StoredBytes(self.settings.pending_disk_bytes, self.settings.max_txn_bytes)
        self.stats = TxnStats()
        # Offsets staged by open transactions: OffsetFetch(require_stable) asks here.
        self.pending_offsets = PendingOffsets()
        self.partitions = TxnPartitions(storage)
        self.registry = TxnRegistry(storage, self.partitions)
        self.open_txns = OpenTransactions(self.registry, self.partitions, self.offsets,
                                          self.writer, self.budget, self.stored, self.stats,
                                          clock, newest_connection)
        self.completion = TxnCompletion(self.registry, self.open_txns, self.partitions,
                                        self.offsets, self.pending_offsets, self.writer,
                                        self.stats, clock)
        self.sessions = Sessions(self.registry, self.completion, ProducerIds(storage),
                                 self.writer, self.settings, self.stats, clock)
        self.offset_commits = TxnOffsetCommits(
            self.registry, self.open_txns, self.offsets, self.pending_offsets, self.writer,
            RemoteOffsets(storage, self.pending_offsets)
            if isinstance(storage, StagingStorage) else None)
        self.sessions.check_coordinates = self.check_coordinates
        self.sessions.refused = self.refused
        # Which ids are held here (``coordinated.py``).
        self._moved = set()
        self.coordinates = lambda _transactional_id: True
        self._keep = None
        self.reload = None
        self._reloads = set()

    @property
    def remote(self) -> RemoteTransactions | None:
        """A cluster's transactions that other gateways coordinate, or whose
        batches other gateways store (``remote_produce.py``); None alone."""
        return self.completion.remote

    @remote.setter
    def remote(self, remote: RemoteTransactions | None) -> None:
        self.completion.remote = remote

    @property
    def writer(self) -> ChangeWriter:
        """What every part writes with."""
        return self._writer

    @writer.setter
    def writer(self, writer: ChangeWriter) -> None:
        """Replace it in every part (a test holds writes: ``testkit.txn.HeldWrites``)."""
        self._writer = writer
        self.open_txns.writer = self.completion.writer = self.sessions.writer = writer
        self.offset_commits.writer = writer

    @property
    def ordered(self) -> SortedIds:
        """The transactional ids in order (the console pages them)."""
        return self.registry.ordered

    @contextlib.asynccontextmanager
    async def _serving(self, transactional_id: str) -> AsyncIterator[None]:
        """A request for the id: one at a time, only while coordinated here."""
        async with self.registry.lock(transactional_id):
            self.check_coordinates(transactional_id)
            try:
                yield
            except CoordinatorMoved:
                self.refused(transactional_id)
                raise
            except StorageError:
                self._in_doubt(transactional_id)
                raise

    # ------------------------------------------------------ sessions and ends
    async def init_producer_id(self, transactional_id: str | None, timeout_ms: int,
                               producer_id: int = -1, epoch: int = -1) -> tuple[int, int]:
        """(producer id, epoch) for a new session of a producer (``sessions.py``)."""
        try:
            return await self.sessions.init_producer_id(transactional_id, timeout_ms,
                                                        producer_id, epoch)
        except CoordinatorMoved:
            if transactional_id is not None:
                self.refused(transactional_id)
            raise

    async def end_txn(self, transactional_id: str, producer_id: int, epoch: int,
                      commit: bool, connection: int = -1) -> None:
        """Commit or abort the open transaction, in one store write (``commit.py``)."""
        async with self._serving(transactional_id):
            meta = self.sessions.current(transactional_id, producer_id, epoch)
            try:
                await self.completion.end_txn(meta, commit, connection)
            except StorageError as exc:
                if self.reload is None:
                    raise
                # A cluster: the id is read again from the store (``_in_doubt``)
                # and its retried EndTxn finds the commit there, or the
                # transaction still open and commits it. Answered as Kafka's
                # coordinator answers a failed write of its log, NOT_COORDINATOR
                # (retriable: the client looks its coordinator up and retries),
                # not KAFKA_STORAGE_ERROR, which clients take for the
                # transaction's failure (it fails, or must be aborted).
                self._in_doubt(transactional_id)
                raise CoordinatorMoved(
                    f"{transactional_id}: the end's write failed ({exc}); the id is read "
                    "again from the store: retry") from exc

    async def expire(self) -> None:
        """Abort timed-out transactions and forget expired ids (``sessions.py``)."""
        await self.sessions.expire()

    # ----------------------------------------- AddPartitionsToTxn / Offsets
    async def add_partitions(self, transactional_id: str, producer_id: int, epoch: int,
                             partitions: Iterable[TopicPartition],
                             connection: int = -1) -> None:
        """Register partitions in the transaction (beginning it if needed).

        The caller has checked that every partition exists.
        """
        async with self._serving(transactional_id):
            meta = self.sessions.current(transactional_id, producer_id, epoch)
            began = not meta.is_open
            before = copy.deepcopy(meta) if began else None
            self.open_txns.touch(meta, connection)
            ops = self.writer.begin()
            # Only the partitions added are written (and the state record when
            # the transaction begins): the cost does not grow with the
            # transaction.
            added = self.partitions.add(meta, partitions, ops)
            if began or self.partitions.is_unsaved(meta):
                self.registry.put(meta, ops)
            elif not added:
                return
            await self.open_txns.write_begin(meta, ops, before)

    async def add_offsets(self, transactional_id: str, producer_id: int, epoch: int,
                          group: str, connection: int = -1) -> None:
        async with self._serving(transactional_id):
            meta = self.sessions.current(transactional_id, producer_id, epoch)
            before = None if meta.is_open else copy.deepcopy(meta)
            self.open_txns.touch(meta, connection)
            if group not in meta.groups:
                meta.groups.add(group)
                ops = self.writer.begin()
                self.registry.put(meta, ops)
                await self.open_txns.write_begin(meta, ops, before)

    # ------------------------------------------------------ TxnOffsetCommit
    async def txn_offset_commit(self, transactional_id: str, producer_id: int, epoch: int,
                                group: str, commits: Mapping[TopicPartition, OffsetCommit],
                                connection: int = -1, member: str = "") -> None:
        """Stage a group's offsets in the open transaction (``offset_commit.py``).
        The caller checked KIP-447's generation and member fences first."""
        async with self._serving(transactional_id):
            meta = self.sessions.current(transactional_id, producer_id, epoch)
            await self.offset_commits.here(meta, group, commits, connection, member)

    async def txn_offset_commit_elsewhere(self, transactional_id: str, producer_id: int,
                                          epoch: int, group: str,
                                          commits: Mapping[TopicPartition, OffsetCommit],
                                          member: str = "") -> None:
        """Stage a group's offsets, here its coordinator, for a transaction
        another gateway coordinates (``offset_commit.py``)."""
        await self.offset_commits.elsewhere(transactional_id, producer_id, epoch, group,
                                            commits, member)

    async def settle_offsets(self, group: str) -> None:
        """Before the group's offsets are read (``offset_commit.py``)."""
        await self.offset_commits.settle(group)

    # -------------------------------------------------- transactional Produce
    def sink_for(self, transactional_id: str, producer_id: int, epoch: int, topic: str,
                 partition: int, connection: int = -1) -> PartitionSink:
        """Where a transactional batch of this producer for this partition goes.

        Checked as Kafka 3.6+ verifies a transactional Produce (KIP-890,
        ``handleVerifyPartitionsInTransaction``), in its order: the producer
        id must be the transactional id's (a producer cannot write into
        another id's transaction: Kafka 3.4 lets it), the epoch current, no
        commit in progress, and the partition added to the open transaction
        (Kafka 3.4 would write such a batch into the log and leave a hanging
        transaction).
        """
        meta = self.sessions.current(transactional_id, producer_id, epoch)
        if meta.is_open and self.open_txns.by_id[transactional_id].data.draining:
            raise ConcurrentTransactions(f"the transaction of {transactional_id} is being "
                                         "committed")
        if not meta.is_open or (topic, partition) not in meta.partitions:
            raise InvalidTxnState(f"{topic}-{partition} is not part of an open transaction of "
                                  f"{meta.transactional_id} (AddPartitionsToTxn first)")
        if not self.partitions.is_current(meta, (topic, partition)):
            raise InvalidTxnState(f"topic {topic} was deleted and recreated after "
                                  f"{meta.transactional_id} added {topic}-{partition}")
        opened = self.open_txns.by_id[meta.transactional_id]
        opened.connections.add(connection)
        return opened.data.sink((topic, partition))

    # --------------------------------------------------- describing
    def describe(self, transactional_id: str) -> TxnMetadata:
        return self.registry.describe(transactional_id)

    def list(self, states: set[TxnState] | None = None,
             producer_ids: set[int] | None = None) -> builtins.list[TxnMetadata]:
        return self.registry.matching(states, producer_ids)

    @property
    def open_count(self) -> int:
        return len(self.open_txns.by_id)

    @property
    def pending_bytes(self) -> int:
        """Bytes of open transactions' batches stored, node-wide."""
        return self.stored.used

    @property
    def pending_memory_bytes(self) -> int:
        """Bytes of them also held in memory."""
        return self.budget.used

    def pending_of(self, transactional_id: str) -> tuple[int, int] | None:
        """(bytes stored, bytes of them held in memory) of an id's open
        transaction; None when it has none."""
        opened = self.open_txns.by_id.get(transactional_id)
        return None if opened is None else (opened.data.nbytes, opened.data.held)
