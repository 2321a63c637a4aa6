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
to the open transaction of their producer id and epoch.

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

State is persisted with every change (``keys.TXN_STATE``), so after ``kill
-9`` an open transaction is still open and a completed one is complete.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from tablets import keys
from tablets.consumer_offsets import OffsetCommit, TopicPartition
from tablets.control import commit_marker
from tablets.engine import StorageEngine
from tablets.store import Ops
from tablets.tablet import now_ms

from .conflicts import offset_conflict
from .errors import (
    InvalidProducerIdMapping,
    InvalidTransactionTimeout,
    InvalidTxnState,
    ProducerFenced,
    TransactionalIdNotFound,
    TxnConflict,
)
from .pending import MemoryBudget, PartitionSink, PendingData
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


@dataclass(slots=True)
class TxnStats:
    """Counters for /metrics and the benchmark."""

    commits: int = 0
    aborts: int = 0
    timeouts: int = 0
    conflicts: int = 0
    fenced: int = 0
    stale_end_txn: int = 0


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
        self.stats = TxnStats()
        self.txns: dict[str, TxnMetadata] = {}
        self._by_producer: dict[int, TxnMetadata] = {}
        self._open: dict[str, _Open] = {}
        self._locks: dict[str, asyncio.Lock] = {}
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
            if meta.is_open:
                data = PendingData.recover(self.store, meta.instance, self.budget,
                                           self._prefixes(meta))
                self._open[meta.transactional_id] = _Open(data)
                for group, commits in meta.offsets.items():
                    self.offsets.hold_pending(group, commits)
        log.info("loaded %d transactional ids, %d open transactions", len(self.txns),
                 len(self._open))

    def _prefixes(self, meta: TxnMetadata) -> dict[TopicPartition, bytes]:
        """The key prefixes of the transaction's partitions that still exist."""
        return {tp: self.engine.partition(*tp).prefix for tp in meta.partitions
                if self.engine.has_partition(*tp)}

    def _register(self, meta: TxnMetadata) -> None:
        self.txns[meta.transactional_id] = meta
        self._by_producer[meta.producer_id] = meta

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
            publish = self._stage_abort(meta, ops) if meta.is_open else None
            self._bump_epoch(meta, ops, asked_by_current=producer_id >= 0)
            meta.timeout_ms = timeout_ms
            meta.move(TxnState.EMPTY)
            meta.updated_ms = now
            self._put(meta, ops)
            await self.writer.submit(ops)
            if publish is not None:
                publish()
            return meta.producer_id, meta.epoch

    def _bump_epoch(self, meta: TxnMetadata, ops: Ops, asked_by_current: bool) -> None:
        """A new epoch (or producer id). Only a bump the current session asked
        for itself (KIP-360) may be retried by it; a fence (a new session, a
        timeout) leaves no way back for the old epoch."""
        old_pid = meta.producer_id
        meta.last_producer_id = meta.producer_id
        meta.last_epoch = meta.epoch if asked_by_current else -1
        if meta.epoch >= EPOCH_EXHAUSTED:
            meta.producer_id, meta.epoch = self.ids.allocate(ops), 0
        else:
            meta.epoch += 1
        if meta.producer_id != old_pid:
            self._by_producer.pop(old_pid, None)
            self._by_producer[meta.producer_id] = meta

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
            self._open[meta.transactional_id] = _Open(PendingData(meta.instance, self.budget),
                                                      newest_connection=self.newest_connection())
        meta.updated_ms = now
        opened = self._open[meta.transactional_id]
        opened.connections.add(connection)
        return opened

    def _put(self, meta: TxnMetadata, ops: Ops) -> None:
        ops.put(keys.txn_state_key(meta.transactional_id), meta.encode())
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
            wanted = set(partitions)
            if meta.is_open and wanted <= meta.partitions:
                self._touch(meta, connection)
                return
            self._touch(meta, connection)
            meta.partitions |= wanted
            ops = Ops()
            self._put(meta, ops)
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
                        meta.transactional_id, meta.producer_id, meta.epoch, reason)
            meta.doomed = reason
            ops = Ops()
            self._put(meta, ops)
            await self.writer.submit(ops)

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
                            "of an earlier transaction, refused", transactional_id, connection)
                raise InvalidTxnState(f"{transactional_id}: a delayed EndTxn of an earlier "
                                      "transaction cannot end this one")
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
                                transactional_id, reason)
            ops = Ops()
            if commit and reason is None:
                publish = self._stage_commit(meta, ops)
                meta.move(TxnState.COMPLETE_COMMIT)
                self.stats.commits += 1
            else:
                publish = self._stage_abort(meta, ops)
                meta.move(TxnState.COMPLETE_ABORT)
                self.stats.aborts += 1
            meta.updated_ms = self.clock()
            meta.doomed = None
            self._put(meta, ops)
            await self.writer.submit(ops)
            publish()
            if reason is not None:
                raise TxnConflict(reason)

    def _stage_commit(self, meta: TxnMetadata, ops: Ops) -> Callable[[], None]:
        """Add the whole commit to ``ops``; returns what publishes it once durable."""
        opened = self._open.pop(meta.transactional_id)
        now = self.clock()
        marker = commit_marker(meta.producer_id, meta.epoch, now)
        publishers = []
        for topic, index in sorted(meta.partitions):
            if not self.engine.has_partition(topic, index):
                continue  # deleted while the transaction was open
            tablet = self.engine.partition(topic, index)
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

    def _stage_abort(self, meta: TxnMetadata, ops: Ops) -> Callable[[], None]:
        opened = self._open.pop(meta.transactional_id)
        opened.data.abort(self._prefixes(meta), ops)
        offsets = dict(meta.offsets)

        def publish() -> None:
            for group, commits in offsets.items():
                self.offsets.release_pending(group, commits)
            opened.data.release()

        return publish

    # -------------------------------------------------- transactional Produce
    def sink_for(self, producer_id: int, epoch: int, topic: str, partition: int,
                 connection: int = -1) -> PartitionSink:
        """Where a transactional batch of this producer for this partition goes.

        Raises unless the producer's transaction is open with this epoch and
        the partition was added to it (Kafka 3.4 would write such a batch
        into the log and leave a hanging transaction; KIP-890 refuses it too).
        """
        meta = self._by_producer.get(producer_id)
        if meta is None:
            raise InvalidProducerIdMapping(f"producer {producer_id} has no transactional id")
        if epoch != meta.epoch:
            self.stats.fenced += 1
            raise ProducerFenced(f"producer {producer_id} epoch {epoch} is fenced (current "
                                 f"{meta.epoch})")
        if not meta.is_open or (topic, partition) not in meta.partitions:
            raise InvalidTxnState(f"{topic}-{partition} is not part of an open transaction of "
                                  f"{meta.transactional_id} (AddPartitionsToTxn first)")
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
                    self._by_producer.pop(meta.producer_id, None)
                    self._locks.pop(meta.transactional_id, None)

    async def _time_out(self, meta: TxnMetadata) -> None:
        async with self._lock(meta.transactional_id):
            if not meta.is_open or self.clock() - meta.started_ms <= meta.timeout_ms:
                return
            log.info("transaction %s (producer %d epoch %d) timed out after %d ms: aborted",
                     meta.transactional_id, meta.producer_id, meta.epoch, meta.timeout_ms)
            ops = Ops()
            publish = self._stage_abort(meta, ops)
            self._bump_epoch(meta, ops, asked_by_current=False)
            meta.move(TxnState.COMPLETE_ABORT)
            meta.updated_ms = self.clock()
            self._put(meta, ops)
            await self.writer.submit(ops)
            publish()
            self.stats.timeouts += 1
            self.stats.aborts += 1

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
        return sum(opened.data.nbytes for opened in self._open.values())
