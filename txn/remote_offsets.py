"""TxnOffsetCommit for a transaction another gateway coordinates (a cluster
over PostgreSQL; docs/cluster-design.md, "Transactional offsets staged by
another gateway").

A Kafka client sends TxnOffsetCommit to the group's coordinator and EndTxn
to the transactional id's. When they are different gateways, the group's
coordinator (here) cannot check the transaction in memory: the storage
(``StagingStorage``) stages the offsets in the store, checking the id's
stored state in the same write, and the id's coordinator takes them into its
commit (``commit.py``), under the offsets' compare-and-set, or deletes them
with its abort. Until then they are pending here (``PendingOffsets``:
OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT for them);
``settle`` asks the store which of those transactions ended and reads the
group again when any did, so their offsets are visible here before anyone
is told. Offsets staged when the store read the group's offsets (at
start-up, or when this gateway gained the group's slot) are held the same
way (``seen``), whichever gateway staged them.

A refusal of the store, in Kafka's terms (the Java client's
TxnOffsetCommitHandler reacts to each):

- no such transactional id, or another producer id: INVALID_PRODUCER_ID_MAPPING;
- another epoch: ``ProducerFenced``, answered INVALID_PRODUCER_EPOCH as on one
  gateway (KIP-588 is not for TxnOffsetCommit);
- no open transaction, or AddOffsetsToTxn did not add the group:
  INVALID_TXN_STATE, as on one gateway;
- the offset-range check (``conflicts.py``), run by the store against the
  transaction's begin point (its instance: a row committed since is stamped
  at or above it), with its exceptions found here on the group's offsets in
  memory (``conflicts.moved_but_exempt``): ``TxnConflict``, answered
  ILLEGAL_GENERATION (abortable), as on one gateway;
- the group's slot moved: NOT_COORDINATOR.

The storage of the embedded engine has none of this: one gateway
coordinates everything, and ``StagingStorage`` is not implemented there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from tablets.errors import OffsetBehind, TxnStateMismatch
from tablets.seam import AtomicChange, OffsetCommit, TopicPartition

from .errors import InvalidProducerIdMapping, InvalidTxnState, ProducerFenced, TxnConflict
from .pending_offsets import PendingOffsets
from .state import TxnMetadata


@runtime_checkable
class StagingStorage(Protocol):
    """What a storage offers when gateways share it (``pgstore.txn_storage``)."""

    async def stage_elsewhere(self, transactional_id: str, producer_id: int, epoch: int,
                              group: str, commits: Mapping[TopicPartition, OffsetCommit],
                              members: Mapping[TopicPartition, str] | None = None,
                              exempt: Collection[TopicPartition] = ()) -> None: ...

    def take_staged_offsets(self, change: AtomicChange, transactional_id: str,
                            producer_id: int, epoch: int, now_ms: int) -> None: ...

    def discard_staged_offsets(self, change: AtomicChange, transactional_id: str) -> None: ...

    async def settle_staged(self, group: str,
                            transactional_ids: Collection[str]) -> set[str]: ...

    def watch_staged(self, hook: Callable[[str, dict[str, list[TopicPartition]]], None],
                     ) -> dict[str, dict[str, list[TopicPartition]]]: ...


def refusal(transactional_id: str, producer_id: int, epoch: int, group: str,
            state: bytes | None) -> Exception:
    """What a TxnOffsetCommit is answered when the id's stored ``state`` refused it."""
    meta = None if state is None else TxnMetadata.decode(transactional_id, state)
    if meta is None or meta.producer_id != producer_id:
        return InvalidProducerIdMapping(
            f"transactional id {transactional_id!r} is not mapped to producer {producer_id}")
    if meta.epoch != epoch:
        return ProducerFenced(f"{transactional_id}: epoch {epoch} is not the current "
                              f"{meta.epoch}: a newer producer session fenced this one")
    return InvalidTxnState(f"{transactional_id}: group {group} was not added to a transaction "
                           "(AddOffsetsToTxn)")


@dataclass(slots=True)
class _Settling:
    """One group's settle lock and how many settles hold or wait for it."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


class RemoteOffsets:
    """Offsets this gateway, a group's coordinator, staged for transactions
    that other gateways coordinate."""

    def __init__(self, storage: StagingStorage, pending: PendingOffsets) -> None:
        self.storage = storage
        self.pending = pending
        # group -> transactional id -> the partitions of each staging, held
        # in ``pending`` until the store says the transaction ended
        self.held: dict[str, dict[str, list[list[TopicPartition]]]] = {}
        # Offsets staged (here or on a gateway that coordinated the group
        # before) when the store read the offsets: held too.
        # A lock per group while a settle of it runs or waits (``settle``),
        # with how many do: dropped by the last, so the map holds only the
        # groups being settled, not every group that ever staged.
        self._settling: dict[str, _Settling] = {}
        for group, staged in storage.watch_staged(self.seen).items():
            self.seen(group, staged)

    def seen(self, group: str, staged: Mapping[str, list[TopicPartition]]) -> None:
        """The store read ``group``'s offsets and these staged ones with them:
        hold those of transactions not held yet."""
        held = self.held.setdefault(group, {})
        for transactional_id, partitions in staged.items():
            if transactional_id not in held:
                held[transactional_id] = [list(partitions)]
                self.pending.hold(group, partitions)
        if not held:
            del self.held[group]

    async def stage(self, transactional_id: str, producer_id: int, epoch: int, group: str,
                    commits: Mapping[TopicPartition, OffsetCommit],
                    members: Mapping[TopicPartition, str] | None = None,
                    exempt: Collection[TopicPartition] = ()) -> None:
        """Stage ``commits`` (``members``: the member of each member-fenced one; ``exempt``:
        those the offset-range check lets pass although committed since the
        transaction began: ``conflicts.moved_but_exempt``)."""
        try:
            await self.storage.stage_elsewhere(transactional_id, producer_id, epoch, group,
                                               commits, members, exempt)
        except TxnStateMismatch as exc:
            raise refusal(transactional_id, producer_id, epoch, group, exc.state) from exc
        except OffsetBehind as exc:
            raise TxnConflict(str(exc)) from exc
        self.held.setdefault(group, {}).setdefault(transactional_id, []).append(list(commits))
        self.pending.hold(group, commits)

    async def settle(self, group: str) -> None:
        """Release the offsets of transactions that ended (reading the group
        again first, so a commit's offsets are in memory). One settle of a
        group at a time (an OffsetFetch's, a TxnOffsetCommit's): two asking
        at once would both release what the first answer covers, the second
        then the next transaction's staging made meanwhile."""
        if not self.held.get(group):
            return
        settling = self._settling.setdefault(group, _Settling())
        settling.users += 1
        try:
            async with settling.lock:
                await self._settle(group)
        finally:
            settling.users -= 1
            if not settling.users:  # nobody holds or waits for it: the next makes a new one
                del self._settling[group]

    @property
    def groups_settling(self) -> int:
        """How many groups have a settle running or waiting."""
        return len(self._settling)

    async def _settle(self, group: str) -> None:
        held = self.held.get(group)
        if not held:
            return
        # Only the stagings made before the store is asked: one made while it
        # is asked may belong to the id's next transaction.
        asked = {transactional_id: len(stagings) for transactional_id, stagings in held.items()}
        for transactional_id in await self.storage.settle_staged(group, list(asked)):
            stagings = held.get(transactional_id, [])
            for partitions in stagings[:asked[transactional_id]]:
                self.pending.release(group, partitions)
            del stagings[:asked[transactional_id]]
            if not stagings:
                held.pop(transactional_id, None)
        if not held:
            self.held.pop(group, None)
