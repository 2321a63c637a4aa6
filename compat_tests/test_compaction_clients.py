"""Every client reads a compacted topic from the earliest offset after
compaction, and sees only each key's newest value, at its own offset, with
the gaps compaction left; a record without a key is refused.

One topic, written once by confluent-kafka producers in every codec (keys
rewritten many times over, some deleted with tombstones), then a last
record of its own, the only batch of the active segment. The gateway's
cleaner looks every 100 ms; the module waits until a raw Fetch shows the
expected log (superseded records and the tombstones gone: the tombstones
take a second run, as delete.retention.ms=0 lets them go once stamped),
then each client reads it: confluent-kafka, kafka-python, aiokafka, kcat,
kafkajs and the Java client 3.4.1.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition as AioTopicPartition
from compaction_helpers import (
    EAGER,
    partition_metric,
    read_partition,
    rolls_after,
    values,
    wait_for,
)
from compat_helpers import create_topic, kcat
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from java_helpers import run_java
from kafka import KafkaConsumer
from kafka import TopicPartition as KpTopicPartition
from test_kafkajs import run_js

from testkit.gateway import GatewayProcess

TOPIC = "compacted"
KEYS = 30
ROUNDS = 12
DELETED = {"key-3", "key-7", "key-11"}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("compaction") / "data"
    with GatewayProcess(data_dir, "--log-cleaner-backoff-ms", "100",
                        "--admin-listen", "127.0.0.1:0") as gw:
        yield gw


@pytest.fixture(scope="module")
def expected(gateway) -> list[tuple[int, str, str | None]]:
    """Write the topic, wait for compaction; the (offset, key, value) every
    reader must see."""
    create_topic(gateway, TOPIC, configs=EAGER)
    model: dict[str, tuple[int, str | None]] = {}
    newest_stamp = 0

    def delivered(err, message):
        nonlocal newest_stamp
        assert err is None, err
        model[message.key().decode()] = (message.offset(), (
            None if message.value() is None else message.value().decode()))
        newest_stamp = max(newest_stamp, message.timestamp()[1])

    codecs = ["gzip", "snappy", "lz4", "zstd", "none"]
    for number in range(ROUNDS):
        producer = Producer({"bootstrap.servers": gateway.bootstrap, "linger.ms": 0,
                             "batch.num.messages": 7,
                             "compression.type": codecs[number % len(codecs)]})
        for key in range(KEYS):
            producer.produce(TOPIC, key=f"key-{key}", value=f"round-{number}-of-key-{key}",
                             on_delivery=delivered)
        if number == ROUNDS - 1:
            for key in sorted(DELETED):
                producer.produce(TOPIC, key=key, value=None, on_delivery=delivered)
        assert producer.flush(30) == 0
    rolls_after(newest_stamp)  # (the tombstones' segment must be cleanable)
    last = Producer({"bootstrap.servers": gateway.bootstrap})
    last.produce(TOPIC, key="last", value="the active segment", on_delivery=delivered)
    assert last.flush(30) == 0
    want = sorted((offset, key, value) for key, (offset, value) in model.items()
                  if value is not None)

    read: list[tuple[int, str, str | None]] = []

    def compacted():
        read[:] = values(read_partition(gateway, TOPIC)[0])
        return read == want

    try:
        wait_for(compacted, 60, "fully compacted log", gateway)
    except AssertionError as exc:
        batches = read_partition(gateway, TOPIC)[1]
        raise AssertionError(
            f"{exc}\nread, not wanted: {sorted(set(read) - set(want))}"
            f"\nwanted, not read: {sorted(set(want) - set(read))}"
            f"\nbatches (base offset, control, records): {batches}"
            f"\ncleaner runs: {partition_metric(gateway, 'partition_runs_total', TOPIC)}") from None
    assert partition_metric(gateway, "partition_runs_total", TOPIC) >= 2
    assert partition_metric(gateway, "clean_offset", TOPIC) == want[-1][0]
    assert len(want) == KEYS - len(DELETED) + 1
    return want


def test_a_record_without_a_key_is_refused(gateway, expected):
    producer = Producer({"bootstrap.servers": gateway.bootstrap})
    errors = []
    producer.produce(TOPIC, value=b"no key", on_delivery=lambda err, _m: errors.append(err))
    producer.flush(30)
    assert [e.code() for e in errors] == [KafkaError.INVALID_RECORD]
    assert values(read_partition(gateway, TOPIC)[0]) == expected


def test_confluent_kafka_reads_only_the_newest_values(gateway, expected):
    consumer = Consumer({"bootstrap.servers": gateway.bootstrap, "group.id": "confluent",
                        "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(TOPIC, 0, 0)])  # offset 0: now a gap
        got = []
        while len(got) < len(expected):
            message = consumer.poll(30)
            assert message is not None and message.error() is None, message
            got.append((message.offset(), message.key().decode(), message.value().decode()))
    finally:
        consumer.close()
    assert got == expected


def test_kafka_python_reads_only_the_newest_values(gateway, expected):
    consumer = KafkaConsumer(bootstrap_servers=gateway.bootstrap, enable_auto_commit=False,
                             consumer_timeout_ms=30_000)
    try:
        tp = KpTopicPartition(TOPIC, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        got = []
        for record in consumer:
            got.append((record.offset, record.key.decode(), record.value.decode()))
            if len(got) == len(expected):
                break
    finally:
        consumer.close()
    assert got == expected


def test_aiokafka_reads_only_the_newest_values(gateway, expected):
    async def read():
        consumer = AIOKafkaConsumer(bootstrap_servers=gateway.bootstrap,
                                    enable_auto_commit=False)
        await consumer.start()
        try:
            tp = AioTopicPartition(TOPIC, 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            got = []
            while len(got) < len(expected):
                batches = await consumer.getmany(tp, timeout_ms=1000)
                got += [(r.offset, r.key.decode(), r.value.decode())
                        for r in batches.get(tp, [])]
            return got
        finally:
            await consumer.stop()

    assert asyncio.run(asyncio.wait_for(read(), 60)) == expected


def test_kcat_reads_only_the_newest_values(gateway, expected):
    done = kcat(gateway, "-C", "-t", TOPIC, "-o", "beginning", "-e", "-J")
    got = [(m["offset"], m["key"], m["payload"])
           for m in map(json.loads, done.stdout.decode().splitlines())]
    assert got == expected


def test_kafkajs_reads_only_the_newest_values(gateway, expected):
    result = run_js(gateway, "consume.js", TOPIC, "earliest", str(len(expected)))
    assert [(m["offset"], m["key"], m["value"]) for m in result["received"]] == expected


def test_java_client_reads_only_the_newest_values(gateway, expected, java_classes):
    lines = run_java(gateway, java_classes, "ConsumeCheck", "dump", "--topic", TOPIC)
    [marks] = [line for line in lines if line.get("op") == "watermarks"]
    assert (marks["start"], marks["end"]) == (0, expected[-1][0] + 1)
    assert [(r["offset"], r["key"], r["value"]) for r in lines if "offset" in r] == expected
