"""The group coordinator's state machine: joins, the initial delay, rebalance
and session timeouts, sync, static members, commit fences, offset expiry.

Timers are real but short (tens of milliseconds); every wait is bounded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable

import pytest
from kio.schema.errors import ErrorCode

from kafka_gateway.errors import code_of
from kafka_gateway.groups import (
    GroupCoordinator,
    GroupOffsets,
    GroupState,
    JoinRequest,
    JoinResult,
)
from kafka_gateway.settings import GatewayConfig
from tablets import EngineSettings, StorageEngine
from tablets.consumer_offsets import OffsetCommit
from testkit.consumer_protocol import encode_assignment, encode_subscription
from txn.pending_offsets import PendingOffsets

GROUP = "g"
SESSION_MS = 300
REBALANCE_MS = 400
INITIAL_DELAY_MS = 100


class Clock:
    """Wall-clock milliseconds, movable forward by tests of offset expiry."""

    def __init__(self) -> None:
        self.skew = 0

    def __call__(self) -> int:
        return time.time_ns() // 1_000_000 + self.skew


def run(tmp_path, test: Callable[[GroupCoordinator], Awaitable[None]], **settings) -> None:
    async def main() -> None:
        engine = StorageEngine(str(tmp_path), EngineSettings())
        engine.start(asyncio.get_running_loop())
        config = dataclasses.replace(
            GatewayConfig(), group_initial_rebalance_delay_ms=INITIAL_DELAY_MS,
            group_min_session_timeout_ms=10, **settings)
        assert engine.consumer_offsets is not None
        coordinator = GroupCoordinator(config, engine.consumer_offsets, Clock())
        try:
            await engine.create_topic("t", 4, {})
            await asyncio.wait_for(test(coordinator), 20)
        finally:
            coordinator.stop()
            engine.close()

    asyncio.run(main())


def offsets_of(coordinator: GroupCoordinator,
               pending: PendingOffsets | None = None) -> GroupOffsets:
    """The offsets half of the coordinator's groups (stateless but for its expiry loop)."""
    return GroupOffsets(coordinator.config, coordinator, coordinator.offsets, coordinator.clock,
                        pending)


def request(member_id: str = "", instance: str | None = None, topics: tuple[str, ...] = ("t",),
            protocols: tuple[str, ...] = ("range",), session_ms: int = SESSION_MS,
            rebalance_ms: int = REBALANCE_MS, client: str = "client") -> JoinRequest:
    metadata = encode_subscription(list(topics))
    return JoinRequest(GROUP, member_id, instance, client, "", "consumer",
                       [(name, metadata) for name in protocols], session_ms, rebalance_ms, True)


async def join_new(coordinator: GroupCoordinator, **kwargs) -> asyncio.Task[JoinResult]:
    """Go through MEMBER_ID_REQUIRED (or the static path) and start the real join."""
    if kwargs.get("instance") is None:
        first = await coordinator.join_group(request(**kwargs))
        assert first.error is ErrorCode.member_id_required
        kwargs["member_id"] = first.member_id
    return asyncio.ensure_future(coordinator.join_group(request(**kwargs)))


async def stable_group(coordinator: GroupCoordinator, count: int,
                       **kwargs) -> list[JoinResult]:
    """``count`` members joined and synced; the leader assigns partition i to member i."""
    joins = [await join_new(coordinator, **kwargs) for _ in range(count)]
    results = list(await asyncio.gather(*joins))
    await sync_all(coordinator, results)
    return results


async def sync_all(coordinator: GroupCoordinator, results: list[JoinResult]) -> list[bytes]:
    leader = next(r for r in results if r.member_id == r.leader_id)
    plan = {r.member_id: encode_assignment({"t": [i]}) for i, r in enumerate(leader.members)}
    syncs = [coordinator.sync_group(GROUP, r.generation_id, r.member_id, None, "consumer",
                                    r.protocol_name, plan if r is leader else {})
             for r in results]
    synced = await asyncio.gather(*syncs)
    assert all(s.error is ErrorCode.none for s in synced)
    return [s.assignment for s in synced]


def state(coordinator: GroupCoordinator) -> GroupState:
    return coordinator.groups[GROUP].state


def test_first_member_gets_its_generation_after_the_initial_delay(tmp_path):
    async def test(coordinator):
        loop = asyncio.get_running_loop()
        started = loop.time()
        join = await join_new(coordinator)
        await asyncio.sleep(0.02)
        assert state(coordinator) is GroupState.PREPARING_REBALANCE and not join.done()
        result = await join
        waited = loop.time() - started
        assert INITIAL_DELAY_MS / 1000 <= waited < REBALANCE_MS / 1000
        assert (result.error, result.generation_id, result.leader_id) == (
            ErrorCode.none, 1, result.member_id)
        assert result.protocol_name == "range"
        assert [m.member_id for m in result.members] == [result.member_id]
        assert state(coordinator) is GroupState.COMPLETING_REBALANCE
        (assignment,) = await sync_all(coordinator, [result])
        assert assignment == encode_assignment({"t": [0]})
        assert state(coordinator) is GroupState.STABLE
        assert coordinator.heartbeat(GROUP, 1, result.member_id, None) is ErrorCode.none

    run(tmp_path, test)


def test_members_arriving_during_the_initial_delay_share_one_generation(tmp_path):
    async def test(coordinator):
        first = await join_new(coordinator)
        await asyncio.sleep(INITIAL_DELAY_MS / 2000)
        second = await join_new(coordinator)
        results = await asyncio.gather(first, second)
        assert {r.generation_id for r in results} == {1}
        leader = next(r for r in results if r.members)
        assert len(leader.members) == 2

    run(tmp_path, test)


def test_pending_member_that_never_joins_expires(tmp_path):
    async def test(coordinator):
        first = await coordinator.join_group(request())
        assert first.error is ErrorCode.member_id_required
        assert first.member_id in coordinator.groups[GROUP].pending_members
        await asyncio.sleep(SESSION_MS / 1000 + 0.1)
        assert not coordinator.groups[GROUP].pending_members
        # Its id is no longer good for anything.
        late = await coordinator.join_group(request(member_id=first.member_id))
        assert late.error is ErrorCode.unknown_member_id

    run(tmp_path, test)


def test_rebalance_completes_as_soon_as_every_member_rejoined(tmp_path):
    async def test(coordinator):
        offsets = offsets_of(coordinator)
        a, b = await stable_group(coordinator, 2, rebalance_ms=10_000)
        newcomer = await join_new(coordinator, rebalance_ms=10_000)
        await asyncio.sleep(0.01)
        assert state(coordinator) is GroupState.PREPARING_REBALANCE
        # Existing members learn of the rebalance from their heartbeat...
        assert coordinator.heartbeat(GROUP, 1, a.member_id, None) is ErrorCode.rebalance_in_progress
        # ...commits of what they processed are still accepted...
        assert await offsets.commit_offsets(GROUP, 1, a.member_id, None,
                                                {("t", 0): OffsetCommit(5)}) is ErrorCode.none
        # ...and their SyncGroup of the old generation is refused.
        stale = await coordinator.sync_group(GROUP, 1, a.member_id, None, None, None, {})
        assert stale.error is ErrorCode.rebalance_in_progress
        rejoins = [asyncio.ensure_future(coordinator.join_group(
            request(member_id=r.member_id, rebalance_ms=10_000))) for r in (a, b)]
        results = await asyncio.wait_for(asyncio.gather(newcomer, *rejoins), 2)
        assert {r.generation_id for r in results} == {2}
        assert results[1].leader_id == a.member_id, "the leader stays the leader"
        # Old-generation requests are fenced now.
        assert coordinator.heartbeat(GROUP, 1, a.member_id, None) is ErrorCode.illegal_generation
        assert await offsets.commit_offsets(
            GROUP, 2, a.member_id, None, {("t", 0): OffsetCommit(6)}
        ) is ErrorCode.rebalance_in_progress  # joined, not yet synced

    run(tmp_path, test)


def test_in_a_stable_group_the_leaders_join_rebalances_and_a_followers_does_not(tmp_path):
    """Kafka's rule for a known member's JoinGroup in a Stable group
    (GroupCoordinator.doCurrentMemberJoinGroup): a follower whose protocols
    are unchanged gets its generation back, without a rebalance; the leader's
    always starts one (how a consumer's leader asks for a new assignment).
    kafka-python sends such a JoinGroup after a join that completed outside
    poll() (compat_tests/test_groups_kafka_python.py, PolledMember)."""
    async def test(coordinator):
        a, b = await stable_group(coordinator, 2)
        leader, follower = (a, b) if a.member_id == a.leader_id else (b, a)
        again = await coordinator.join_group(request(member_id=follower.member_id))
        assert (again.error, again.generation_id, again.leader_id, again.members) == (
            ErrorCode.none, 1, leader.member_id, [])
        assert state(coordinator) is GroupState.STABLE
        assert coordinator.heartbeat(GROUP, 1, follower.member_id, None) is ErrorCode.none

        leader_join = asyncio.ensure_future(
            coordinator.join_group(request(member_id=leader.member_id)))
        await asyncio.sleep(0.01)
        assert state(coordinator) is GroupState.PREPARING_REBALANCE
        assert coordinator.heartbeat(GROUP, 1, follower.member_id,
                                     None) is ErrorCode.rebalance_in_progress
        follower_join = await coordinator.join_group(request(member_id=follower.member_id))
        assert {(await leader_join).generation_id, follower_join.generation_id} == {2}

    run(tmp_path, test)


def test_member_that_does_not_rejoin_is_dropped_at_the_rebalance_timeout(tmp_path):
    async def test(coordinator):
        a, b = await stable_group(coordinator, 2, session_ms=5_000)
        newcomer = await join_new(coordinator, session_ms=5_000)
        rejoin = asyncio.ensure_future(coordinator.join_group(
            request(member_id=a.member_id, session_ms=5_000)))
        await asyncio.sleep(REBALANCE_MS / 2000)
        assert not rejoin.done(), "waits for b until the rebalance timeout"
        results = await asyncio.gather(newcomer, rejoin)
        assert {r.generation_id for r in results} == {2}
        assert b.member_id not in coordinator.groups[GROUP].members
        assert coordinator.heartbeat(GROUP, 2, b.member_id, None) is ErrorCode.unknown_member_id

    run(tmp_path, test)


def test_session_timeout_removes_a_silent_member_and_rebalances(tmp_path):
    async def test(coordinator):
        a, b = await stable_group(coordinator, 2)
        for _ in range(int(SESSION_MS * 1.5 / 50)):  # only a heartbeats
            await asyncio.sleep(0.05)
            code = coordinator.heartbeat(GROUP, 1, a.member_id, None)
            if code is ErrorCode.rebalance_in_progress:
                break
        assert code is ErrorCode.rebalance_in_progress
        assert b.member_id not in coordinator.groups[GROUP].members
        result = await coordinator.join_group(request(member_id=a.member_id))
        assert (result.generation_id, [m.member_id for m in result.members]) == (
            2, [a.member_id])

    run(tmp_path, test)


def test_members_that_never_sync_are_dropped(tmp_path):
    async def test(coordinator):
        joins = [await join_new(coordinator, session_ms=5_000) for _ in range(2)]
        a, b = await asyncio.gather(*joins)
        leader = a if a.members else b
        follower = b if leader is a else a
        await coordinator.sync_group(GROUP, 1, leader.member_id, None, None, None, {
            leader.member_id: b"L", follower.member_id: b"F"})
        assert state(coordinator) is GroupState.STABLE
        await asyncio.sleep(REBALANCE_MS / 1000 + 0.1)  # the follower never syncs
        assert follower.member_id not in coordinator.groups[GROUP].members
        assert state(coordinator) is GroupState.PREPARING_REBALANCE

    run(tmp_path, test)


def test_static_member_restart_keeps_assignment_and_fences_the_old_one(tmp_path):
    async def test(coordinator):
        offsets = offsets_of(coordinator)
        joins = [await join_new(coordinator, instance=i, session_ms=5_000) for i in ("x", "y")]
        results = list(await asyncio.gather(*joins))
        assignments = dict(zip((r.member_id for r in results),
                               await sync_all(coordinator, results), strict=True))
        old = results[0]
        back = await asyncio.wait_for(coordinator.join_group(
            request(instance="x", session_ms=5_000)), 1)
        assert back.error is ErrorCode.none
        assert back.generation_id == 1 and back.member_id != old.member_id
        assert state(coordinator) is GroupState.STABLE, "no rebalance"
        synced = await coordinator.sync_group(GROUP, 1, back.member_id, "x", None, None, {})
        assert synced.assignment == assignments[old.member_id]
        # The previous incarnation is fenced everywhere.
        assert coordinator.heartbeat(GROUP, 1, old.member_id, "x") is ErrorCode.fenced_instance_id
        assert await offsets.commit_offsets(GROUP, 1, old.member_id, "x", {
            ("t", 0): OffsetCommit(1)}) is ErrorCode.fenced_instance_id
        stale = await coordinator.join_group(request(member_id=old.member_id, instance="x"))
        assert stale.error is ErrorCode.fenced_instance_id
        # Leaving by instance id alone (LeaveGroup v3+).
        assert coordinator.leave_group(GROUP, [("", "x"), ("nobody", None)]) == (
            ErrorCode.none, [ErrorCode.none, ErrorCode.unknown_member_id])

    run(tmp_path, test)


def test_protocol_selection_and_inconsistent_protocols(tmp_path):
    async def test(coordinator):
        first = await join_new(coordinator, protocols=("cooperative-sticky", "range"))
        second = await join_new(coordinator, protocols=("range", "cooperative-sticky"))
        third = await join_new(coordinator, protocols=("cooperative-sticky",))
        results = await asyncio.gather(first, second, third)
        assert {r.protocol_name for r in results} == {"cooperative-sticky"}  # 2 votes to 1
        odd = await coordinator.join_group(request(protocols=("roundrobin",)))
        assert odd.error is ErrorCode.inconsistent_group_protocol
        bad_session = await coordinator.join_group(request(session_ms=5))
        assert bad_session.error is ErrorCode.invalid_session_timeout

    run(tmp_path, test)


def test_commit_fences(tmp_path):
    async def test(coordinator):
        offsets = offsets_of(coordinator)
        def commit(group, generation, member, instance=None):
            return offsets.commit_offsets(group, generation, member, instance,
                                              {("t", 1): OffsetCommit(3, 0, "m")})

        # assign()-based consumers: generation -1, no member, no group membership.
        assert await commit("simple", -1, "") is ErrorCode.none
        assert coordinator.offsets.committed("simple", "t", 1).metadata == "m"
        assert await commit("unknown", 4, "someone") is ErrorCode.illegal_generation
        (only,) = await stable_group(coordinator, 1)
        assert await commit(GROUP, -1, "") is ErrorCode.unknown_member_id  # group has members
        assert await commit(GROUP, 7, only.member_id) is ErrorCode.illegal_generation
        assert await commit(GROUP, 1, "stranger") is ErrorCode.unknown_member_id
        assert await commit(GROUP, 1, only.member_id) is ErrorCode.none
        assert await commit("bad\x00group", -1, "") is ErrorCode.invalid_group_id
        coordinator.leave_group(GROUP, [(only.member_id, None)])
        await asyncio.sleep(0)
        assert state(coordinator) is GroupState.EMPTY
        assert await commit(GROUP, -1, "") is ErrorCode.none  # empty again: allowed

    run(tmp_path, test)


def test_txn_commit_fences(tmp_path):
    """KIP-447's checks of a TxnOffsetCommit, as Kafka's handleTxnCommitOffsets
    makes them: a group it does not know is created empty (generation 0)."""

    async def test(coordinator):
        def fence(*args):  # the code of what it raises (errors.code_of)
            return code_of(coordinator.fence_txn_commit, *args)

        assert fence("unknown", -1, "", None) is ErrorCode.none  # no group metadata sent
        assert fence("unknown", 0, "", None) is ErrorCode.none
        assert fence("unknown", 4, "", None) is ErrorCode.illegal_generation
        assert fence("unknown", 4, "someone", None) is ErrorCode.unknown_member_id
        (only,) = await stable_group(coordinator, 1)
        assert fence(GROUP, -1, "", None) is ErrorCode.none
        assert fence(GROUP, 1, only.member_id, None) is ErrorCode.none
        assert fence(GROUP, 2, only.member_id, None) is ErrorCode.illegal_generation
        assert fence(GROUP, 1, "stranger", None) is ErrorCode.unknown_member_id

    run(tmp_path, test)


def test_require_stable_reports_offsets_a_transaction_holds(tmp_path):
    async def test(coordinator):
        pending = PendingOffsets()
        offsets = offsets_of(coordinator, pending)
        await offsets.commit_offsets(GROUP, -1, "", None, {("t", 0): OffsetCommit(9)})
        pending.hold(GROUP, [("t", 0)])
        wanted = [("t", 0), ("t", 1)]
        assert offsets.fetch_offsets(GROUP, wanted, require_stable=True)[("t", 0)] == (
            None, ErrorCode.unstable_offset_commit)
        committed, code = offsets.fetch_offsets(GROUP, wanted, require_stable=False)[("t", 0)]
        assert (committed.offset, code) == (9, ErrorCode.none)
        assert offsets.fetch_offsets(GROUP, wanted, True)[("t", 1)] == (None, ErrorCode.none)
        pending.release(GROUP, [("t", 0)])
        assert offsets.fetch_offsets(GROUP, None, True)[("t", 0)][1] is ErrorCode.none

    run(tmp_path, test)


def test_list_describe_delete(tmp_path):
    async def test(coordinator):
        offsets = offsets_of(coordinator)
        await stable_group(coordinator, 1)
        await offsets.commit_offsets("offsets-only", -1, "", None, {("t", 2): OffsetCommit(1)})
        assert coordinator.list_groups() == [(GROUP, "consumer", "Stable"),
                                             ("offsets-only", "", "Empty")]
        assert coordinator.list_groups(["EMPTY"]) == [("offsets-only", "", "Empty")]
        described = coordinator.describe(GROUP)
        assert (described.state, described.protocol_data) == ("Stable", "range")
        assert described.members[0].assignment == encode_assignment({"t": [0]})
        assert coordinator.describe("nope").state == "Dead"
        assert await offsets.delete_group(GROUP) is ErrorCode.non_empty_group
        assert await offsets.delete_group("nope") is ErrorCode.group_id_not_found
        assert await offsets.delete_group("offsets-only") is ErrorCode.none
        assert not coordinator.offsets.has_offsets("offsets-only")
        # OffsetDelete guards the topics a live consumer group subscribes to.
        assert offsets.check_offset_delete(GROUP) == (ErrorCode.none, {"t"})
        assert offsets.check_offset_delete("nope")[0] is ErrorCode.group_id_not_found

    run(tmp_path, test)


@pytest.mark.parametrize("members", [0, 1])
def test_offsets_expire_after_retention(tmp_path, members):
    async def test(coordinator):
        offsets = offsets_of(coordinator)
        retention_ms = coordinator.config.offsets_retention_minutes * 60_000
        member_id, generation = "", -1
        if members:  # a live group subscribed to "t"
            (only,) = await stable_group(coordinator, 1, session_ms=60_000)
            member_id, generation = only.member_id, 1
        code = await offsets.commit_offsets(
            GROUP, generation, member_id, None,
            {("t", 0): OffsetCommit(4), ("other", 0): OffsetCommit(2)})
        assert code is ErrorCode.none
        assert await offsets.expire_offsets() == 0
        coordinator.clock.skew = retention_ms + 1_000
        expired = await offsets.expire_offsets()
        remaining = set(coordinator.offsets.group_offsets(GROUP))
        if members:
            # A live group keeps the offsets of what it subscribes to.
            assert (expired, remaining) == (1, {("t", 0)})
            assert GROUP in coordinator.groups
        else:
            assert (expired, remaining) == (2, set())
            assert coordinator.list_groups() == []

    run(tmp_path, test, offsets_retention_minutes=1)


def test_client_chosen_names_reach_the_log_escaped_and_bounded(tmp_path, caplog):
    """A client id with a newline (member ids start with it) and a long reason make
    one bounded line each: no forged line."""
    caplog.set_level("INFO", logger="kafka_gateway.groups")
    client = "evil\nINFO kafka_gateway.groups: forged" + "x" * 100_000

    async def test(coordinator):
        (result,) = await stable_group(coordinator, 1, client=client)
        assert result.member_id.startswith(client)
        error, _each = coordinator.leave_group(GROUP, [(result.member_id, None)])
        assert error is ErrorCode.none

    run(tmp_path, test)
    messages = [record.getMessage() for record in caplog.records]
    mentions = [m for m in messages if "evil" in m]
    assert len(mentions) >= 3, messages  # joins, generation, leaves
    for message in mentions:
        assert "\n" not in message and "evil\\nINFO kafka_gateway.groups: forged" in message
        assert len(message) < 1000, message[:300]
