"""TxnOffsetCommit: a group's offsets staged in an open transaction, written
by its commit (``commit.py``).

The coordinator (``coordinator.py``) serves the request under the
transactional id's lock and checks that the id is coordinated here; this
module does the rest:

- ``here``: the transaction is coordinated by this gateway (always, on one
  gateway). KIP-447's generation and member fences were checked by the
  caller; the offset-range check (``conflicts.py``) runs on this gateway's
  memory, and a conflict makes the transaction abort-only (ILLEGAL_GENERATION,
  abortable); in a cluster, what other gateways committed of the offsets
  staged here is read first (``settle``). The offsets are held pending
  (``pending_offsets.py``) until the transaction ends.
- ``elsewhere``: in a cluster, this gateway coordinates the group and another
  the transaction: the offsets are staged in the store (``remote_offsets.py``).
- ``settle``: before the group's offsets are read, make visible what such
  transactions committed of what they staged here.
"""

from __future__ import annotations

from collections.abc import Mapping

from tablets.seam import ChangeWriter, ConsumerOffsetStore, OffsetCommit, TopicPartition

from .conflicts import moved_but_exempt, offset_conflict
from .errors import InvalidProducerIdMapping, InvalidTxnState, TxnConflict
from .open_transactions import OpenTransactions
from .pending_offsets import PendingOffsets
from .registry import TxnRegistry
from .remote_offsets import RemoteOffsets
from .state import TxnMetadata


class TxnOffsetCommits:
    def __init__(self, registry: TxnRegistry, open_txns: OpenTransactions,
                 offsets: ConsumerOffsetStore, pending_offsets: PendingOffsets,
                 writer: ChangeWriter, remote_offsets: RemoteOffsets | None) -> None:
        self.registry = registry
        self.open_txns = open_txns
        self.offsets = offsets
        self.pending_offsets = pending_offsets
        self.writer = writer
        # Offsets staged here for transactions other gateways coordinate.
        self.remote_offsets = remote_offsets

    async def here(self, meta: TxnMetadata, group: str,
                   commits: Mapping[TopicPartition, OffsetCommit], connection: int,
                   member: str) -> None:
        """Stage a group's offsets in the open transaction ``meta`` (written at
        commit).

        Raises TxnConflict when the offset-range check fails; the transaction
        is then abort-only. ``member`` names the member when the request
        carried one and the generation (else ""), which the check treats apart
        (``conflicts.py``), here and at EndTxn.
        """
        transactional_id = meta.transactional_id
        if not meta.is_open or group not in meta.groups:
            raise InvalidTxnState(
                f"{transactional_id}: group {group} was not added to a transaction "
                "(AddOffsetsToTxn)")
        self.open_txns.touch(meta, connection)
        # In a cluster, another gateway may have committed offsets it staged
        # here since: read them first, so that the check sees them and
        # refuses here, as one gateway does, not at the commit's
        # compare-and-set (a store query only while such offsets are held).
        await self.settle(group)
        members = dict.fromkeys(commits, member) if member else {}
        reason = meta.abort_only or offset_conflict(self.offsets, group, commits,
                                                    meta.begin_version, transactional_id,
                                                    members)
        if reason is not None:
            await self.open_txns.make_abort_only(meta, reason)
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
        ops = self.writer.begin()
        self.registry.put(meta, ops)
        await self.writer.commit(ops)
        self.pending_offsets.hold(group, new)

    async def elsewhere(self, transactional_id: str, producer_id: int, epoch: int, group: str,
                        commits: Mapping[TopicPartition, OffsetCommit],
                        member: str = "") -> None:
        """Stage a group's offsets, here its coordinator, for a transaction
        another gateway coordinates (``remote_offsets.py``). The caller
        checked KIP-447's generation and member fences first; ``member`` as
        for ``here``. The store runs the offset-range check against the
        transaction's begin point; its exceptions, which need the members
        this gateway keeps in memory, are found here."""
        if self.remote_offsets is None:
            raise InvalidProducerIdMapping(
                f"transactional id {transactional_id!r} is coordinated elsewhere, and this "
                "store cannot stage offsets for another coordinator")
        exempt = []
        for (topic, partition), commit in commits.items():
            current = self.offsets.latest(group, topic, partition)
            if current is not None and moved_but_exempt(current, commit, member,
                                                        transactional_id):
                exempt.append((topic, partition))
        await self.remote_offsets.stage(transactional_id, producer_id, epoch, group, commits,
                                        dict.fromkeys(commits, member) if member else {},
                                        exempt)

    async def settle(self, group: str) -> None:
        """Before the group's offsets are read: make visible what transactions
        coordinated elsewhere committed of what they staged here."""
        if self.remote_offsets is not None:
            await self.remote_offsets.settle(group)
