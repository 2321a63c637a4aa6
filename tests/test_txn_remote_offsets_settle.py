"""``RemoteOffsets.settle`` (txn/remote_offsets.py), against a store that
answers when the test lets it: two settles of one group at once (an
OffsetFetch's and a TxnOffsetCommit's) must not both release what the first
answer covers. Without one settle at a time, the second releases the
staging of the id's next transaction made meanwhile, and OffsetFetch with
require_stable would no longer see that partition as pending."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Mapping

from tablets.seam import AtomicChange, OffsetCommit, TopicPartition
from txn.pending_offsets import PendingOffsets
from txn.remote_offsets import RemoteOffsets, StagingStorage

TP = ("t", 0)


class GatedStore:
    """Stages in memory; ``settle_staged`` reads what is staged when called
    and answers once ``gate`` is set."""

    def __init__(self) -> None:
        self.staged: dict[str, set[str]] = {}  # group -> transactional ids
        self.gate = asyncio.Event()
        self.asked = 0

    async def stage_elsewhere(self, transactional_id: str, producer_id: int, epoch: int,
                              group: str, commits: Mapping[TopicPartition, OffsetCommit],
                              members: Mapping[TopicPartition, str] | None = None,
                              exempt: Collection[TopicPartition] = ()) -> None:
        self.staged.setdefault(group, set()).add(transactional_id)

    def take_staged_offsets(self, change: AtomicChange, transactional_id: str,
                            producer_id: int, epoch: int, now_ms: int) -> None:
        raise NotImplementedError  # not part of what is tested

    def discard_staged_offsets(self, change: AtomicChange, transactional_id: str) -> None:
        raise NotImplementedError

    async def settle_staged(self, group: str,
                            transactional_ids: Collection[str]) -> set[str]:
        still = set(self.staged.get(group, set()))
        self.asked += 1
        await self.gate.wait()
        return set(transactional_ids) - still

    def watch_staged(self, hook: Callable[[str, dict[str, list[TopicPartition]]], None],
                     ) -> dict[str, dict[str, list[TopicPartition]]]:
        return {}


def test_two_settles_at_once_release_each_staging_once() -> None:
    async def body() -> None:
        store = GatedStore()
        assert isinstance(store, StagingStorage)
        pending = PendingOffsets()
        remote = RemoteOffsets(store, pending)
        await remote.stage("tid", 1, 0, "g", {TP: OffsetCommit(5)})
        store.staged["g"].discard("tid")  # its transaction ended (committed)
        first = asyncio.ensure_future(remote.settle("g"))
        second = asyncio.ensure_future(remote.settle("g"))
        while store.asked < 1:
            await asyncio.sleep(0)
        for _ in range(20):  # the second settle runs as far as it can
            await asyncio.sleep(0)
        # The id's next transaction stages the partition again meanwhile.
        await remote.stage("tid", 1, 0, "g", {TP: OffsetCommit(9)})
        store.gate.set()
        await asyncio.gather(first, second)
        assert pending.is_pending("g", *TP), "the next transaction's staging was released"
        assert store.asked == 2  # the second asked after the first was answered
        assert remote.groups_settling == 0  # the group's lock went with its last settle

    asyncio.run(asyncio.wait_for(body(), 10))


def test_the_lock_of_a_group_lives_only_while_it_is_settled() -> None:
    """One lock per group being settled, not per group that ever staged: a
    thousand groups settled one after another leave none behind, and a
    settle that fails (the store unreachable) drops its lock too."""
    async def body() -> None:
        store = GatedStore()
        remote = RemoteOffsets(store, PendingOffsets())
        for i in range(1000):
            await remote.stage(f"tid{i}", 1, 0, f"g{i}", {TP: OffsetCommit(i)})
            store.staged[f"g{i}"].clear()
            settle = asyncio.ensure_future(remote.settle(f"g{i}"))
            while store.asked <= i:
                await asyncio.sleep(0)
            assert remote.groups_settling == 1  # the premise: it holds its lock
            store.gate.set()
            await settle
            store.gate.clear()
        assert remote.groups_settling == 0

        async def unreachable(group: str, transactional_ids: Collection[str]) -> set[str]:
            raise ConnectionError("store unreachable")

        await remote.stage("tid", 1, 0, "g", {TP: OffsetCommit(1)})
        store.settle_staged = unreachable  # type: ignore[method-assign]
        try:
            await remote.settle("g")
        except ConnectionError:
            pass
        else:
            raise AssertionError("the settle did not reach the failing store")
        assert remote.groups_settling == 0

    asyncio.run(asyncio.wait_for(body(), 30))
