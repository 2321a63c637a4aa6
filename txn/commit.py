"""Ending a transaction: EndTxn, and the commit or abort staged in one store write.

EndTxn(commit) first waits for the transaction's batches still being checked
(``PendingData.drain``: they will be acknowledged, so the commit must hold
them), then re-checks its offsets (``conflicts.py``) in the same event-loop
step as it stages the commit: a log entry per blob at the end of each
partition, a COMMIT control batch after them, the transaction's consumer
offsets, and the state CompleteCommit, all in ONE write. An abort (EndTxn,
a fence by InitProducerId, a timeout) deletes the blobs and the partitions'
keys in one write. Either way what is in memory (the partitions' tails, the
visible offsets, the pending offsets, the memory budget) changes only once
the write is durable (``publish``).

In a cluster, offsets the group's coordinator staged for the transaction
(``remote_offsets.py``) are taken into the commit's write, under their
compare-and-set, and deleted by an abort. A commit the store refuses
(``CommitRefused``: offsets another commit claimed since) wrote nothing: it
is aborted instead and answered as a conflict (``TxnConflict``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from uuid import UUID

from common.logtext import client_text
from tablets.control import commit_marker
from tablets.errors import CommitRefused
from tablets.seam import AtomicChange, ChangeWriter, ConsumerOffsetStore, TopicPartition

from .conflicts import offset_conflict
from .errors import InvalidTxnState, TxnConflict, TxnError
from .open_transactions import OpenTransaction, OpenTransactions
from .partitions import TxnPartitions
from .pending_offsets import PendingOffsets
from .registry import TxnRegistry
from .remote_offsets import StagingStorage
from .remote_produce import RemoteTransactions
from .state import TxnMetadata, TxnState
from .stats import TxnStats

log = logging.getLogger(__name__)


class TxnCompletion:
    def __init__(self, registry: TxnRegistry, open_txns: OpenTransactions,
                 partitions: TxnPartitions, offsets: ConsumerOffsetStore,
                 pending_offsets: PendingOffsets, writer: ChangeWriter, stats: TxnStats,
                 clock: Callable[[], int]) -> None:
        self.registry = registry
        self.open_txns = open_txns
        self.partitions = partitions
        self.offsets = offsets
        self.pending_offsets = pending_offsets
        self.writer = writer
        self.stats = stats
        self.clock = clock
        storage = registry.storage
        self.staging = storage if isinstance(storage, StagingStorage) else None
        # A cluster's transactions whose batches other gateways store
        # (``remote_produce.py``); None: every batch is this coordinator's.
        self.remote: RemoteTransactions | None = None

    async def end_txn(self, meta: TxnMetadata, commit: bool, connection: int) -> None:
        """Commit or abort ``meta``'s open transaction, in one store write; the
        caller holds the id's lock and checked the producer's epoch.

        A retry of an EndTxn that completed succeeds again; one that does not
        match the outcome gets INVALID_TXN_STATE. Raises TxnConflict (after
        aborting) when a commit fails the offset-range check.
        """
        transactional_id = meta.transactional_id
        done = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
        if not meta.is_open:
            if meta.state is done:
                return  # a retry of an EndTxn that completed
            outcome = "commit" if commit else "abort"
            raise InvalidTxnState(f"{transactional_id}: EndTxn({outcome}) in state "
                                  f"{meta.state.value}")
        opened = self.open_txns.by_id[transactional_id]
        if (connection not in opened.connections
                and connection <= opened.newest_connection):
            self.stats.stale_end_txn += 1
            log.warning("%s: EndTxn from connection %d, which carried none of the open "
                        "transaction's requests and is older than it: a delayed request "
                        "of an earlier transaction, refused", client_text(transactional_id),
                        connection)
            raise InvalidTxnState(f"{transactional_id}: a delayed EndTxn of an earlier "
                                  "transaction cannot end this one")
        if commit and meta.abort_only is None:
            # Batches of the transaction still being checked are part of
            # it: they will be acknowledged, so the commit must hold them.
            await opened.data.drain()
        reason = meta.abort_only if commit else None
        if commit and reason is None:
            for group, commits in meta.offsets.items():
                reason = offset_conflict(self.offsets, group, commits, meta.begin_version,
                                         transactional_id, meta.members.get(group))
                if reason is not None:
                    break
            if reason is not None and meta.abort_only is None:
                self.stats.conflicts += 1
                log.warning("transaction %s conflicts at commit and is aborted: %s",
                            client_text(transactional_id), reason)
        ops = self.writer.begin()
        committing = commit and reason is None
        if committing:
            # What an abort needs, should the store refuse the commit.
            partitions = dict(meta.partitions)
            publish = self.stage_commit(meta, ops)
            meta.move(TxnState.COMPLETE_COMMIT)
            self.stats.commits += 1
        else:
            publish = self.stage_abort(
                meta, ops, InvalidTxnState,
                f"the transaction of {transactional_id} was aborted before this batch was "
                "stored")
            meta.move(TxnState.COMPLETE_ABORT)
            self.stats.aborts += 1
        meta.updated_ms = self.clock()
        meta.abort_only = None
        self.registry.put(meta, ops)
        try:
            await self.write(ops, publish)
        except CommitRefused as exc:
            if not committing:
                raise
            await self.abort_refused(meta, opened, partitions, str(exc))
            raise TxnConflict(str(exc)) from exc
        if reason is not None:
            raise TxnConflict(reason)

    async def abort_refused(self, meta: TxnMetadata, opened: OpenTransaction,
                            partitions: dict[TopicPartition, UUID | None], reason: str) -> None:
        """The store refused the commit of ``meta``'s transaction, so nothing
        of it was written: the transaction is still open there. Abort it."""
        self.stats.commits -= 1
        self.stats.conflicts += 1
        log.warning("the commit of %s was refused by the store and is aborted: %s",
                    client_text(meta.transactional_id), reason)
        meta.state = TxnState.ONGOING  # as stored: the commit did not land
        meta.partitions = partitions
        self.open_txns.by_id[meta.transactional_id] = opened
        ops = self.writer.begin()
        publish = self.stage_abort(
            meta, ops, InvalidTxnState,
            f"the transaction of {meta.transactional_id} was aborted before this batch was "
            "stored")
        meta.move(TxnState.COMPLETE_ABORT)
        meta.updated_ms = self.clock()
        meta.abort_only = None
        self.registry.put(meta, ops)
        await self.write(ops, publish)

    def stage_commit(self, meta: TxnMetadata, ops: AtomicChange) -> Callable[[], None]:
        """Add the whole commit to ``ops``; returns what publishes it once durable."""
        if self.remote is not None:  # first: the leaders' appends checked before are in
            self.remote.store.lock_txn(ops, meta.transactional_id)
        opened = self.open_txns.pop(meta.transactional_id)
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
            storage = self.registry.storage
            own = storage.log_ref(tablet)
            blobs = [blob for blob in opened.data.blobs.get((topic, index), [])
                     if storage.pending_log_ref(blob.key) == own]
            # The leader's batches first, stored before these when nothing
            # moved since this coordinator stored its first; else (a
            # partition it does not lead now, or one that or whose slot
            # moved since) all of them in the producer's sequence order, in
            # the store (``PgRemoteTxns.stage_remote_commit``).
            if self.remote is not None and self.remote.store.stage_remote_commit(
                    ops, tablet, meta.instance, meta.transactional_id, own=bool(blobs)):
                blobs = []
            publishers.append(storage.stage_commit(ops, tablet, blobs, marker))
        staged = {group: self.registry.storage.stage_offsets(
                      ops, group, commits, now, meta.transactional_id, meta.members.get(group))
                  for group, commits in meta.offsets.items()}
        if self.staging is not None and meta.groups:
            self.staging.take_staged_offsets(ops, meta.transactional_id, meta.producer_id,
                                             meta.epoch, now)

        def publish() -> None:
            for each in publishers:
                each()
            for group, records in staged.items():
                self.offsets.publish(group, records)
                self.pending_offsets.release(group, records)
            opened.data.release()

        return publish

    def stage_abort(self, meta: TxnMetadata, ops: AtomicChange, error: type[TxnError],
                    message: str) -> Callable[[], None]:
        """Add the abort to ``ops``; a batch still in flight gets ``error``."""
        if self.remote is not None:  # first, as a commit's
            self.remote.store.lock_txn(ops, meta.transactional_id)
        opened = self.open_txns.pop(meta.transactional_id)
        opened.data.end(error, message)
        opened.data.abort(self.partitions.prefixes(meta), ops)
        self.partitions.drop(meta, ops)
        if self.staging is not None and meta.groups:
            self.staging.discard_staged_offsets(ops, meta.transactional_id)
        offsets = dict(meta.offsets)

        def publish() -> None:
            for group, commits in offsets.items():
                self.pending_offsets.release(group, commits)
            opened.data.release()

        return publish

    async def write(self, ops: AtomicChange, publish: Callable[[], None] | None) -> None:
        """Submit ``ops``; ``publish`` runs once they are durable, even when the
        request waiting for them is cancelled (its client went away): a staged
        end must still publish, and give back its memory and pending offsets."""
        done = self.writer.commit(ops)
        if publish is not None:
            done.add_done_callback(
                lambda fut: publish() if not fut.cancelled() and fut.exception() is None
                else None)
        await asyncio.shield(done)
