"""Helpers for the consumer-group tests: a gateway tuned for short rebalances,
polling until a condition holds, and the group as the gateway describes it.

Every wait is bounded: a group that never settles fails its test.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from kio.schema.describe_groups.v5 import request as describe_groups
from kio.schema.errors import ErrorCode
from kio.schema.offset_fetch.v8 import request as offset_fetch

from kafka_gateway.client import KafkaClient
from kafka_gateway.groups.consumer_protocol import assigned_partitions
from testkit.gateway import GatewayProcess
from testkit.routing import coordinator_client

T = TypeVar("T")

# Short enough for a fast suite, long enough for a loaded 2-core CI machine.
SESSION_TIMEOUT_MS = 6000
INITIAL_DELAY_MS = 300
WORKER = Path(__file__).with_name("group_worker.py")
PYTHON = sys.executable


@contextlib.contextmanager
def group_gateway(data_dir: Path, *extra: str) -> Iterator[GatewayProcess]:
    """A gateway whose new groups wait only INITIAL_DELAY_MS for more members."""
    with GatewayProcess(data_dir, "--group-initial-rebalance-delay-ms", str(INITIAL_DELAY_MS),
                        *extra) as gateway:
        yield gateway


def wait_for(condition: Callable[[], T], timeout: float, what: str,
             gateway: GatewayProcess | None = None, interval: float = 0.1) -> T:
    """Call ``condition`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            tail = f"\ngateway log tail:\n{gateway.output()[-4000:]}" if gateway else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}{tail}")
        time.sleep(interval)


def _run(gateway: GatewayProcess, coro_fn: Callable[[KafkaClient], object],
         group: str) -> object:
    """``coro_fn`` on a connection to ``group``'s coordinator, as FindCoordinator
    through ``gateway`` names it: the gateway itself, or another gateway of its
    cluster (``KAFKA_GATEWAY_TEST_STORE=postgresql-cluster``)."""

    async def main() -> object:
        client = await coordinator_client(gateway.host_port, group)
        try:
            return await coro_fn(client)  # type: ignore[misc]
        finally:
            await client.close()

    return asyncio.run(asyncio.wait_for(main(), 30))


def describe_group(gateway: GatewayProcess, group: str) -> dict:
    """{'state', 'protocol', 'members': {member_id: {'instance', 'client_id',
    'partitions': {(topic, partition), ...}}}} as DescribeGroups reports it."""

    async def describe(client: KafkaClient) -> dict:
        response = await client.request(describe_groups.DescribeGroupsRequest(
            groups=(group,), include_authorized_operations=False))
        described = response.groups[0]
        return {
            "state": described.group_state,
            "protocol": described.protocol_data,
            "members": {
                m.member_id: {
                    "instance": m.group_instance_id,
                    "client_id": m.client_id,
                    "partitions": {(t, p) for t, ps in
                                   (assigned_partitions(m.member_assignment) or {}).items()
                                   for p in ps},
                } for m in described.members
            },
        }

    return _run(gateway, describe, group)  # type: ignore[return-value]


def committed_offsets(gateway: GatewayProcess,
                      group: str) -> dict[tuple[str, int], tuple[int, str]]:
    """(topic, partition) -> (offset, metadata) of every offset the group committed."""

    async def fetch(client: KafkaClient) -> dict:
        response = await client.request(offset_fetch.OffsetFetchRequest(
            groups=(offset_fetch.OffsetFetchRequestGroup(group_id=group, topics=None),),
            require_stable=True))
        assert response.groups[0].error_code is ErrorCode.none, response.groups[0]
        return {(t.name, p.partition_index): (p.committed_offset, p.metadata)
                for t in response.groups[0].topics for p in t.partitions}

    return _run(gateway, fetch, group)  # type: ignore[return-value]


def stable_assignment(gateway: GatewayProcess, group: str, members: int,
                      partitions: set[tuple[str, int]], timeout: float = 30) -> dict:
    """Wait until the group is Stable with ``members`` members whose
    assignments split ``partitions`` exactly (each partition held once)."""

    def settled() -> dict | None:
        described = describe_group(gateway, group)
        held = [p for m in described["members"].values() for p in m["partitions"]]
        if (described["state"] == "Stable" and len(described["members"]) == members
                and sorted(held) == sorted(partitions)):
            return described
        return None

    return wait_for(settled, timeout, f"{group} stable with {members} members", gateway, 0.2)
