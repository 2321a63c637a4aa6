"""Raw connections to the broker that serves a request, as a client finds it:
the leader of a partition (Metadata) or the coordinator of a group or
transactional id (FindCoordinator), asked through any broker. On one gateway
(or Kafka's one node) that is the broker asked; on a cluster
(``KAFKA_GATEWAY_TEST_STORE=postgresql-cluster``) it may be another.

    client = await leader_client(gw.host_port, "orders", 0)
    client = await coordinator_client(gw.host_port, "my-group")
    client = await coordinator_client(gw.host_port, "my-txn", key_type=TRANSACTION)
    node, host, port = await coordinator_of(gw.host_port, "my-group")
"""

from __future__ import annotations

import asyncio
import time

from kio.schema.errors import ErrorCode

from kafka_gateway.client import KafkaClient
from testkit import kafka_requests as rq

GROUP = 0  # FindCoordinator's key types
TRANSACTION = 1

Broker = tuple[int, str, int]  # node id, host, port
LEADERLESS_S = 30.0  # how long a partition may have no leader (placement after a start)


async def leader_of(bootstrap: tuple[str, int], topic: str, partition: int,
                    timeout: float = LEADERLESS_S) -> Broker:
    """The partition's leader, as Metadata through ``bootstrap`` names it.
    While it names none (LEADER_NOT_AVAILABLE: a cluster just started or
    restarted, its leaders still being placed), it asks again, as clients
    do, for up to ``timeout`` seconds, then fails with what it saw."""
    deadline = time.monotonic() + timeout
    client = await KafkaClient.connect(*bootstrap)
    try:
        while True:
            answer = await client.request(rq.metadata([topic]))
            [found] = answer.topics
            leaders = [p.leader_id for p in found.partitions if p.partition_index == partition]
            brokers = {b.node_id: (b.host, b.port) for b in answer.brokers}
            if leaders and leaders[0] in brokers:
                return int(leaders[0]), *brokers[leaders[0]]
            assert time.monotonic() < deadline, (
                f"{topic}[{partition}] has no known leader in Metadata after {timeout} s: "
                f"{found}, brokers {brokers}")
            await asyncio.sleep(0.1)
    finally:
        await client.close()


async def coordinator_of(bootstrap: tuple[str, int], key: str, key_type: int = GROUP) -> Broker:
    """The coordinator of a group (or, with ``key_type=TRANSACTION``, of a
    transactional id), as FindCoordinator through ``bootstrap`` names it."""
    client = await KafkaClient.connect(*bootstrap)
    try:
        found = (await client.request(rq.find_coordinator([key], key_type))).coordinators[0]
    finally:
        await client.close()
    assert found.error_code is ErrorCode.none, found
    return int(found.node_id), found.host, found.port


async def leader_client(bootstrap: tuple[str, int], topic: str, partition: int) -> KafkaClient:
    """A connection to the partition's leader, as Metadata through ``bootstrap`` names it."""
    _, host, port = await leader_of(bootstrap, topic, partition)
    return await KafkaClient.connect(host, port)


async def coordinator_client(bootstrap: tuple[str, int], key: str,
                             key_type: int = GROUP) -> KafkaClient:
    """A connection to the coordinator of a group (or transactional id), as
    FindCoordinator through ``bootstrap`` names it."""
    _, host, port = await coordinator_of(bootstrap, key, key_type)
    return await KafkaClient.connect(host, port)
