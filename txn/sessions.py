"""Producer sessions and their epochs: InitProducerId, fencing, expiry.

A transactional id's session is its (producer id, epoch). InitProducerId
begins a new one: it aborts the open transaction of the old session (in the
same write), bumps the epoch, fencing every older session (KIP-98), or moves
to a new producer id when the epoch is exhausted; a retry by the session
that asked for the last bump (KIP-360, v3+) gets the same answer again.
Every other request names its session and is checked first (``current``).

A transaction open past its timeout is aborted and its session fenced, as a
new InitProducerId would; an id idle for ``transactional.id.expiration.ms``
is forgotten (Kafka's Dead state).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from common.logtext import client_text
from tablets.errors import CoordinatorMoved, CounterMoved
from tablets.seam import AtomicChange, ChangeWriter

from .commit import TxnCompletion
from .errors import InvalidProducerIdMapping, InvalidTransactionTimeout, ProducerFenced
from .producer_ids import ProducerIds
from .registry import TxnRegistry
from .state import TxnMetadata, TxnState
from .stats import TxnSettings, TxnStats

log = logging.getLogger(__name__)
# A lost race on the shared producer-id counter is retried this many times
# (each loss teaches the gateway the stored value, so two gateways can only
# keep colliding while others allocate too).
_ALLOCATION_ATTEMPTS = 8

EPOCH_EXHAUSTED = 0x7FFF - 1  # Kafka moves to a new producer id at this epoch


class Sessions:
    def __init__(self, registry: TxnRegistry, completion: TxnCompletion, ids: ProducerIds,
                 writer: ChangeWriter, settings: TxnSettings, stats: TxnStats,
                 clock: Callable[[], int]) -> None:
        self.registry = registry
        self.completion = completion
        self.ids = ids
        self.writer = writer
        self.settings = settings
        self.stats = stats
        self.clock = clock
        # Raises NOT_COORDINATOR for an id not coordinated here (a cluster of
        # gateways: ``TransactionCoordinator.check_coordinates``).
        self.check_coordinates: Callable[[str], None] = lambda _transactional_id: None
        # Told of an id whose write the store refused for the coordinator's fence.
        self.refused: Callable[[str], None] = lambda _transactional_id: None

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
            return await self._first_session(None), 0
        if not 0 < timeout_ms <= self.settings.max_timeout_ms:
            raise InvalidTransactionTimeout(
                f"transaction timeout {timeout_ms} ms is not in (0, "
                f"{self.settings.max_timeout_ms}] (transaction.max.timeout.ms)")
        async with self.registry.lock(transactional_id):
            self.check_coordinates(transactional_id)
            meta = self.registry.txns.get(transactional_id)
            if meta is None:
                meta = TxnMetadata(transactional_id, -1, 0, timeout_ms)
                await self._first_session(meta)
                self.registry.register(meta)
                return meta.producer_id, meta.epoch
            ops = self.writer.begin()
            now = self.clock()
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
                publish = self.completion.stage_abort(
                    meta, ops, ProducerFenced,
                    f"{transactional_id}: producer {meta.producer_id} epoch {meta.epoch} was "
                    "fenced by InitProducerId, and its transaction aborted, before this batch "
                    "was stored")
            self._bump_epoch(meta, ops, asked_by_current=producer_id >= 0)
            meta.timeout_ms = timeout_ms
            meta.move(TxnState.EMPTY)
            meta.updated_ms = now
            self.registry.put(meta, ops)
            await self.completion.write(ops, publish)
            return meta.producer_id, meta.epoch

    async def _first_session(self, meta: TxnMetadata | None) -> int:
        """A fresh producer id, written with ``meta`` (a new transactional
        id's first state; None: an idempotent producer's id, alone). Gateways
        sharing a store share the counter: one that lost a race to another
        (``CounterMoved``: nothing written) has learnt the stored value, so it
        allocates again, rather than fail the client's InitProducerId with a
        storage error that librdkafka backs off from for a second."""
        for attempt in range(1, _ALLOCATION_ATTEMPTS + 1):
            ops = self.writer.begin()
            producer_id = self.ids.allocate(ops)
            if meta is not None:
                meta.producer_id, meta.updated_ms = producer_id, self.clock()
                self.registry.put(meta, ops)
            try:
                await self.writer.commit(ops)
                return producer_id
            except CounterMoved:
                if attempt == _ALLOCATION_ATTEMPTS:
                    raise
                log.info("producer id %d was taken by another gateway; allocating again",
                         producer_id)
        raise AssertionError("unreachable")

    def _bump_epoch(self, meta: TxnMetadata, ops: AtomicChange, asked_by_current: bool) -> None:
        """A new epoch (or producer id). Only a bump the current session asked
        for itself (KIP-360) may be retried by it; a fence (a new session, a
        timeout) leaves no way back for the old epoch."""
        meta.last_producer_id = meta.producer_id
        meta.last_epoch = meta.epoch if asked_by_current else -1
        if meta.epoch >= EPOCH_EXHAUSTED:
            meta.producer_id, meta.epoch = self.ids.allocate(ops), 0
        else:
            meta.epoch += 1

    def current(self, transactional_id: str, producer_id: int, epoch: int) -> TxnMetadata:
        """The id's state, if (producer id, epoch) is its current session."""
        meta = self.registry.txns.get(transactional_id)
        if meta is None or meta.producer_id != producer_id:
            raise InvalidProducerIdMapping(
                f"transactional id {transactional_id!r} is not mapped to producer {producer_id}")
        if epoch != meta.epoch:
            self.stats.fenced += 1
            raise ProducerFenced(f"{transactional_id}: epoch {epoch} is not the current "
                                 f"{meta.epoch}: a newer producer session fenced this one")
        return meta

    async def expire(self) -> None:
        """Abort timed-out transactions (bumping the epoch, as Kafka does) and
        forget transactional ids idle for ``transactional.id.expiration.ms``.
        Only ids in memory, which are those coordinated here."""
        now = self.clock()
        for meta in list(self.registry.txns.values()):
            if self.registry.txns.get(meta.transactional_id) is not meta:
                continue  # dropped meanwhile (its coordinator slot moved away)
            try:
                await self._expire_one(meta, now)
            except CoordinatorMoved as exc:  # the store's fence: another gateway's now
                log.info("transaction timeout or expiry not written: %s", exc)
                self.refused(meta.transactional_id)

    async def _expire_one(self, meta: TxnMetadata, now: int) -> None:
        if meta.is_open and now - meta.started_ms > meta.timeout_ms:
            await self._time_out(meta)
        elif (not meta.is_open and now - meta.updated_ms > self.settings.id_expiration_ms
              and not self.registry.lock(meta.transactional_id).locked()):
            ops = self.writer.begin()
            self.registry.storage.delete_txn_state(ops, meta.transactional_id)
            updated = meta.updated_ms
            await self.writer.commit(ops)
            # A request that used the id meanwhile wrote it again after
            # this deletion (writes land in order): it stays.
            if (self.registry.txns.get(meta.transactional_id) is meta and not meta.is_open
                    and meta.updated_ms == updated):
                meta.move(TxnState.DEAD)
                self.registry.forget(meta)

    async def _time_out(self, meta: TxnMetadata) -> None:
        async with self.registry.lock(meta.transactional_id):
            if (not meta.is_open or self.clock() - meta.started_ms <= meta.timeout_ms
                    or self.registry.txns.get(meta.transactional_id) is not meta):
                return
            log.info("transaction %s (producer %d epoch %d) timed out after %d ms: aborted",
                     client_text(meta.transactional_id), meta.producer_id, meta.epoch,
                     meta.timeout_ms)
            ops = self.writer.begin()
            publish = self.completion.stage_abort(
                meta, ops, ProducerFenced,
                f"the transaction of {meta.transactional_id} (producer {meta.producer_id} "
                f"epoch {meta.epoch}) timed out, was aborted and its producer fenced, before "
                "this batch was stored")
            self._bump_epoch(meta, ops, asked_by_current=False)
            meta.move(TxnState.COMPLETE_ABORT)
            meta.updated_ms = self.clock()
            self.registry.put(meta, ops)
            self.stats.timeouts += 1
            self.stats.aborts += 1
            await self.completion.write(ops, publish)
