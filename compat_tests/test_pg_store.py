"""confluent-kafka (librdkafka) against a gateway on the PostgreSQL store
(``--store postgresql://...``, docs/cluster.md): produce (idempotent),
consume, a consumer group's commit, and everything still there after the
gateway restarts with another, empty data directory; a second gateway on the
same database fences the first one's Produce.
"""

from __future__ import annotations

import asyncio
import time

import asyncpg
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from kafka_gateway.client import KafkaClient
from testkit import kafka_requests as rq
from testkit import postgres
from testkit.batches import make_batch
from testkit.gateway import GatewayProcess
from testkit.postgres import PostgresServer

pg_server = postgres.server_fixture("module")
TIMEOUT = 30
TOPIC = "pg-e2e"
GROUP = "pg-e2e-group"


def consume(gateway: GatewayProcess, count: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": gateway.bootstrap, "group.id": GROUP,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([TOPIC])
    values: list[bytes] = []
    try:
        deadline = time.monotonic() + TIMEOUT
        while len(values) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            values.append(message.value())
        assert len(values) == count, f"consumed {len(values)} of {count}"
        consumer.commit(asynchronous=False)
        committed = consumer.committed([TopicPartition(TOPIC, p) for p in range(2)], TIMEOUT)
        ends = [consumer.get_watermark_offsets(TopicPartition(TOPIC, p), TIMEOUT)[1]
                for p in range(2)]
        positions = consumer.position([TopicPartition(TOPIC, p) for p in range(2)])
        assert [tp.offset for tp in committed] == ends, (committed, ends, positions)
    finally:
        consumer.close()
    return values


def produce(gateway: GatewayProcess, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": gateway.bootstrap, "enable.idempotence": True,
                         "linger.ms": 5})
    failures: list[object] = []
    for index, value in enumerate(values):
        producer.produce(TOPIC, value, key=b"%d" % index,
                         on_delivery=lambda err, _msg: err and failures.append(err))
    assert producer.flush(TIMEOUT) == 0
    assert failures == []


def test_confluent_kafka_produces_consumes_and_commits_on_the_postgresql_store(
        pg_server: PostgresServer, tmp_path) -> None:
    first = [b"first-%d" % i for i in range(300)]
    with GatewayProcess(tmp_path / "data-one", "--store", pg_server.dsn) as gateway:
        assert "PostgreSQL store" in gateway.output()
        admin = AdminClient({"bootstrap.servers": gateway.bootstrap})
        admin.create_topics([NewTopic(TOPIC, num_partitions=2,
                                      replication_factor=1)])[TOPIC].result(TIMEOUT)
        produce(gateway, first)
        assert sorted(consume(gateway, len(first))) == sorted(first)

    async def stored() -> int:
        conn = await asyncpg.connect(pg_server.dsn)
        try:
            return int(await conn.fetchval(
                "SELECT sum(log_end_offset) FROM kafka_gateway.partitions"))
        finally:
            await conn.close()

    assert asyncio.run(stored()) == len(first)
    assert not (tmp_path / "data-one").exists()  # nothing in the data directory

    # Another gateway process, another (empty) data directory: the records and
    # the group's committed offsets come from PostgreSQL.
    second = [b"second-%d" % i for i in range(20)]
    with GatewayProcess(tmp_path / "data-two", "--store", pg_server.dsn) as gateway:
        produce(gateway, second)
        assert sorted(consume(gateway, len(second))) == sorted(second)


def test_a_second_gateway_on_the_database_fences_the_first_one_s_produce(
        pg_server: PostgresServer, tmp_path) -> None:
    """Gateway processes, not the engine alone: the one started last claims
    every partition; the first one's Produce is answered NOT_LEADER_OR_FOLLOWER
    and stores nothing."""
    topic = "pg-fenced"

    async def produce_to(gateway: GatewayProcess, value: bytes) -> tuple[ErrorCode, int]:
        client = await KafkaClient.connect(*gateway.host_port)
        try:
            if value == b"create":
                await rq.create_topic(client, topic)
                return ErrorCode.none, -1
            answer = await rq.send_produce(client, topic, make_batch([value]))
            return answer.error_code, answer.base_offset
        finally:
            await client.close()

    with GatewayProcess(tmp_path / "data-first", "--store", pg_server.dsn) as first:
        asyncio.run(produce_to(first, b"create"))
        assert asyncio.run(produce_to(first, b"a")) == (ErrorCode.none, 0)
        with GatewayProcess(tmp_path / "data-second", "--store", pg_server.dsn) as second:
            assert asyncio.run(produce_to(first, b"b"))[0] is ErrorCode.not_leader_or_follower
            assert asyncio.run(produce_to(first, b"c"))[0] is ErrorCode.not_leader_or_follower
            assert asyncio.run(produce_to(second, b"d")) == (ErrorCode.none, 1)

    async def stored() -> int:
        conn = await asyncpg.connect(pg_server.dsn)
        try:
            return int(await conn.fetchval(
                "SELECT count(*) FROM kafka_gateway.batches b JOIN kafka_gateway.partitions p "
                "USING (log_id) JOIN kafka_gateway.topics t USING (topic_id) WHERE t.name = $1",
                topic))
        finally:
            await conn.close()

    assert asyncio.run(stored()) == 2  # a and d; nothing of b or c
