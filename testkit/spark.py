"""Spark in the tests: one local SparkSession per test process, with Spark's
Kafka connector for the installed pyspark resolved by Maven into the JVM cache
(``jvm.resolve(jvm.spark_pom(version))``), and the Kafka-side helpers the Spark
tests share.

Two PySpark lines cannot share one Python environment: the test command runs
the Spark tests once per line, each in its own interpreter (tests/run_all.sh:
PySpark 4 in the main environment, 3.5 in a virtualenv). It sets
``KAFKA_GATEWAY_EXPECT_PYSPARK`` to the version a run must have, and
``session()`` fails when the interpreter holds another one.

    spark = session()            # starts once, reused by every Spark test module
    records = read_topic(gw.bootstrap, "orders")
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from spark_jobs import session as spark_session
from testkit import jvm

# Small and quiet: two cores, shared with the gateway and the clients.
TEST_CONF = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.driver.memory": "1g",
    "spark.sql.streaming.stopTimeout": "60s",
    "spark.python.worker.reuse": "true",
}


@functools.cache
def session() -> Any:
    """The tests' SparkSession (local[2]), stopped when the process exits."""
    version = spark_session.spark_version()
    expected = os.environ.get("KAFKA_GATEWAY_EXPECT_PYSPARK")
    if expected and expected != version:
        raise RuntimeError(f"this run is for pyspark {expected}, but {sys.executable} "
                           f"imports pyspark {version} ({spark_session.spark_jars_dir()})")
    jvm.resolve(jvm.spark_pom(version))
    spark = spark_session.start("kafka-gateway-tests", master="local[2]", conf=TEST_CONF)
    atexit.register(spark.stop)
    return spark


@dataclass(frozen=True)
class Record:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: tuple[tuple[str, bytes], ...]


def read_topic(bootstrap: str, topic: str, isolation: str = "read_committed",
               timeout: float = 60.0) -> list[Record]:
    """Every record of ``topic`` up to its current end, in (partition, offset) order."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused",
                         "enable.auto.commit": False, "isolation.level": isolation,
                         "enable.partition.eof": True})
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=timeout)
                            .topics[topic].partitions)
        ends = {}
        for p in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p),
                                                       timeout=timeout)
            if high > low:
                ends[p] = high
        consumer.assign([TopicPartition(topic, p, 0) for p in ends])
        out: list[Record] = []
        open_parts = set(ends)
        deadline = time.monotonic() + timeout
        while open_parts:
            assert time.monotonic() < deadline, f"{topic}: still reading {open_parts}"
            message = consumer.poll(1.0)
            if message is None:
                continue
            if message.error():
                if message.error().code() == -191:  # _PARTITION_EOF
                    open_parts.discard(message.partition())
                    continue
                raise AssertionError(f"{topic}: {message.error()}")
            out.append(Record(message.partition(), message.offset(), message.key(),
                              message.value(), message.timestamp()[1],
                              tuple(message.headers() or ())))
            if message.offset() + 1 >= ends[message.partition()]:
                open_parts.discard(message.partition())
        return sorted(out, key=lambda r: (r.partition, r.offset))
    finally:
        consumer.close()


def produce(bootstrap: str, topic: str, values: Iterable[bytes], partition: int = 0,
            timestamps: Iterable[int] | None = None, transactional_id: str | None = None,
            abort: bool = False) -> None:
    """Produce ``values`` to one partition; in one transaction when given an id."""
    config = {"bootstrap.servers": bootstrap, "linger.ms": 5}
    if transactional_id:
        config["transactional.id"] = transactional_id
    producer = Producer(config)
    if transactional_id:
        producer.init_transactions(30)
        producer.begin_transaction()
    stamps = iter(timestamps) if timestamps is not None else None
    for value in values:
        extra = {"timestamp": next(stamps)} if stamps is not None else {}
        producer.produce(topic, value, partition=partition, **extra)
    # Sent before the end of the transaction: an abort would otherwise purge
    # what is still queued, and the broker would never see the aborted records.
    assert producer.flush(30) == 0
    if transactional_id:
        (producer.abort_transaction if abort else producer.commit_transaction)(30)



def partition_count(bootstrap: str, topic: str) -> int:
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=30)
    return len(metadata.topics[topic].partitions)


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offsets of ``topic`` (-1001 where none)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    try:
        return {tp.partition: tp.offset for tp in consumer.committed(
            [TopicPartition(topic, p) for p in range(partitions)], timeout=30)}
    finally:
        consumer.close()


def assert_resharded(bootstrap: str, source: str, target: str, group: str) -> list[Record]:
    """TARGET holds every committed record of SOURCE exactly once, keyed by its
    user id, in the partition Java's partitioner picks for that key, each source
    partition's records in their source order; GROUP holds, per source
    partition, the offset after its last record. Returns the target's records."""
    import json

    from kafka.partitioner.default import murmur2

    sources = read_topic(bootstrap, source)
    origin = {r.value: r for r in sources}
    assert len(origin) == len(sources), "source values must be unique"
    written = read_topic(bootstrap, target)
    assert sorted(r.value for r in written) == sorted(origin), "not exactly once"
    partitions = partition_count(bootstrap, target)
    last_seen: dict[tuple[int, int], int] = {}
    for record in written:
        user = json.loads(record.value)["user_id"].encode()
        assert record.key == user
        assert record.partition == (murmur2(user) & 0x7FFFFFFF) % partitions
        source_record = origin[record.value]
        order_key = (record.partition, source_record.partition)
        assert source_record.offset > last_seen.get(order_key, -1), "reordered"
        last_seen[order_key] = source_record.offset
    ends: dict[int, int] = {}
    for r in sources:
        ends[r.partition] = r.offset + 1
    source_partitions = partition_count(bootstrap, source)
    assert committed(bootstrap, group, source, source_partitions) == {
        p: ends.get(p, -1001) for p in range(source_partitions)}
    return written
