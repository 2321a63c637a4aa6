"""The transaction coordinator, YDB-style: pending data outside the log, one
atomic write per commit, optimistic offset-range conflict checks.

Kafka's coordinator logs PrepareCommit, writes a marker to every partition
(each its own disk write, on other brokers) and logs CompleteCommit. Here a
transaction's batches wait as blobs outside the log (``pending.py``), and
EndTxn(commit) is ONE store write holding: a log entry per blob at the end of
each partition, a COMMIT control batch after them, the transaction's consumer
offsets, and the transaction marked complete. EndTxn(abort) deletes the
blobs. So no reader ever sees data of an open or aborted transaction, at any
isolation level, and the states PrepareCommit/PrepareAbort never exist
(``state.py``).

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
  sequence number repeats or precedes the producer's (``tablets.producers``).

State is persisted with every change (``keys.TXN_STATE``, and a key per
partition of the open transaction: ``keys.TXN_PARTITION``), so after ``kill
-9`` an open transaction is still open, with every partition it added, and a
completed one is complete. Adding a partition writes its key only, so
AddPartitionsToTxn costs the same with 3 partitions in the transaction or
3,000.

Each partition is remembered with the id of the topic it was added as
(``partitions.py``): a topic deleted and recreated under the same name while
the transaction is open is another topic, which the commit (or abort) never
touches and a Produce of the transaction cannot write to.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from common.clock import now_ms
from common.logtext import client_text
from tablets import keys
from tablets.consumer_offsets import OffsetCommit, TopicPartition
from tablets.control import commit_marker
from tablets.engine import StorageEngine
from tablets.store import Ops

from .conflicts import offset_conflict
from .errors import (
    ConcurrentTransactions,
    InvalidProducerIdMapping,
    InvalidTransactionTimeout,
    InvalidTxnState,
    ProducerFenced,
    TransactionalIdNotFound,
    TxnConflict,
    TxnError,
)
from .ordered import SortedIds
from .partitions import TxnPartitions
from .pending import MemoryBudget, PartitionSink, PendingData, StoredBytes
from .producer_ids import ProducerIds
from .state import TxnMetadata, TxnState

log = logging.getLogger(__name__)

EPOCH_EXHAUSTED = 0x7FFF - 1  # Kafka moves to a new producer id at this epoch
_INSTANCE_KEY = keys.COUNTER + b"txn.instance"


@dataclass(frozen=True, slots=True)
class TxnSettings:
    max_timeout_ms: int = 900_000  # transaction.max.timeout.ms
    id_expiration_ms: int = 604_800_000  # transactional.id.expiration.ms
    # Node-wide bytes of open transactions' batches kept in memory, so a
    # commit can serve them from the partitions' in-memory tails.
    pending_memory_bytes: int = 64 << 20
    # Bytes of open transactions' batches stored (waiting for their commit),
    # node-wide and per transaction; a batch past either is refused and its
    # transaction doomed (-1: no limit).
    pending_disk_bytes: int = 4 << 30  # gateway.txn.pending.disk.bytes
    max_txn_bytes: int = 1 << 30  # gateway.txn.max.bytes


@dataclass(slots=True)
class TxnStats:
    """Counters for /metrics and the benchmark."""

    commits: int = 0
    aborts: int = 0
    timeouts: int = 0
    conflicts: int = 0
    fenced: int = 0
    stale_end_txn: int = 0
    # Transactions doomed because a batch would have crossed a pending-bytes
    # limit, per limit ("transaction", "node").
    over_limit: dict[str, int] = field(
        default_factory=lambda: {"transaction": 0, "node": 0})


@dataclass(slots=True)
class _Open:
    """What an open transaction keeps in memory only."""

    data: PendingData
    connections: set[int] = field(default_factory=set)
    # The newest connection id when this transaction began.
    newest_connection: int = -1


class TransactionCoordinator:
    def __init__(self, engine: StorageEngine, settings: TxnSettings | None = None,
                 clock: Callable[[], int] = now_ms,
                 newest_connection: Callable[[], int] = lambda: -1) -> None:
        assert engine.writer is not None and engine.consumer_offsets is not None, (
            "start the engine first")
        self.engine = engine
        self.store = engine.store
        self.writer = engine.writer
        self.offsets = engine.consumer_offsets
        self.settings = settings or TxnSettings()
        self.clock = clock
        self.newest_connection = newest_connection
        self.ids = ProducerIds(self.store)
        self.budget = MemoryBudget(self.settings.pending_memory_bytes)
        self.stored = StoredBytes(self.settings.pending_disk_bytes, self.settings.max_txn_bytes)
        self.stats = TxnStats()
        self.txns: dict[str, TxnMetadata] = {}
        self.ordered = SortedIds()  # the keys of txns, in order (the console pages them)
        self._open: dict[str, _Open] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.partitions = TxnPartitions(engine)
        raw = self.store.get(_INSTANCE_KEY)
        self._last_instance = int.from_bytes(raw, "big") if raw else 0

    # ------------------------------------------------------------ loading
    def load(self) -> None:
        """Read every transactional id; rebuild open transactions' blob lists."""
        start = keys.TXN_STATE
        for key, value in self.store.scan(start, start + b"\xff"):
            meta = TxnMetadata.decode(key[1:].decode(), value)
            self._register(meta)
            self._last_instance = max(self._last_instance, meta.instance)
            self.partitions.load(meta)
            if meta.is_open:
                data = PendingData.recover(self.store, meta.instance, self.budget,
                                           self._prefixes(meta), self.stored)
                data.doom = self._doomer(meta, meta.instance)
                data.refused = meta.doomed
                self._open[meta.transactional_id] = _Open(data)
                for group, commits in meta.offsets.items():
                    self.offsets.hold_pending(group, commits)
        log.info("loaded %d transactional ids, %d open transactions", len(self.txns),
                 len(self._open))

    def _prefixes(self, meta: TxnMetadata) -> dict[TopicPartition, bytes]:
        """The key prefixes of the transaction's partitions that still exist (as
        the topics they were added as)."""
        return {tp: tablet.prefix for tp, tablet in self.partitions.current(meta).items()}

    def _register(self, meta: TxnMetadata) -> None:
        if meta.transactional_id not in self.txns:
            self.ordered.add(meta.transactional_id)
        self.txns[meta.transactional_id] = meta

    def _lock(self, transactional_id: str) -> asyncio.Lock:
        lock = self._locks.get(transactional_id)
        if lock is None:
            lock = self._locks[transactional_id] = asyncio.Lock()
        return lock

    # ------------------------------------------------------- InitProducerId
    async def init_producer_id(self, transactional_id: str | None, timeout_ms: int,
                               producer_id: int = -1, epoch: int = -1) -> tuple[int, int]:
        """(producer id, epoch) for a new session of a producer.

        Without a transactional id: a fresh id (an idempotent producer).
        With one: abort its open transaction, bump the epoch (fencing every
        older session), or move to a new producer id when the epoch is
        exhausted. ``producer_id``/``epoch`` (v3+, KIP-360) name the session
        that asks; a retry of a bump it never saw the answer of gets the
        same answer again.
        """
        if transactional_id is None:
            ops = Ops()
            pid = self.ids.allocate(ops)
            await self.writer.submit(ops)
            return pid, 0
        if not 0 < timeout_ms <= self.settings.max_timeout_ms:
            raise InvalidTransactionTimeout(
                f"transaction timeout {timeout_ms} ms is not in (0, "
                f"{self.settings.max_timeout_ms}] (transaction.max.timeout.ms)")
        async with self._lock(transactional_id):
            meta = self.txns.get(transactional_id)
            ops = Ops()
            now = self.clock()
            if meta is None:
                meta = TxnMetadata(transactional_id, self.ids.allocate(ops), 0, timeout_ms,
                                   updated_ms=now)
                self._put(meta, ops)
                await self.writer.submit(ops)
                self._register(meta)
                return meta.producer_id, meta.epoch
            if producer_id >= 0:
                # The session before the last bump (or, after an exhausted
                # epoch, before the move to a new producer id) asks again.
                if (producer_id, epoch) == (meta.last_producer_id, meta.last_epoch):
                    return meta.producer_id, meta.epoch  # a retry of the bump it asked for
                if producer_id != meta.producer_id or epoch != meta.epoch:
                    self.stats.fenced += 1
                    raise ProducerFenced(
                        f"{transactional_id}: producer {producer_id} epoch {epoch} is not the "
                        f"current {meta.producer_id} epoch {meta.epoch}")
            publish = None
            if meta.is_open:
                publish = self._stage_abort(
                    meta, ops, ProducerFenced,
                    f"{transactional_id}: producer {meta.producer_id} epoch {meta.epoch} was "
                    "fenced by InitProducerId, and its transaction aborted, before this batch "
                    "was stored")
            self._bump_epoch(meta, ops, asked_by_current=producer_id >= 0)
            meta.timeout_ms = timeout_ms
            meta.move(TxnState.EMPTY)
            meta.updated_ms = now
            self._put(meta, ops)
            await self._write(ops, publish)
            return meta.producer_id, meta.epoch

    def _bump_epoch(self, meta: TxnMetadata, ops: Ops, asked_by_current: bool) -> None:
        """A new epoch (or producer id). Only a bump the current session asked
        for itself (KIP-360) may be retried by it; a fence (a new session, a
        timeout) leaves no way back for the old epoch."""
        meta.last_producer_id = meta.producer_id
        meta.last_epoch = meta.epoch if asked_by_current else -1
        if meta.epoch >= EPOCH_EXHAUSTED:
            meta.producer_id, meta.epoch = self.ids.allocate(ops), 0
        else:
            meta.epoch += 1

    # ------------------------------------------------- checking a request
    def _current(self, transactional_id: str, producer_id: int, epoch: int) -> TxnMetadata:
        meta = self.txns.get(transactional_id)
        if meta is None or meta.producer_id != producer_id:
            raise InvalidProducerIdMapping(
                f"transactional id {transactional_id!r} is not mapped to producer {producer_id}")
        if epoch != meta.epoch:
            self.stats.fenced += 1
            raise ProducerFenced(f"{transactional_id}: epoch {epoch} is not the current "
                                 f"{meta.epoch}: a newer producer session fenced this one")
        return meta

    def _touch(self, meta: TxnMetadata, connection: int) -> _Open:
        """Begin the transaction if it is not open yet; note who touched it."""
        now = self.clock()
        if not meta.is_open:
            self._last_instance += 1
            meta.instance = self._last_instance
            meta.move(TxnState.ONGOING)
            meta.started_ms = now
            meta.begin_version = self.offsets.last_version
            meta.partitions.clear()
            meta.groups.clear()
            meta.offsets.clear()
            meta.members.clear()
            meta.doomed = None
            data = PendingData(meta.instance, self.budget, self.stored,
                               self._doomer(meta, meta.instance))
            self._open[meta.transactional_id] = _Open(data,
                                                      newest_connection=self.newest_connection())
        meta.updated_ms = now
        opened = self._open[meta.transactional_id]
        opened.connections.add(connection)
        return opened

    def _put(self, meta: TxnMetadata, ops: Ops) -> None:
        ops.put(keys.txn_state_key(meta.transactional_id), meta.encode())
        self.partitions.put_unsaved(meta, ops)
        if meta.instance == self._last_instance:
            ops.put(_INSTANCE_KEY, self._last_instance.to_bytes(8, "big"))

    # ----------------------------------------- AddPartitionsToTxn / Offsets
    async def add_partitions(self, transactional_id: str, producer_id: int, epoch: int,
                             partitions: Iterable[TopicPartition],
                             connection: int = -1) -> None:
        """Register partitions in the transaction (beginning it if needed).

        The caller has checked that every partition exists.
        """
        async with self._lock(transactional_id):
            meta = self._current(transactional_id, producer_id, epoch)
            began = not meta.is_open
            self._touch(meta, connection)
            ops = Ops()
            # Only the partitions added are written (and the state record when
            # the transaction begins): the cost does not grow with the
            # transaction.
            added = self.partitions.add(meta, partitions, ops)
            if began or self.partitions.is_unsaved(meta):
                self._put(meta, ops)
            elif not added:
                return
            await self.writer.submit(ops)

    async def add_offsets(self, transactional_id: str, producer_id: int, epoch: int,
                          group: str, connection: int = -1) -> None:
        async with self._lock(transactional_id):
            meta = self._current(transactional_id, producer_id, epoch)
            self._touch(meta, connection)
            if group not in meta.groups:
                meta.groups.add(group)
                ops = Ops()
                self._put(meta, ops)
                await self.writer.submit(ops)

    # ------------------------------------------------------ TxnOffsetCommit
    async def txn_offset_commit(self, transactional_id: str, producer_id: int, epoch: int,
                                group: str, commits: Mapping[TopicPartition, OffsetCommit],
                                connection: int = -1, member: str = "") -> None:
        """Stage a group's offsets in the open transaction (written at commit).

        Raises TxnConflict when the offset-range check fails; the transaction
        is then doomed: it can only abort. The caller checked KIP-447's
        generation and member fences first; ``member`` names the member when
        the request carried one and the generation (else ""), which the
        check treats apart (``conflicts.py``), here and at EndTxn.
        """
        async with self._lock(transactional_id):
            meta = self._current(transactional_id, producer_id, epoch)
            if not meta.is_open or group not in meta.groups:
                raise InvalidTxnState(
                    f"{transactional_id}: group {group} was not added to a transaction "
                    "(AddOffsetsToTxn)")
            self._touch(meta, connection)
            members = dict.fromkeys(commits, member) if member else {}
            reason = meta.doomed or offset_conflict(self.offsets, group, commits,
                                                    meta.begin_version, transactional_id,
                                                    members)
            if reason is not None:
                await self._doom(meta, reason)
                raise TxnConflict(reason)
            staged = meta.offsets.setdefault(group, {})
            new = [tp for tp in commits if tp not in staged]
            staged.update(commits)
            fenced = meta.members.setdefault(group, {})
            for tp in commits:
                if member:
                    fenced[tp] = member
                else:
                    fenced.pop(tp, None)
            ops = Ops()
            self._put(meta, ops)
            await self.writer.submit(ops)
            self.offsets.hold_pending(group, new)

    async def _doom(self, meta: TxnMetadata, reason: str) -> None:
        if meta.doomed is None:
            self.stats.conflicts += 1
            log.warning("transaction %s (producer %d epoch %d) conflicts and can only abort: %s",
                        client_text(meta.transactional_id), meta.producer_id, meta.epoch, reason)
            meta.doomed = reason
            self._open[meta.transactional_id].data.refused = reason  # its batches too
            ops = Ops()
            self._put(meta, ops)
            await self.writer.submit(ops)

    def _doomer(self, meta: TxnMetadata, instance: int) -> Callable[[str, str], None]:
        """What dooms this transaction when one of its batches is refused for a
        pending-bytes limit. Called from the tablet's append (not under the
        id's lock): the doom is set at once and its write queued, and writes
        land in order, so every later change of the id keeps it."""

        def doom(limit: str, reason: str) -> None:
            if not meta.is_open or meta.instance != instance or meta.doomed is not None:
                return
            self.stats.over_limit[limit] += 1
            log.warning("transaction %s (producer %d epoch %d) can only abort: %s",
                        meta.transactional_id, meta.producer_id, meta.epoch, reason)
            meta.doomed = reason
            ops = Ops()
            self._put(meta, ops)
            # A failed write fails the store, and every later request with it.
            self.writer.submit(ops).add_done_callback(
                lambda done: done.cancelled() or done.exception())

        return doom

    # --------------------------------------------------------------- EndTxn
    async def end_txn(self, transactional_id: str, producer_id: int, epoch: int,
                      commit: bool, connection: int = -1) -> None:
        """Commit or abort the open transaction, in one store write.

        A retry of an EndTxn that completed succeeds again; one that does not
        match the outcome gets INVALID_TXN_STATE. Raises TxnConflict (after
        aborting) when a commit fails the offset-range check.
        """
        async with self._lock(transactional_id):
            meta = self._current(transactional_id, producer_id, epoch)
            done = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
            if not meta.is_open:
                if meta.state is done:
                    return  # a retry of an EndTxn that completed
                outcome = "commit" if commit else "abort"
                raise InvalidTxnState(f"{transactional_id}: EndTxn({outcome}) in state "
                                      f"{meta.state.value}")
            opened = self._open[transactional_id]
            if (connection not in opened.connections
                    and connection <= opened.newest_connection):
                self.stats.stale_end_txn += 1
                log.warning("%s: EndTxn from connection %d, which carried none of the open "
                            "transaction's requests and is older than it: a delayed request "
                            "of an earlier transaction, refused", client_text(transactional_id),
                            connection)
                raise InvalidTxnState(f"{transactional_id}: a delayed EndTxn of an earlier "
                                      "transaction cannot end this one")
            if commit and meta.doomed is None:
                # Batches of the transaction still being checked are part of
                # it: they will be acknowledged, so the commit must hold them.
                await opened.data.drain()
            reason = meta.doomed if commit else None
            if commit and reason is None:
                for group, commits in meta.offsets.items():
                    reason = offset_conflict(self.offsets, group, commits, meta.begin_version,
                                             transactional_id, meta.members.get(group))
                    if reason is not None:
                        break
                if reason is not None and meta.doomed is None:
                    self.stats.conflicts += 1
                    log.warning("transaction %s conflicts at commit and is aborted: %s",
                                client_text(transactional_id), reason)
            ops = Ops()
            if commit and reason is None:
                publish = self._stage_commit(meta, ops)
                meta.move(TxnState.COMPLETE_COMMIT)
                self.stats.commits += 1
            else:
                publish = self._stage_abort(
                    meta, ops, InvalidTxnState,
                    f"the transaction of {transactional_id} was aborted before this batch was "
                    "stored")
                meta.move(TxnState.COMPLETE_ABORT)
                self.stats.aborts += 1
            meta.updated_ms = self.clock()
            meta.doomed = None
            self._put(meta, ops)
            await self._write(ops, publish)
            if reason is not None:
                raise TxnConflict(reason)

    def _stage_commit(self, meta: TxnMetadata, ops: Ops) -> Callable[[], None]:
        """Add the whole commit to ``ops``; returns what publishes it once durable."""
        opened = self._open.pop(meta.transactional_id)
        opened.data.end(InvalidTxnState, f"the transaction of {meta.transactional_id} was "
                        "committed before this batch was stored")
        now = self.clock()
        marker = commit_marker(meta.producer_id, meta.epoch, now)
        publishers = []
        # Partitions deleted (and maybe recreated) while the transaction was
        # open are not in it any more.
        current = sorted(self.partitions.current(meta).items())
        self.partitions.drop(meta, ops)
        for (topic, index), tablet in current:
            # Blobs of a deleted topic were deleted with it, even when a topic
            # of the same name replaced it: the log must never name them.
            own = keys.TXN_BLOB + tablet.prefix
            blobs = [blob for blob in opened.data.blobs.get((topic, index), [])
                     if blob.key.startswith(own)]
            publishers.append(tablet.stage_commit(blobs, marker, ops))
        staged = {group: self.offsets.stage(group, commits, now, ops, meta.transactional_id,
                                            meta.members.get(group))
                  for group, commits in meta.offsets.items()}

        def publish() -> None:
            for each in publishers:
                each()
            for group, records in staged.items():
                self.offsets.publish(group, records)
                self.offsets.release_pending(group, records)
            opened.data.release()

        return publish

    def _stage_abort(self, meta: TxnMetadata, ops: Ops, error: type[TxnError],
                     message: str) -> Callable[[], None]:
        """Add the abort to ``ops``; a batch still in flight gets ``error``."""
        opened = self._open.pop(meta.transactional_id)
        opened.data.end(error, message)
        opened.data.abort(self._prefixes(meta), ops)
        self.partitions.drop(meta, ops)
        offsets = dict(meta.offsets)

        def publish() -> None:
            for group, commits in offsets.items():
                self.offsets.release_pending(group, commits)
            opened.data.release()

        return publish

    async def _write(self, ops: Ops, publish: Callable[[], None] | None) -> None:
        """Submit ``ops``; ``publish`` runs once they are durable, even when the
        request waiting for them is cancelled (its client went away): a staged
        end must still publish, and give back its memory and pending offsets."""
        done = self.writer.submit(ops)
        if publish is not None:
            done.add_done_callback(
                lambda fut: publish() if not fut.cancelled() and fut.exception() is None
                else None)
        await asyncio.shield(done)

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
        meta = self._current(transactional_id, producer_id, epoch)
        if meta.is_open and self._open[transactional_id].data.draining:
            raise ConcurrentTransactions(f"the transaction of {transactional_id} is being "
                                         "committed")
        if not meta.is_open or (topic, partition) not in meta.partitions:
            raise InvalidTxnState(f"{topic}-{partition} is not part of an open transaction of "
                                  f"{meta.transactional_id} (AddPartitionsToTxn first)")
        if not self.partitions.is_current(meta, (topic, partition)):
            raise InvalidTxnState(f"topic {topic} was deleted and recreated after "
                                  f"{meta.transactional_id} added {topic}-{partition}")
        opened = self._open[meta.transactional_id]
        opened.connections.add(connection)
        return opened.data.sink((topic, partition))

    # ---------------------------------------------------------- expiry
    async def expire(self) -> None:
        """Abort timed-out transactions (bumping the epoch, as Kafka does) and
        forget transactional ids idle for ``transactional.id.expiration.ms``."""
        now = self.clock()
        for meta in list(self.txns.values()):
            if meta.is_open and now - meta.started_ms > meta.timeout_ms:
                await self._time_out(meta)
            elif (not meta.is_open and now - meta.updated_ms > self.settings.id_expiration_ms
                  and not self._lock(meta.transactional_id).locked()):
                ops = Ops()
                ops.delete(keys.txn_state_key(meta.transactional_id))
                updated = meta.updated_ms
                await self.writer.submit(ops)
                # A request that used the id meanwhile wrote it again after
                # this deletion (writes land in order): it stays.
                if (self.txns.get(meta.transactional_id) is meta and not meta.is_open
                        and meta.updated_ms == updated):
                    meta.move(TxnState.DEAD)
                    del self.txns[meta.transactional_id]
                    self.ordered.discard(meta.transactional_id)
                    self._locks.pop(meta.transactional_id, None)

    async def _time_out(self, meta: TxnMetadata) -> None:
        async with self._lock(meta.transactional_id):
            if not meta.is_open or self.clock() - meta.started_ms <= meta.timeout_ms:
                return
            log.info("transaction %s (producer %d epoch %d) timed out after %d ms: aborted",
                     client_text(meta.transactional_id), meta.producer_id, meta.epoch,
                     meta.timeout_ms)
            ops = Ops()
            publish = self._stage_abort(
                meta, ops, ProducerFenced,
                f"the transaction of {meta.transactional_id} (producer {meta.producer_id} "
                f"epoch {meta.epoch}) timed out, was aborted and its producer fenced, before "
                "this batch was stored")
            self._bump_epoch(meta, ops, asked_by_current=False)
            meta.move(TxnState.COMPLETE_ABORT)
            meta.updated_ms = self.clock()
            self._put(meta, ops)
            self.stats.timeouts += 1
            self.stats.aborts += 1
            await self._write(ops, publish)

    # --------------------------------------------------- describing
    def describe(self, transactional_id: str) -> TxnMetadata:
        meta = self.txns.get(transactional_id)
        if meta is None:
            raise TransactionalIdNotFound(f"transactional id {transactional_id!r} is unknown")
        return meta

    def list(self, states: set[TxnState] | None = None,
             producer_ids: set[int] | None = None) -> list[TxnMetadata]:
        return [meta for meta in self.txns.values()
                if (not states or meta.state in states)
                and (not producer_ids or meta.producer_id in producer_ids)]

    @property
    def open_count(self) -> int:
        return len(self._open)

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
        opened = self._open.get(transactional_id)
        return None if opened is None else (opened.data.nbytes, opened.data.held)
