"""The group coordinator over an engine that persists generations (several
gateways over PostgreSQL; kafka_gateway/groups/rebalance.py): a group starts
from the stored generation; members hear of a new generation only once it
is stored, and members arriving meanwhile join it; a failed write answers
NOT_COORDINATOR (the slot moved) or COORDINATOR_NOT_AVAILABLE and drops the
group; ``drop_groups`` forgets the groups of a lost slot.

The store of generations stands in for PostgreSQL's (its write can be held
and made to fail); the offsets are the embedded engine's.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from kio.schema.errors import ErrorCode

from kafka_gateway.groups import GroupCoordinator, GroupState, JoinRequest, JoinResult
from kafka_gateway.settings import GatewayConfig
from tablets import EngineSettings, StorageEngine
from tablets.errors import CoordinatorMoved, StorageError
from testkit.consumer_protocol import encode_assignment, encode_subscription

GROUP = "g"
INITIAL_DELAY_MS = 50


class StoredGenerations:
    """The embedded engine's offsets, with generations stored as a shared
    engine stores them: ``gate`` holds the write, ``fail`` makes it fail."""

    persists_generations = True

    def __init__(self, offsets: Any) -> None:
        self._offsets = offsets
        self.stored: dict[str, int] = {}
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail: BaseException | None = None
        self.writes = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._offsets, name)

    def generation(self, group: str) -> int:
        return self.stored.get(group, 0)

    async def next_generation(self, group: str, after: int) -> int:
        self.writes += 1
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        self.stored[group] = max(after, self.stored.get(group, 0)) + 1
        return self.stored[group]


def run(tmp_path, test: Callable[[GroupCoordinator, StoredGenerations], Awaitable[None]]) -> None:
    async def main() -> None:
        engine = StorageEngine(str(tmp_path), EngineSettings())
        engine.start(asyncio.get_running_loop())
        config = dataclasses.replace(GatewayConfig(),
                                     group_initial_rebalance_delay_ms=INITIAL_DELAY_MS,
                                     group_min_session_timeout_ms=10)
        store = StoredGenerations(engine.consumer_offsets)
        coordinator = GroupCoordinator(config, store)  # type: ignore[arg-type]
        assert coordinator.generations is store
        try:
            await asyncio.wait_for(test(coordinator, store), 20)
        finally:
            coordinator.stop()
            engine.close()

    asyncio.run(main())


def request(member_id: str = "") -> JoinRequest:
    return JoinRequest(GROUP, member_id, None, "client", "", "consumer",
                       [("range", encode_subscription(["t"]))], 3000, 1000, True)


async def join_new(coordinator: GroupCoordinator) -> asyncio.Future[JoinResult]:
    first = await coordinator.join_group(request())
    assert first.error is ErrorCode.member_id_required
    return asyncio.ensure_future(coordinator.join_group(request(first.member_id)))


async def synced(coordinator: GroupCoordinator, result: JoinResult) -> None:
    answer = await coordinator.sync_group(
        GROUP, result.generation_id, result.member_id, None, "consumer", result.protocol_name,
        {result.member_id: encode_assignment({"t": [0]})})
    assert answer.error is ErrorCode.none


def test_a_new_group_starts_from_the_stored_generation(tmp_path) -> None:
    async def test(coordinator: GroupCoordinator, store: StoredGenerations) -> None:
        store.stored[GROUP] = 7  # numbered by the group's previous coordinator
        result = await (await join_new(coordinator))
        assert (result.error, result.generation_id) == (ErrorCode.none, 8)
        assert store.stored[GROUP] == 8 and store.writes == 1
        await synced(coordinator, result)
        # Heartbeats write nothing.
        for _ in range(5):
            assert coordinator.heartbeat(GROUP, 8, result.member_id, None) is ErrorCode.none
        assert store.writes == 1

    run(tmp_path, test)


def test_members_hear_of_a_generation_only_once_it_is_stored(tmp_path) -> None:
    async def test(coordinator: GroupCoordinator, store: StoredGenerations) -> None:
        store.gate.clear()
        first = await join_new(coordinator)
        while store.writes == 0:  # the initial delay is over, the write held
            await asyncio.sleep(0.01)
        group = coordinator.groups[GROUP]
        assert group.numbering is not None
        assert group.state is GroupState.PREPARING_REBALANCE
        assert not first.done()
        second = await join_new(coordinator)  # arrives while the write is held
        await asyncio.sleep(0.05)
        assert not first.done() and not second.done() and store.writes == 1
        store.gate.set()
        results = [await first, await second]
        assert [r.generation_id for r in results] == [1, 1]
        assert {r.error for r in results} == {ErrorCode.none}
        leader = next(r for r in results if r.member_id == r.leader_id)
        assert len(leader.members) == 2
        assert store.stored[GROUP] == 1 and store.writes == 1

    run(tmp_path, test)


def test_a_generation_not_stored_drops_the_group(tmp_path) -> None:
    async def test(coordinator: GroupCoordinator, store: StoredGenerations) -> None:
        for failure, code in ((CoordinatorMoved("slot moved"), ErrorCode.not_coordinator),
                              (StorageError("connection lost"),
                               ErrorCode.coordinator_not_available)):
            store.fail = failure
            result = await (await join_new(coordinator))
            assert result.error is code, (failure, result)
            assert GROUP not in coordinator.groups
        store.fail = None
        result = await (await join_new(coordinator))
        assert (result.error, result.generation_id) == (ErrorCode.none, 1)

    run(tmp_path, test)


def test_a_lost_slot_drops_its_groups(tmp_path) -> None:
    async def test(coordinator: GroupCoordinator, store: StoredGenerations) -> None:
        result = await (await join_new(coordinator))
        await synced(coordinator, result)
        waiting = await join_new(coordinator)  # a rebalance in progress
        await asyncio.sleep(0.02)
        assert not waiting.done()
        coordinator.drop_groups(lambda group: group == "other")
        assert GROUP in coordinator.groups
        coordinator.drop_groups(lambda group: group == GROUP)
        assert GROUP not in coordinator.groups
        assert (await waiting).error is ErrorCode.not_coordinator
        assert coordinator.heartbeat(GROUP, 1, result.member_id, None) is (
            ErrorCode.unknown_member_id)
        # Gained back: from the stored generation (another coordinator's 4).
        store.stored[GROUP] = 4
        again = await (await join_new(coordinator))
        assert (again.error, again.generation_id) == (ErrorCode.none, 5)

    run(tmp_path, test)


def test_the_last_member_leaving_empties_the_group_at_once(tmp_path) -> None:
    """Kafka's group is Empty when its last LeaveGroup is answered, so a
    DeleteGroups right after it succeeds; no member hears of that empty
    generation, so it is not stored."""
    async def test(coordinator: GroupCoordinator, store: StoredGenerations) -> None:
        result = await (await join_new(coordinator))
        await synced(coordinator, result)
        assert store.writes == 1
        assert coordinator.leave_group(GROUP, [(result.member_id, None)]) == (
            ErrorCode.none, [ErrorCode.none])
        group = coordinator.groups[GROUP]
        assert (group.state, group.generation_id, store.writes) == (GroupState.EMPTY, 2, 1)
        # The next stored generation is above the empty one.
        again = await (await join_new(coordinator))
        assert (again.error, again.generation_id, store.stored[GROUP]) == (ErrorCode.none, 3, 3)

    run(tmp_path, test)


def test_the_last_member_leaving_while_its_generation_is_stored(tmp_path) -> None:
    """The write in flight is stale once the group is Empty: when it ends it
    starts no generation, even for a member that joined since."""
    async def test(coordinator: GroupCoordinator, store: StoredGenerations) -> None:
        store.gate.clear()
        first = await join_new(coordinator)
        while store.writes == 0:  # the write held
            await asyncio.sleep(0.01)
        group = coordinator.groups[GROUP]
        (member_id,) = group.members
        assert group.numbering is not None and group.state is GroupState.PREPARING_REBALANCE
        assert coordinator.leave_group(GROUP, [(member_id, None)]) == (
            ErrorCode.none, [ErrorCode.none])
        assert (await first).error is ErrorCode.unknown_member_id
        assert (group.state, group.numbering, group.generation_id) == (
            GroupState.EMPTY, None, 1)
        late = await join_new(coordinator)  # a new join phase, in its initial delay
        await asyncio.sleep(0.01)
        # The premise: the stale write is still held, and lands into the new
        # join phase (which it must not end).
        assert store.writes == 1 and not late.done()
        assert group.state is GroupState.PREPARING_REBALANCE and group.numbering is None
        store.gate.set()  # the stale write lands (1), then the new phase's (2)
        await asyncio.sleep(0)
        assert not late.done() and store.stored[GROUP] == 1
        result = await late
        assert (result.error, result.generation_id) == (ErrorCode.none, 2)
        assert store.writes == 2 and store.stored[GROUP] == 2
        assert coordinator.groups[GROUP].state is GroupState.COMPLETING_REBALANCE

    run(tmp_path, test)
