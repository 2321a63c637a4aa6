"""Raw connections to the broker that serves a request, as a client finds it:
the leader of a partition (Metadata) or the coordinator of a group
(FindCoordinator), asked through any broker. On one gateway (or Kafka's one
node) that is the broker asked; on a cluster
(``KAFKA_GATEWAY_TEST_STORE=postgresql-cluster``) it may be another.

    client = await leader_client(gw.host_port, "orders", 0)
    client = await coordinator_client(gw.host_port, "my-group")
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from kafka_gateway.client import KafkaClient
from testkit import kafka_requests as rq


async def leader_client(bootstrap: tuple[str, int], topic: str, partition: int) -> KafkaClient:
    """A connection to the partition's leader, as Metadata through ``bootstrap`` names it."""
    client = await KafkaClient.connect(*bootstrap)
    try:
        answer = await client.request(rq.metadata([topic]))
    finally:
        await client.close()
    [found] = answer.topics
    leaders = [p.leader_id for p in found.partitions if p.partition_index == partition]
    brokers = {b.node_id: (b.host, b.port) for b in answer.brokers}
    assert leaders and leaders[0] in brokers, (
        f"{topic}[{partition}] has no known leader in Metadata: {found}, brokers {brokers}")
    return await KafkaClient.connect(*brokers[leaders[0]])


async def coordinator_client(bootstrap: tuple[str, int], group: str) -> KafkaClient:
    """A connection to the group's coordinator, as FindCoordinator through
    ``bootstrap`` names it."""
    client = await KafkaClient.connect(*bootstrap)
    try:
        found = (await client.request(rq.find_coordinator([group]))).coordinators[0]
    finally:
        await client.close()
    assert found.error_code is ErrorCode.none, found
    return await KafkaClient.connect(found.host, found.port)
