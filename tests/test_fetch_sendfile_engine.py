"""Consumers below the in-memory tail are served from segment files, end to end:
real producers and consumers (librdkafka) against a gateway whose tail holds
almost nothing, so nearly every batch fetched lies in a file.

- on a plaintext listener the record bytes leave with ``os.sendfile``
  (``kafka_gateway_sendfile_bytes_total``) and none is read into Python;
- on a TLS listener they are read to be encrypted
  (``kafka_gateway_file_region_read_bytes_total``) and none goes by sendfile;
- both consumers get every record, in order, byte for byte;
- a Fetch asking for more than the node's ``fetch.max.bytes`` gets at most
  that (as from Kafka): the index walk a read makes on the event loop is
  bounded by the node, not by what a client asks.
"""

from __future__ import annotations

import asyncio

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from kafka_gateway.client import KafkaClient
from testkit import kafka_requests as kr
from testkit.certs import make_pki
from testkit.inprocess import port_of, running

TOPIC = "files"
RECORDS = 3_000
VALUE = 1_024


def _produce(bootstrap: str, batch_size: int = 1_000_000) -> list[bytes]:
    values = [i.to_bytes(4, "big") * (VALUE // 4) for i in range(RECORDS)]
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                         "batch.size": batch_size})
    for value in values:
        producer.produce(TOPIC, value, partition=0)
    assert producer.flush(30) == 0
    return values


def _consume(config: dict[str, str | int]) -> list[bytes]:
    consumer = Consumer({"group.id": "files", "enable.auto.commit": False, **config})
    consumer.assign([TopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
    got: list[bytes] = []
    try:
        for _ in range(200):
            for message in consumer.consume(1_000, 0.5):
                assert message.error() is None, message.error()
                got.append(message.value())
            if len(got) >= RECORDS:
                break
    finally:
        consumer.close()
    return got


def test_consumers_below_the_tail_are_served_from_files(tmp_path):
    pki = make_pki(tmp_path / "pki")

    async def main() -> None:
        async with running(tmp_path, listeners="PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0",
                           ssl_keystore_location=str(pki.server),
                           tail_cache_bytes=64 << 10, num_partitions=1) as server:
            plain = f"127.0.0.1:{port_of(server, 'PLAINTEXT')}"
            secure = f"127.0.0.1:{port_of(server, 'SSL')}"
            metrics = server.broker.metrics
            values = await asyncio.to_thread(_produce, plain)
            total = RECORDS * VALUE

            got = await asyncio.to_thread(_consume, {"bootstrap.servers": plain})
            assert got == values
            # The premise: the tail held (almost) none of it, so the bytes came
            # from files, and went out by sendfile.
            assert metrics.sendfile_bytes > total * 0.9, (metrics.sendfile_bytes, total)
            assert metrics.file_region_read_bytes == 0
            by_sendfile = metrics.sendfile_bytes

            got = await asyncio.to_thread(_consume, {
                "bootstrap.servers": secure, "security.protocol": "SSL",
                "ssl.ca.location": str(pki.ca), "ssl.endpoint.identification.algorithm": "none"})
            assert got == values
            assert metrics.file_region_read_bytes > total * 0.9
            assert metrics.sendfile_bytes == by_sendfile

    asyncio.run(main())


def test_a_fetch_gets_at_most_the_nodes_fetch_max_bytes(tmp_path):
    cap = 64 << 10

    async def main() -> None:
        async with running(tmp_path, tail_cache_bytes=64 << 10, num_partitions=1,
                           fetch_max_bytes=cap) as server:
            bootstrap = f"127.0.0.1:{port_of(server, 'PLAINTEXT')}"
            # 3 MB in batches of at most 16 KiB: far more than the cap, from files.
            await asyncio.to_thread(_produce, bootstrap, 16 << 10)
            client = await KafkaClient.connect("127.0.0.1", port_of(server, "PLAINTEXT"))
            try:
                answer = await client.request(
                    kr.fetch(TOPIC, [(0, 0, 0x7FFFFFFF)], max_bytes=0x7FFFFFFF))
            finally:
                await client.close()
            [partition] = answer.responses[0].partitions
            assert partition.error_code.value == 0 and partition.high_watermark == RECORDS
            records = partition.records or b""
            # Whole batches up to the cap (each at most 16 KiB plus its overhead).
            assert cap - (20 << 10) < len(records) <= cap, len(records)

    asyncio.run(main())
