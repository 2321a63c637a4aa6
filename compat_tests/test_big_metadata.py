"""Metadata for 200,000 partitions reaches a real client (issue 19, item 4).

Answers used to be written as one buffer per kio field: past about a million
buffers (120,000 partitions) the socket write failed and the connection closed
with no answer and no log line. Now every answer is written as buffers of about
64 KiB, and a refused write is logged and counted. librdkafka's ``list_topics()``
asks for every topic (Metadata v12 with no topic list) and must see them all.
"""

from __future__ import annotations

import asyncio
import time

from confluent_kafka.admin import AdminClient
from kio.schema.errors import ErrorCode

from kafka_gateway.client import KafkaClient
from testkit import kafka_requests as kr
from testkit import prom
from testkit.gateway import GatewayProcess

TOPICS, PARTITIONS = 20, 10_000  # the most partitions a topic may have
TIMEOUT = 120


async def create_topics(gateway: GatewayProcess) -> float:
    client = await KafkaClient.connect(*gateway.host_port)
    try:
        start = time.monotonic()
        # Two topics a request: each CreateTopics is answered well within its timeout.
        for first in range(0, TOPICS, 2):
            answer = await client.request(kr.create_topics(
                [(f"big-{i:02}", PARTITIONS) for i in range(first, first + 2)]))
            assert [t.error_code for t in answer.topics] == [ErrorCode.none] * 2
        return time.monotonic() - start
    finally:
        await client.close()


def test_metadata_for_200k_partitions_reaches_librdkafka(tmp_path):
    with GatewayProcess(tmp_path / "data", "--admin-listen", "127.0.0.1:0") as gateway:
        created_in = asyncio.run(create_topics(gateway))
        admin = AdminClient({"bootstrap.servers": gateway.bootstrap})
        start = time.monotonic()
        cluster = admin.list_topics(timeout=TIMEOUT)
        listed_in = time.monotonic() - start
        print(f"\ncreated {TOPICS * PARTITIONS} partitions in {created_in:.1f} s, "
              f"Metadata listed them in {listed_in:.1f} s")
        big = {name: topic for name, topic in cluster.topics.items() if name.startswith("big-")}
        assert sorted(big) == [f"big-{i:02}" for i in range(TOPICS)]
        assert all(topic.error is None and sorted(topic.partitions) == list(range(PARTITIONS))
                   for topic in big.values())
        assert sum(len(t.partitions) for t in big.values()) == 200_000
        del admin  # before the gateway stops: it would keep reconnecting
        metrics = gateway.metrics()
        assert prom.value(metrics, "kafka_gateway_response_write_failures_total") == 0
        assert "writing an answer" not in gateway.output()
