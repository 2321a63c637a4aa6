"""kill -9 of one gateway of a cluster while the others carry on, with its
premises checked, and the gateway started again: the cluster's fault of the
exactly-once chaos check (compat_tests/reshard_chaos.py).

    view = cluster_view(gateway.members[0], ["orders"], ["group"], ["txn-id"])
    outage = kill_one(gateway, victim, ["orders"], ["group"], ["txn-id"])
    rejoin_s = start_again(gateway, victim)

``kill_one`` asserts that the fault landed: the victim led partitions of the
topics (or coordinated a key) before; its pid is gone after; every survivor's
Metadata then lists exactly the survivors, and names a survivor as the leader
of every partition and (FindCoordinator) the coordinator of every key.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from kafka_gateway.client import KafkaClient
from testkit import kafka_requests as rq
from testkit import pg_store_mode
from testkit.gateway import GatewayProcess

TIMEOUT = 60.0


@dataclass
class View:
    """What one gateway answers: the brokers, each partition's leader, and
    each key's coordinator (None while it has none: an error answered)."""

    brokers: set[int]
    leaders: dict[tuple[str, int], int]
    coordinators: dict[str, int | None]


@dataclass
class Outage:
    """One gateway killed: its node, what it served, and the failover."""

    node: int
    pid: int
    led: list[tuple[str, int]]
    coordinated: list[str]
    failover_s: float
    after: View


def node_of(gateway: GatewayProcess) -> int:
    return pg_store_mode.node_id(gateway.extra_args)


def cluster_view(gateway: GatewayProcess, topics: Sequence[str], groups: Sequence[str],
                 transactional_ids: Sequence[str]) -> View:
    """Metadata and FindCoordinator (groups, then transactional ids) of one gateway."""
    async def ask() -> View:
        client = await KafkaClient.connect(*gateway.host_port)
        try:
            meta = await client.request(rq.metadata(list(topics)))
            coordinators: dict[str, int | None] = {}
            for key_type, keys in ((0, groups), (1, transactional_ids)):
                if keys:
                    found = await client.request(rq.find_coordinator(keys, key_type=key_type))
                    for entry in found.coordinators:
                        coordinators[entry.key] = (int(entry.node_id) if entry.error_code
                                                   is ErrorCode.none else None)
        finally:
            await client.close()
        leaders = {(t.name, p.partition_index): int(p.leader_id)
                   for t in meta.topics for p in t.partitions}
        return View({int(b.node_id) for b in meta.brokers}, leaders, coordinators)

    return asyncio.run(asyncio.wait_for(ask(), TIMEOUT))


def stable_offsets(gateway: GatewayProcess, group: str, topic: str,
                   partitions: int) -> dict[int, str]:
    """A group's committed offsets as a read_committed consumer asks for them
    (OffsetFetch with require_stable, KIP-447) of the group's coordinator:
    partition -> offset, or the error (UNSTABLE_OFFSET_COMMIT while an open
    transaction holds it). For the failure message of a stalled run."""
    async def ask() -> dict[int, str]:
        client = await KafkaClient.connect(*gateway.host_port)
        try:
            found = (await client.request(rq.find_coordinator([group]))).coordinators[0]
        finally:
            await client.close()
        if found.error_code is not ErrorCode.none:
            return {-1: f"FindCoordinator: {found.error_code.name}"}
        client = await KafkaClient.connect(found.host, found.port)
        try:
            request = dataclasses.replace(rq.offset_fetch(group, topic, range(partitions)),
                                          require_stable=True)
            answer = await client.request(request)
        finally:
            await client.close()
        [group_answer] = answer.groups
        out = {-1: f"node {found.node_id}: {group_answer.error_code.name}"}
        for t in group_answer.topics:
            for p in t.partitions:
                out[p.partition_index] = (str(p.committed_offset) if p.error_code
                                          is ErrorCode.none else p.error_code.name)
        return out

    return asyncio.run(asyncio.wait_for(ask(), TIMEOUT))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def kill_one(cluster: GatewayProcess, victim: GatewayProcess, topics: Sequence[str],
             groups: Sequence[str], transactional_ids: Sequence[str],
             during: Callable[[], None] | None = None, timeout: float = TIMEOUT) -> Outage:
    """kill -9 ``victim`` (a member of ``cluster``), call ``during`` (the
    clients' work while it is dead), and wait until every survivor serves
    everything it served; fail loudly with the views otherwise."""
    members = cluster.members
    assert victim in members and len(members) > 1, "kill_one needs a cluster member"
    survivors = [m for m in members if m is not victim]
    live = {node_of(m) for m in survivors}
    node = node_of(victim)
    before = cluster_view(survivors[0], topics, groups, transactional_ids)
    led = sorted(tp for tp, leader in before.leaders.items() if leader == node)
    coordinated = sorted(k for k, owner in before.coordinators.items() if owner == node)
    assert led or coordinated, f"node {node} serves nothing of {topics}, {groups}: {before}"
    assert victim.process is not None and victim.process.poll() is None, "victim not running"
    pid = victim.process.pid
    victim.kill_alone()
    killed_at = time.monotonic()
    assert victim.process.returncode == -signal.SIGKILL, victim.process.returncode
    assert not _alive(pid), f"node {node}'s pid {pid} is still there"
    if during is not None:
        during()
    views: list[View] = []
    last_error: object = None
    while True:
        try:
            views = [cluster_view(m, topics, groups, transactional_ids) for m in survivors]
        except (OSError, TimeoutError) as error:  # a survivor busy: ask again
            views, last_error = [], error
        if views and all(
                v.brokers == live and set(v.leaders.values()) <= live
                and len(v.leaders) == len(before.leaders)
                and all(owner in live for owner in v.coordinators.values())
                for v in views):
            break
        if time.monotonic() - killed_at > timeout:
            raise AssertionError(
                f"node {node} killed: the survivors {sorted(live)} did not take its "
                f"partitions {led} and keys {coordinated} in {timeout} s; their views: "
                f"{views or last_error}")
        time.sleep(0.2)
    return Outage(node, pid, led, coordinated, time.monotonic() - killed_at, views[0])


def start_again(cluster: GatewayProcess, victim: GatewayProcess,
                timeout: float = TIMEOUT) -> float:
    """Start a killed member again; seconds until every member lists all of them."""
    started_at = time.monotonic()
    victim.start_alone()
    members = cluster.members
    pg_store_mode.check_cluster([m.host_port for m in members],
                                {node_of(m) for m in members}, timeout)
    return time.monotonic() - started_at
