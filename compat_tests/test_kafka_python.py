"""kafka-python (3.0) against the gateway: admin, produce, consume, offsets, restarts.

Consumers use assign()/seek with no group (group_id=None) and commit nothing;
producers keep kafka-python's defaults, idempotence included. Every wait is bounded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, NewPartitions, NewTopic
from kafka.admin._configs import AlterConfigOp
from kafka.consumer.fetcher import ConsumerRecord
from kafka.errors import (
    InvalidConfigurationError,
    MessageSizeTooLargeError,
    TopicAlreadyExistsError,
)

from testkit.gateway import GatewayProcess

CODECS = {None: 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}  # name -> batch attribute
TIMEOUT_S = 30.0
DEFAULT_MAX_MESSAGE_BYTES = 1048588
MIB = 1 << 20


# --------------------------------------------------------------------- helpers
@contextmanager
def admin_client(gateway: GatewayProcess) -> Iterator[KafkaAdminClient]:
    admin = KafkaAdminClient(bootstrap_servers=gateway.bootstrap, request_timeout_ms=20000)
    try:
        yield admin
    finally:
        admin.close()


@contextmanager
def producer(gateway: GatewayProcess, **config: Any) -> Iterator[KafkaProducer]:
    config = {"acks": "all", "request_timeout_ms": 20000, "max_block_ms": 20000, **config}
    prod = KafkaProducer(bootstrap_servers=gateway.bootstrap, **config)
    try:
        yield prod
    finally:
        prod.close(timeout=10)


@contextmanager
def consumer(gateway: GatewayProcess, **config: Any) -> Iterator[KafkaConsumer]:
    config = {"group_id": None, "enable_auto_commit": False, "request_timeout_ms": 30000,
              "auto_offset_reset": "earliest", **config}
    cons = KafkaConsumer(bootstrap_servers=gateway.bootstrap, **config)
    try:
        yield cons
    finally:
        cons.close(autocommit=False)


def create_topic(admin: KafkaAdminClient, name: str, partitions: int = 1,
                 configs: dict[str, str] | None = None) -> None:
    result = admin.create_topics([NewTopic(name, partitions, 1, topic_configs=configs or {})])
    (topic,) = result["topics"]
    assert topic["error_code"] == 0, topic
    assert topic["num_partitions"] == partitions


def read_to_end(cons: KafkaConsumer, ends: dict[TopicPartition, int],
                timeout: float = TIMEOUT_S) -> list[ConsumerRecord]:
    """Poll until every partition's position reaches its end offset."""
    out: list[ConsumerRecord] = []
    deadline = time.monotonic() + timeout
    while any(cons.position(tp) < end for tp, end in ends.items()):
        assert time.monotonic() < deadline, (
            f"read {len(out)} records; positions "
            f"{ {tp: cons.position(tp) for tp in ends} } never reached {ends}"
        )
        for records in cons.poll(timeout_ms=500).values():
            out.extend(records)
    return out


def fields(records: list[ConsumerRecord]) -> list[tuple]:
    """What a record carries, for exact comparison."""
    return [(r.partition, r.offset, r.key, r.value, list(r.headers)) for r in records]


# ----------------------------------------------------------------------- tests
def test_admin_creates_topic_with_partitions_and_configs(gateway, topic_name):
    """create_topics honours partitions and configs; duplicates and bad configs are errors."""
    with admin_client(gateway) as admin:
        create_topic(admin, topic_name, 3, {"retention.ms": "3600000",
                                            "max.message.bytes": "2097152"})
        (described,) = admin.describe_topics([topic_name])
        assert described["error_code"] == 0
        assert sorted(p["partition_index"] for p in described["partitions"]) == [0, 1, 2]
        # Each led by a broker the test started (node 0, or one of a cluster's three).
        assert {p["leader_id"] for p in described["partitions"]} <= set(gateway.nodes())

        configs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic_name)])
        overrides = configs["topic"][topic_name]  # the default filter: modified only
        assert {k: (v["value"], v["config_source"]) for k, v in overrides.items()} == {
            "retention.ms": ("3600000", "DYNAMIC_TOPIC_CONFIG"),
            "max.message.bytes": ("2097152", "DYNAMIC_TOPIC_CONFIG"),
        }

        with pytest.raises(TopicAlreadyExistsError):
            admin.create_topics([NewTopic(topic_name, 1, 1)])
        with pytest.raises(InvalidConfigurationError):
            admin.create_topics([NewTopic(topic_name + "-bad", 1, 1,
                                          topic_configs={"retention.ms": "soon"})])
        assert topic_name + "-bad" not in admin.list_topics()

        admin.create_partitions({topic_name: NewPartitions(total_count=5)})
        (described,) = admin.describe_topics([topic_name])
        assert len(described["partitions"]) == 5

        doomed = topic_name + "-doomed"
        create_topic(admin, doomed)
        admin.delete_topics([doomed])
        assert doomed not in admin.list_topics()

    with producer(gateway) as prod:
        sent = [prod.send(topic_name, value=f"p{p}".encode(), partition=p) for p in range(5)]
        assert [f.get(TIMEOUT_S).partition for f in sent] == list(range(5))
    with consumer(gateway) as cons:
        tps = [TopicPartition(topic_name, p) for p in range(5)]
        cons.assign(tps)
        got = read_to_end(cons, dict.fromkeys(tps, 1))
        assert sorted((r.partition, r.offset, r.value) for r in got) == [
            (p, 0, f"p{p}".encode()) for p in range(5)
        ]


@pytest.mark.parametrize("codec", list(CODECS), ids=lambda c: c or "none")
def test_compression_round_trip(gateway, topic_name, stored_batches, codec):
    """Each codec's batches are stored as sent (still compressed) and read back exactly."""
    with admin_client(gateway) as admin:
        create_topic(admin, topic_name)
    values = [f"{codec}-{i}-".encode() * (i % 7 + 1) for i in range(200)]
    with producer(gateway, compression_type=codec, linger_ms=50) as prod:
        futures = [prod.send(topic_name, key=str(i).encode(), value=v, partition=0)
                   for i, v in enumerate(values)]
        prod.flush(TIMEOUT_S)
        assert [f.get(TIMEOUT_S).offset for f in futures] == list(range(200))

    batches = stored_batches(topic_name, 0)
    assert sum(count for _, _, count in batches) == 200
    assert {codec_id for _, codec_id, _ in batches} == {CODECS[codec]}

    tp = TopicPartition(topic_name, 0)
    with consumer(gateway) as cons:
        cons.assign([tp])
        got = read_to_end(cons, {tp: 200})
    assert [(r.offset, r.key, r.value) for r in got] == [
        (i, str(i).encode(), v) for i, v in enumerate(values)
    ]


def test_keys_headers_and_tombstones(gateway, topic_name):
    """Null keys, null values (tombstones), empty values and repeated headers survive."""
    with admin_client(gateway) as admin:
        create_topic(admin, topic_name)
    sent = [
        (b"k1", b"v1", [("h", b"1")]),
        (b"k1", None, []),  # tombstone
        (None, b"no key", [("a", b""), ("a", b"again"), ("utf8-\u00e9", b"\x00\xff")]),
        (b"k2", None, [("only", b"headers")]),  # kafka-python refuses key=value=None
        (b"", b"", []),
    ]
    with producer(gateway) as prod:
        for key, value, headers in sent:
            prod.send(topic_name, key=key, value=value, headers=headers, partition=0)
        prod.flush(TIMEOUT_S)
    tp = TopicPartition(topic_name, 0)
    with consumer(gateway) as cons:
        cons.assign([tp])
        got = read_to_end(cons, {tp: len(sent)})
    assert fields(got) == [(0, i, k, v, h) for i, (k, v, h) in enumerate(sent)]


def test_one_mib_record_and_message_too_large(gateway, topic_name):
    """A 1 MiB value fits a topic with max.message.bytes=2 MiB; the default limit refuses it."""
    big = topic_name + "-big"
    with admin_client(gateway) as admin:
        create_topic(admin, big, configs={"max.message.bytes": "2097152"})
        create_topic(admin, topic_name)  # default limit: 1048588 bytes per batch
    value = bytes(range(256)) * (MIB // 256)
    with producer(gateway, max_request_size=3 * MIB) as prod:
        meta = prod.send(big, key=b"big", value=value, partition=0).get(TIMEOUT_S)
        assert meta.offset == 0
        with pytest.raises(MessageSizeTooLargeError):
            prod.send(topic_name, value=value, partition=0).get(TIMEOUT_S)
    # kafka-python's idempotent producer (its default) fails for good after a
    # refused batch, as it does against Kafka; a new one sends the next record.
    with producer(gateway) as prod:
        # The refused batch left nothing behind: the next record takes offset 0.
        assert prod.send(topic_name, value=b"small", partition=0).get(TIMEOUT_S).offset == 0

    tp, small_tp = TopicPartition(big, 0), TopicPartition(topic_name, 0)
    with consumer(gateway, max_partition_fetch_bytes=3 * MIB, fetch_max_bytes=4 * MIB) as cons:
        cons.assign([tp, small_tp])
        assert cons.end_offsets([tp, small_tp]) == {tp: 1, small_tp: 1}
        got = read_to_end(cons, {tp: 1, small_tp: 1})
    by_tp = {r.topic: r for r in got}
    assert len(got) == 2
    assert by_tp[big].key == b"big" and by_tp[big].value == value
    assert by_tp[topic_name].value == b"small"

    # Default fetch limits (1 MiB per partition) still get the whole batch (KIP-74).
    with consumer(gateway) as cons:
        cons.assign([tp])
        (record,) = read_to_end(cons, {tp: 1})
    assert record.value == value


def test_consume_from_earliest_and_from_latest(gateway, topic_name):
    """auto_offset_reset=earliest reads everything; latest sees only records produced after."""
    with admin_client(gateway) as admin:
        create_topic(admin, topic_name)
    tp = TopicPartition(topic_name, 0)
    with producer(gateway) as prod:
        for i in range(5):
            prod.send(topic_name, value=f"old-{i}".encode(), partition=0)
        prod.flush(TIMEOUT_S)

        with consumer(gateway, auto_offset_reset="latest") as latest, \
                consumer(gateway, auto_offset_reset="earliest") as earliest:
            latest.assign([tp])
            earliest.assign([tp])
            assert latest.position(tp) == 5  # resolved before the new records exist
            assert earliest.position(tp) == 0

            for i in range(3):
                prod.send(topic_name, value=f"new-{i}".encode(), partition=0)
            prod.flush(TIMEOUT_S)

            assert [r.value for r in read_to_end(latest, {tp: 8})] == [
                f"new-{i}".encode() for i in range(3)
            ]
            assert [r.value for r in read_to_end(earliest, {tp: 8})] == [
                f"old-{i}".encode() for i in range(5)
            ] + [f"new-{i}".encode() for i in range(3)]

            # seek_to_beginning / seek_to_end / seek(offset) move an assigned consumer.
            latest.seek_to_beginning(tp)
            assert latest.position(tp) == 0
            latest.seek(tp, 6)
            assert [r.offset for r in read_to_end(latest, {tp: 8})] == [6, 7]
            latest.seek_to_end(tp)
            assert latest.position(tp) == 8


def test_offsets_for_times(gateway, topic_name, stored_batches):
    """offsets_for_times returns the first offset at or after a timestamp, None past the end.

    One batch of four records per codec, so lookups land inside and across
    batches and the gateway reads timestamps out of every kind of batch.
    """
    with admin_client(gateway) as admin:
        create_topic(admin, topic_name)
    base = int(time.time() * 1000) - 60_000
    stamps = [base + 10 * i for i in range(4 * len(CODECS))]
    for chunk, codec in enumerate(CODECS):
        with producer(gateway, linger_ms=20, compression_type=codec) as prod:
            for i in range(chunk * 4, chunk * 4 + 4):
                # Compressible: the client sends a batch uncompressed if that is smaller.
                prod.send(topic_name, value=f"{i}:".encode() + b"payload " * 32, partition=0,
                          timestamp_ms=stamps[i])
            prod.flush(TIMEOUT_S)
    assert [(codec, count) for _, codec, count in stored_batches(topic_name, 0)] == [
        (codec, 4) for codec in CODECS.values()
    ]
    tp = TopicPartition(topic_name, 0)
    with consumer(gateway) as cons:
        def lookup(ts: int):
            return cons.offsets_for_times({tp: ts})[tp]

        for i, ts in enumerate(stamps):
            found = lookup(ts)
            assert (found.offset, found.timestamp) == (i, ts), (i, found)
            if i:  # between two records: the later one
                found = lookup(ts - 5)
                assert (found.offset, found.timestamp) == (i, ts)
        assert lookup(0).offset == 0
        assert lookup(stamps[-1] + 1) is None

        # Seeking to the offset found reads from that record on.
        cons.assign([tp])
        cons.seek(tp, lookup(stamps[7]).offset)
        got = read_to_end(cons, {tp: len(stamps)})
    assert [(r.offset, r.timestamp) for r in got] == list(enumerate(stamps))[7:]


def test_long_poll_is_woken_by_a_new_record(gateway, topic_name):
    """A poll blocked in a fetch with a 10 s max wait returns soon after a record arrives."""
    with admin_client(gateway) as admin:
        create_topic(admin, topic_name)
    tp = TopicPartition(topic_name, 0)
    with producer(gateway) as prod, \
            consumer(gateway, fetch_max_wait_ms=10_000, auto_offset_reset="latest") as cons:
        prod.send(topic_name, value=b"warm-up", partition=0).get(TIMEOUT_S)
        cons.assign([tp])
        assert cons.position(tp) == 1
        assert cons.poll(timeout_ms=200) == {}  # a fetch is now waiting in the gateway

        sent_at: list[float] = []

        def produce_later() -> None:
            time.sleep(0.5)
            sent_at.append(time.monotonic())
            prod.send(topic_name, value=b"wake up", partition=0).get(TIMEOUT_S)

        thread = threading.Thread(target=produce_later)
        started = time.monotonic()
        thread.start()
        try:
            batches = cons.poll(timeout_ms=20_000)
        finally:
            thread.join(TIMEOUT_S)
        elapsed = time.monotonic() - started
    assert [r.value for r in batches.get(tp, [])] == [b"wake up"]
    assert sent_at, "the producer thread never sent"
    assert elapsed < 5.0, f"poll took {elapsed:.1f}s: not woken by the append (max wait 10 s)"


def test_watermarks_and_delete_records(gateway, topic_name, stored_batches):
    """end/beginning offsets are exact; delete_records moves the beginning offset."""
    with admin_client(gateway) as admin:
        create_topic(admin, topic_name, 2)
        tp0, tp1 = TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)
        with producer(gateway, linger_ms=20) as prod:
            for i in range(7):
                prod.send(topic_name, value=f"a{i}".encode(), partition=0)
                if i == 4:
                    prod.flush(TIMEOUT_S)  # batches [0..4] and [5, 6]
            for i in range(4):
                prod.send(topic_name, value=f"b{i}".encode(), partition=1)
            prod.flush(TIMEOUT_S)
        assert [count for _, _, count in stored_batches(topic_name, 0)] == [5, 2]
        with consumer(gateway) as cons:
            assert cons.end_offsets([tp0, tp1]) == {tp0: 7, tp1: 4}
            assert cons.beginning_offsets([tp0, tp1]) == {tp0: 0, tp1: 0}
        with consumer(gateway, isolation_level="read_committed") as committed:
            assert committed.end_offsets([tp0, tp1]) == {tp0: 7, tp1: 4}
        with consumer(gateway) as cons:

            # Offset 3 lies inside the first batch: the batch stays, offsets 0-2 go.
            result = admin.delete_records({tp0: 3})
            assert result[tp0]["low_watermark"] == 3 and result[tp0]["error_code"] == 0
            assert cons.beginning_offsets([tp0, tp1]) == {tp0: 3, tp1: 0}
            assert cons.end_offsets([tp0, tp1]) == {tp0: 7, tp1: 4}
            # A time before the log start finds the first record still there.
            assert cons.offsets_for_times({tp0: 0})[tp0].offset == 3

            cons.assign([tp0, tp1])
            cons.seek_to_beginning()
            got = read_to_end(cons, {tp0: 7, tp1: 4})
            assert sorted((r.partition, r.offset, r.value) for r in got) == (
                [(0, i, f"a{i}".encode()) for i in range(3, 7)]
                + [(1, i, f"b{i}".encode()) for i in range(4)]
            )
            assert (cons.highwater(tp0), cons.highwater(tp1)) == (7, 4)

            # Up to the high watermark (-1): the partition reads as empty.
            result = admin.delete_records({tp1: -1})
            assert result[tp1]["low_watermark"] == 4
            assert cons.beginning_offsets([tp1]) == {tp1: 4}
            assert cons.end_offsets([tp1]) == {tp1: 4}


def test_kill_9_keeps_every_acknowledged_record(gateway, topic_name):
    """After kill -9 and restart, every acknowledged record reads back exactly, once."""
    with admin_client(gateway) as admin:
        create_topic(admin, topic_name, 3)
    expected: dict[tuple[int, int], tuple[bytes, bytes]] = {}
    with producer(gateway, linger_ms=5, compression_type="lz4") as prod:
        futures = []
        for i in range(300):
            key, value = f"key-{i}".encode(), f"value-{i}".encode() * 3
            futures.append((prod.send(topic_name, key=key, value=value, partition=i % 3),
                            key, value))
        prod.flush(TIMEOUT_S)
        for future, key, value in futures:
            meta = future.get(TIMEOUT_S)
            expected[(meta.partition, meta.offset)] = (key, value)

        gateway.kill()
        gateway.start()

        # The same producer reconnects and goes on where the log ended.
        meta = prod.send(topic_name, key=b"after", value=b"restart", partition=0).get(TIMEOUT_S)
        assert meta.offset == 100
        expected[(0, 100)] = (b"after", b"restart")

    tps = [TopicPartition(topic_name, p) for p in range(3)]
    with consumer(gateway) as cons:
        ends = cons.end_offsets(tps)
        assert ends == {tps[0]: 101, tps[1]: 100, tps[2]: 100}
        # The time index survived too.
        assert {tp: found.offset for tp, found in cons.offsets_for_times(
            dict.fromkeys(tps, 0)).items()} == dict.fromkeys(tps, 0)
        cons.assign(tps)
        got = read_to_end(cons, ends)
    assert len(got) == len(expected) == 301
    assert {(r.partition, r.offset): (r.key, r.value) for r in got} == expected


def test_kill_9_mid_stream_loses_no_acknowledged_record(gateway, topic_name):
    """kill -9 while a producer streams: every ack names a stored record, none is lost.

    The producer is idempotent (kafka-python's default): a batch retried
    across the restart is recognised (the gateway keeps producer state with
    the data), so every record is stored exactly once, offsets are gapless,
    and every acknowledged (partition, offset) holds the record acknowledged.
    """
    with admin_client(gateway) as admin:
        create_topic(admin, topic_name, 3)
    total, kill_at, restart_at = 3000, 1000, 1500
    futures = []
    acked_before_kill = 0
    with producer(gateway, linger_ms=2) as prod:
        for i in range(total):
            futures.append(prod.send(topic_name, key=str(i).encode(), value=b"v%d" % i,
                                     partition=i % 3))
            if i == kill_at:
                futures[0].get(TIMEOUT_S)
                acked_before_kill = sum(f.succeeded() for f in futures)
                gateway.kill()
            elif i == restart_at:
                gateway.start()
            time.sleep(0.0002)
        prod.flush(TIMEOUT_S * 2)
        acked = {}
        for i, future in enumerate(futures):
            meta = future.get(0)  # the client retried through the outage
            acked[(meta.partition, meta.offset)] = i
    assert 0 < acked_before_kill < total

    tps = [TopicPartition(topic_name, p) for p in range(3)]
    with consumer(gateway) as cons:
        ends = cons.end_offsets(tps)
        cons.assign(tps)
        got = read_to_end(cons, ends)
    stored = {(r.partition, r.offset): (r.key, r.value) for r in got}
    assert len(stored) == len(got) == sum(ends.values())
    assert sorted(stored) == [(tp.partition, o) for tp in tps for o in range(ends[tp])]
    for (partition, offset), i in acked.items():
        assert stored[(partition, offset)] == (str(i).encode(), b"v%d" % i)
        assert partition == i % 3
    assert sorted(int(key) for key, _ in stored.values()) == list(range(total))  # each once


def test_describe_and_alter_configs_round_trip(gateway, topic_name):
    """alter_configs (incremental and not) sets overrides; describe_configs reports sources."""
    with admin_client(gateway) as admin:
        create_topic(admin, topic_name)
        resource = ConfigResource(ConfigResourceType.TOPIC, topic_name)

        def describe(**kwargs: Any) -> dict[str, dict[str, Any]]:
            return admin.describe_configs([resource], config_filter="all",
                                          **kwargs)["topic"][topic_name]

        result = admin.alter_configs([ConfigResource(
            ConfigResourceType.TOPIC, topic_name, configs={"retention.ms": "7200000"})])
        assert result == {"topic": {topic_name: "OK"}}
        configs = describe(include_synonyms=True)
        assert configs["retention.ms"]["value"] == "7200000"
        assert configs["retention.ms"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
        synonyms = configs["retention.ms"]["synonyms"]
        assert synonyms[0] == {"name": "retention.ms", "value": "7200000",
                               "source": "DYNAMIC_TOPIC_CONFIG"}
        # As Kafka: log.retention.ms has no default of its own, so no broker synonym.
        assert len(synonyms) == 1
        # Everything else: the defaults, reported as such.
        for name, value in {"max.message.bytes": str(DEFAULT_MAX_MESSAGE_BYTES),
                            "cleanup.policy": "delete", "retention.bytes": "-1",
                            "message.timestamp.type": "CreateTime",
                            "compression.type": "producer"}.items():
            assert (configs[name]["value"], configs[name]["config_source"]) == (
                value, "DEFAULT_CONFIG"), name
        assert not configs["retention.ms"]["read_only"]

        # Incremental: a second SET keeps the first override.
        admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic_name,
                                            configs={"retention.bytes": "1000000"})],
                            incremental=True)
        modified = admin.describe_configs([resource])["topic"][topic_name]
        assert {k: v["value"] for k, v in modified.items()} == {
            "retention.ms": "7200000", "retention.bytes": "1000000"}

        # DELETE: back to the default.
        admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic_name, configs={
            "retention.ms": (AlterConfigOp.DELETE, None)})], incremental=True)
        configs = describe()
        assert (configs["retention.ms"]["value"], configs["retention.ms"]["config_source"]) == (
            "604800000", "DEFAULT_CONFIG")
        assert configs["retention.bytes"]["value"] == "1000000"

        # Classic AlterConfigs (whole set; the client carries other overrides over).
        admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic_name,
                                            configs={"retention.ms": "60000"})],
                            incremental=False)
        modified = admin.describe_configs([resource])["topic"][topic_name]
        assert {k: v["value"] for k, v in modified.items()} == {
            "retention.ms": "60000", "retention.bytes": "1000000"}

        # An invalid value is refused and changes nothing.
        result = admin.alter_configs([ConfigResource(
            ConfigResourceType.TOPIC, topic_name, configs={"retention.ms": "-7"})])
        assert "InvalidConfigurationError" in result["topic"][topic_name]
        assert describe()["retention.ms"]["value"] == "60000"


def test_retention_ms_set_by_admin_is_enforced(gateway, topic_name):
    """Lowering retention.ms with alter_configs removes old records; new ones stay."""
    with admin_client(gateway) as admin:
        create_topic(admin, topic_name)
        tp = TopicPartition(topic_name, 0)
        an_hour_ago = int(time.time() * 1000) - 3_600_000
        with producer(gateway) as prod:
            for i in range(5):
                prod.send(topic_name, value=b"old", partition=0, timestamp_ms=an_hour_ago + i)
            prod.flush(TIMEOUT_S)
            with consumer(gateway) as cons:
                assert cons.beginning_offsets([tp]) == {tp: 0}
                admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic_name,
                                                    configs={"retention.ms": "600000"})])
                deadline = time.monotonic() + TIMEOUT_S
                while cons.beginning_offsets([tp])[tp] != 5:
                    assert time.monotonic() < deadline, "retention never removed old records"
                    time.sleep(0.2)
                prod.send(topic_name, value=b"new", partition=0).get(TIMEOUT_S)
                cons.assign([tp])
                cons.seek_to_beginning(tp)
                got = read_to_end(cons, {tp: 6})
    assert [(r.offset, r.value) for r in got] == [(5, b"new")]
