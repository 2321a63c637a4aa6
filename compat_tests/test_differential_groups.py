"""Differential: consumer group errors through raw requests, Apache Kafka 3.4.1 vs the gateway.

JoinGroup, SyncGroup, Heartbeat, OffsetCommit, LeaveGroup and DescribeGroups
driven by hand, one connection per member: unknown members, illegal
generations, a rebalance in progress (a second member joins while the first
is stable), a static member replaced by a new instance (the old one fenced),
bad session timeouts and protocols. Each member's requests carry the member
id its own server gave it; every response field is compared (member ids as
"<client or instance id>-<n-th id>", since both servers add a random UUID).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from differences import EXPECTED

from testkit import kafka_requests as rq
from testkit.differential import CLOSED
from testkit.server_pair import Pair, run_pair, unique_name

SERVERS = ("kafka", "gateway")
SESSION_MS, REBALANCE_MS = 60_000, 60_000


class Member:
    """One group member on both servers: its connection and its member ids."""

    def __init__(self, pair: Pair, group: str, client_id: str,
                 instance_id: str | None = None) -> None:
        self.pair = pair.member(client_id)
        self.group = group
        self.instance_id = instance_id
        self.ids = {s: "" for s in SERVERS}
        self.generation = {s: -1 for s in SERVERS}

    async def check(self, step: str, make: Callable[[str], Any]) -> tuple[Any, Any]:
        """``make(server)`` builds the request with that server's ids."""
        return await self.pair.check(step, make("kafka"), make("gateway"))

    async def join(self, step: str, **kwargs: Any) -> tuple[Any, Any]:
        answers = await self.check(step, lambda s: rq.join_group(
            self.group, self.ids[s], self.instance_id, session_timeout_ms=SESSION_MS,
            rebalance_timeout_ms=REBALANCE_MS, **kwargs))
        for server, answer in zip(SERVERS, answers, strict=True):
            if answer == CLOSED:  # compared and reported already
                continue
            if answer.member_id:
                self.ids[server] = answer.member_id
            if answer.error_code.value == 0:
                self.generation[server] = answer.generation_id
        return answers

    async def sync(self, step: str, assign: list[Member] | None = None,
                   generation: int | None = None, protocol: str | None = "range",
                   ) -> tuple[Any, Any]:
        return await self.check(step, lambda s: rq.sync_group(
            self.group, self.generation[s] if generation is None else generation, self.ids[s],
            self.instance_id, [(m.ids[s], m.pair.client_id.encode()) for m in assign or ()],
            protocol_type=protocol and "consumer", protocol_name=protocol))

    async def heartbeat(self, step: str, generation: int | None = None,
                        member_id: str | None = None) -> tuple[Any, Any]:
        return await self.check(step, lambda s: rq.heartbeat(
            self.group, self.generation[s] if generation is None else generation,
            self.ids[s] if member_id is None else member_id, self.instance_id))

    async def commit(self, step: str, topic: str, generation: int | None = None,
                     member_id: str | None = None) -> tuple[Any, Any]:
        return await self.check(step, lambda s: rq.offset_commit(
            self.group, self.generation[s] if generation is None else generation,
            self.ids[s] if member_id is None else member_id, topic, [(0, 1)],
            self.instance_id))

    async def leave(self, step: str) -> tuple[Any, Any]:
        return await self.check(step, lambda s: rq.leave_group(
            self.group, [(self.ids[s], self.instance_id)]))


async def _wait_for_state(pair: Pair, group: str, state: str, timeout: float = 30.0) -> None:
    """Poll DescribeGroups on both servers until the group is in ``state``."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        answers = await pair.send(rq.describe_groups([group]))
        if all(a.groups[0].group_state == state for a in answers):
            return
        assert asyncio.get_running_loop().time() < deadline, answers
        await asyncio.sleep(0.05)


async def _coordinator(pair: Pair) -> None:
    """Kafka creates its offsets topic on the first FindCoordinator and answers
    COORDINATOR_NOT_AVAILABLE until it is loaded (clients retry): wait for it,
    then compare the answers."""
    probe = rq.find_coordinator([unique_name("probe")])
    deadline = asyncio.get_running_loop().time() + 60
    while True:
        answers = await pair.send(probe)
        if all(a.coordinators[0].error_code.value == 0 for a in answers):
            break
        assert asyncio.get_running_loop().time() < deadline, answers
        await asyncio.sleep(0.1)
    await pair.check("group/find-coordinator", rq.find_coordinator(["a-group", "b-group"]))
    for version in range(4):
        await pair.check(f"group/find-coordinator-v{version}",
                         rq.find_coordinator(["a-group"], version=version))
    await pair.check("group/find-coordinator-bad-key-type",
                     rq.find_coordinator(["a-group"], key_type=5, version=3))


async def _rebalance_in_progress(pair: Pair, topic: str) -> None:
    group = unique_name("group")
    a, b = Member(pair, group, "member-a"), Member(pair, group, "member-b")
    await a.join("group/join-without-member-id")
    await a.join("group/join-first-member")  # waits group.initial.rebalance.delay.ms
    await a.sync("group/sync-without-protocol", assign=[a], protocol=None)
    await a.sync("group/sync-other-protocol", assign=[a], protocol="roundrobin")
    await a.sync("group/sync-leader", assign=[a])
    await pair.check("group/describe-stable", rq.describe_groups([group]))
    await a.heartbeat("group/heartbeat")
    await a.heartbeat("group/heartbeat-unknown-member", member_id="nobody")
    await a.heartbeat("group/heartbeat-old-generation", generation=0)
    await a.heartbeat("group/heartbeat-future-generation", generation=7)
    await a.commit("group/commit", topic)
    await a.commit("group/commit-illegal-generation", topic, generation=5)
    await a.commit("group/commit-unknown-member", topic, member_id="nobody")
    await a.commit("group/commit-no-generation", topic, generation=-1, member_id="")
    await a.sync("group/sync-illegal-generation", generation=9)
    await a.check("group/sync-unknown-member", lambda s: rq.sync_group(
        group, a.generation[s], "nobody", protocol_type="consumer", protocol_name="range"))
    await a.check("group/join-unknown-member", lambda s: rq.join_group(
        group, "nobody", session_timeout_ms=SESSION_MS, rebalance_timeout_ms=REBALANCE_MS))
    # A second member: its JoinGroup waits for the first to rejoin.
    await b.join("group/second-without-member-id")
    second = asyncio.create_task(b.join("group/second-joins"))
    await _wait_for_state(pair, group, "PreparingRebalance")
    await a.heartbeat("group/heartbeat-rebalance-in-progress")
    await a.commit("group/commit-rebalance-in-progress", topic)
    await a.sync("group/sync-rebalance-in-progress", assign=[a])
    await pair.check("group/describe-preparing", rq.describe_groups([group]))
    await a.join("group/first-rejoins")
    await second
    follower = asyncio.create_task(b.sync("group/sync-follower"))
    await a.sync("group/sync-leader-two", assign=[a, b])
    await follower
    await pair.check("group/describe-two-members", rq.describe_groups([group]))
    await b.heartbeat("group/heartbeat-second")
    await b.leave("group/leave-second")
    await a.heartbeat("group/heartbeat-after-leave")
    await b.heartbeat("group/heartbeat-left-member")
    await a.leave("group/leave-first")
    await pair.check("group/describe-empty", rq.describe_groups([group]))
    await a.commit("group/commit-after-leave", topic)
    await pair.check("group/offsets", rq.offset_fetch(group, topic, [0]))


async def _static_member_conflict(pair: Pair, topic: str) -> None:
    group = unique_name("static")
    first = Member(pair, group, "static-first", instance_id="instance-1")
    await first.join("static/join")  # a static member gets its id at once
    await first.sync("static/sync", assign=[first])
    second = Member(pair, group, "static-second", instance_id="instance-1")
    await second.join("static/same-instance-joins")  # replaces the first, fenced now
    await first.heartbeat("static/old-heartbeat-fenced")
    await first.commit("static/old-commit-fenced", topic)
    await first.sync("static/old-sync-fenced")
    await first.join("static/old-join-fenced")
    await second.heartbeat("static/new-heartbeat")
    await second.commit("static/new-commit", topic)
    await pair.check("static/describe", rq.describe_groups([group]))
    other = Member(pair, group, "static-other", instance_id="instance-2")
    await other.check("static/unknown-member-id-known-instance", lambda s: rq.join_group(
        group, "nobody-there", "instance-1", session_timeout_ms=SESSION_MS,
        rebalance_timeout_ms=REBALANCE_MS))
    await other.check("static/leave-by-instance", lambda s: rq.leave_group(
        group, [("", "instance-1")]))
    await other.check("static/leave-unknown-instance", lambda s: rq.leave_group(
        group, [("", "instance-9")]))
    await pair.check("static/describe-after-leave", rq.describe_groups([group]))


async def _bad_requests(pair: Pair, topic: str) -> None:
    group = unique_name("bad")
    loner = Member(pair, group, "loner")
    for version in (0, 1, 2, 3, 4):
        await loner.check(f"bad/heartbeat-unknown-group-v{version}", lambda s, v=version:
                          rq.heartbeat(group, 1, "nobody", version=v))
    await loner.check("bad/sync-unknown-group", lambda s: rq.sync_group(
        group, 1, "nobody", protocol_type="consumer", protocol_name="range"))
    await loner.check("bad/leave-unknown-group", lambda s: rq.leave_group(
        group, [("nobody", None)]))
    await loner.check("bad/commit-unknown-group-generation", lambda s: rq.offset_commit(
        group, 3, "nobody", topic, [(0, 1)]))
    await loner.check("bad/commit-simple-group", lambda s: rq.offset_commit(
        group, -1, "", topic, [(0, 1)]))
    await loner.check("bad/commit-unknown-partition", lambda s: rq.offset_commit(
        group, -1, "", topic, [(9, 1)]))
    missing = unique_name("nope")
    await loner.check("bad/commit-unknown-topic", lambda s: rq.offset_commit(
        group, -1, "", missing, [(0, 1)]))
    await pair.check("bad/describe-unknown", rq.describe_groups([unique_name("nope")]))
    cases = {
        "session-too-short": dict(session_timeout_ms=1000),
        "session-too-long": dict(session_timeout_ms=3_600_000),
        "no-protocols": dict(protocols=()),
        "empty-protocol-type": dict(protocol_type=""),
    }
    for label, kwargs in cases.items():
        await loner.check(f"bad/join-{label}", lambda s, kw=kwargs: rq.join_group(
            unique_name("j"), **{"rebalance_timeout_ms": REBALANCE_MS, **kw}))
    await loner.check("bad/join-empty-group-id", lambda s: rq.join_group(""))
    await loner.check("bad/describe-empty-group-id", lambda s: rq.describe_groups([""]))


def test_group_errors(kafka_broker, gateway):
    async def scenario(pair: Pair) -> None:
        topic = unique_name("offsets")
        await pair.create_topic("group/create-topic", topic)
        await _coordinator(pair)
        # Concurrently: each new group waits group.initial.rebalance.delay.ms once.
        await asyncio.gather(_rebalance_in_progress(pair, topic),
                             _static_member_conflict(pair, topic),
                             _bad_requests(pair, topic))

    run_pair(scenario, kafka_broker, gateway, EXPECTED)
