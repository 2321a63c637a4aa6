"""confluent-kafka (librdkafka) against the gateway: admin, produce, consume, faults."""

from __future__ import annotations

import asyncio
import datetime
import socket
import struct
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
)
from kio.schema.errors import ErrorCode
from kio.schema.produce.v9 import request as produce
from kio.static.primitive import Records, i32Timedelta

from testkit.batches import make_batch
from testkit.routing import leader_client, leader_of

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
TIMEOUT = 30


def admin(gateway) -> AdminClient:
    return AdminClient({"bootstrap.servers": gateway.bootstrap})


def create_topic(gateway, name: str, partitions: int = 1, **configs: str) -> None:
    client = admin(gateway)  # must outlive the future
    futures = client.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1, config=configs)]
    )
    futures[name].result(TIMEOUT)


def producer(gateway, **extra) -> Producer:
    return Producer({"bootstrap.servers": gateway.bootstrap, "linger.ms": 5, "acks": "all",
                     **extra})


def consumer(gateway, **extra) -> Consumer:
    return Consumer({
        "bootstrap.servers": gateway.bootstrap,
        "group.id": "compat-assign",  # assign() only: no group membership
        "enable.auto.commit": False,
        "fetch.wait.max.ms": 100,
        **extra,
    })


def produce_all(p: Producer, topic: str, messages: list[dict]) -> list:
    """Produce and wait for every delivery report; returns them in order."""
    reports: list = [None] * len(messages)

    def on_delivery(index):
        def callback(err, msg):
            reports[index] = (err, msg.offset() if err is None else None)
        return callback

    for i, message in enumerate(messages):
        p.produce(topic, on_delivery=on_delivery(i), **message)
    assert p.flush(TIMEOUT) == 0
    return reports


def consume(c: Consumer, count: int, timeout: float = TIMEOUT) -> list:
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < count and time.monotonic() < deadline:
        msg = c.poll(0.5)
        if msg is None:
            continue
        assert msg.error() is None, msg.error()
        out.append(msg)
    return out


def read_partition(gateway, topic: str, partition: int, count: int, start=OFFSET_BEGINNING,
                   **extra) -> list:
    c = consumer(gateway, **extra)
    try:
        c.assign([TopicPartition(topic, partition, start)])
        return consume(c, count)
    finally:
        c.close()


def test_admin_topics_and_configs_round_trip(gateway, topic_name):
    """CreateTopics with configs, DescribeConfigs, IncrementalAlterConfigs, CreatePartitions."""
    a = admin(gateway)
    create_topic(gateway, topic_name, 2, **{"retention.ms": "3600000"})
    metadata = a.list_topics(timeout=TIMEOUT)
    assert len(metadata.topics[topic_name].partitions) == 2

    resource = ConfigResource(ConfigResource.Type.TOPIC, topic_name)
    configs = a.describe_configs([resource])[resource].result(TIMEOUT)
    assert configs["retention.ms"].value == "3600000"
    assert configs["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert configs["cleanup.policy"].value == "delete"
    assert configs["cleanup.policy"].source == ConfigSource.DEFAULT_CONFIG.value
    assert configs["max.message.bytes"].value == "1048588"
    assert len(configs) >= 25  # every Kafka topic config is reported

    changes = ConfigResource(ConfigResource.Type.TOPIC, topic_name, incremental_configs=[
        ConfigEntry("retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("max.message.bytes", "2000000", incremental_operation=AlterConfigOpType.SET),
    ])
    a.incremental_alter_configs([changes])[changes].result(TIMEOUT)
    configs = a.describe_configs([resource])[resource].result(TIMEOUT)
    assert configs["retention.ms"].value == "7200000"
    assert configs["max.message.bytes"].value == "2000000"

    delete = ConfigResource(ConfigResource.Type.TOPIC, topic_name, incremental_configs=[
        ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
    ])
    a.incremental_alter_configs([delete])[delete].result(TIMEOUT)
    configs = a.describe_configs([resource])[resource].result(TIMEOUT)
    assert configs["retention.ms"].value == "604800000"
    assert configs["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value

    bad = ConfigResource(ConfigResource.Type.TOPIC, topic_name, incremental_configs=[
        ConfigEntry("retention.ms", "soon", incremental_operation=AlterConfigOpType.SET),
    ])
    with pytest.raises(Exception, match=r"(?i)invalid"):
        a.incremental_alter_configs([bad])[bad].result(TIMEOUT)

    a.create_partitions([NewPartitions(topic_name, 4)])[topic_name].result(TIMEOUT)
    assert len(a.list_topics(topic_name, timeout=TIMEOUT).topics[topic_name].partitions) == 4
    with pytest.raises(Exception, match=r"(?i)partitions"):
        a.create_partitions([NewPartitions(topic_name, 3)])[topic_name].result(TIMEOUT)

    with pytest.raises(Exception, match=r"(?i)already exists"):
        create_topic(gateway, topic_name)

    a.delete_topics([topic_name])[topic_name].result(TIMEOUT)
    assert topic_name not in a.list_topics(timeout=TIMEOUT).topics


@pytest.mark.parametrize("codec", CODECS)
def test_every_codec_keys_headers_nulls(gateway, topic_name, codec):
    """Each codec's batches pass through untouched and read back exactly."""
    create_topic(gateway, topic_name)
    messages = [
        {"key": f"k{i}".encode(), "value": None if i % 10 == 0 else f"value-{i}".encode() * 20,
         "headers": [("index", str(i).encode()), ("codec", codec.encode())]}
        for i in range(300)
    ]
    p = producer(gateway, **{"compression.type": codec})
    reports = produce_all(p, topic_name, messages)
    assert [err for err, _ in reports] == [None] * 300
    assert [offset for _, offset in reports] == list(range(300))

    got = read_partition(gateway, topic_name, 0, 300)
    assert [m.offset() for m in got] == list(range(300))
    for message, m in zip(messages, got, strict=True):
        assert m.key() == message["key"]
        assert m.value() == message["value"]
        assert m.headers() == message["headers"]


def test_one_mib_record_and_too_large(gateway, topic_name):
    """A 1 MiB record fits a topic that allows it; the default limit rejects it."""
    big = bytes(range(256)) * 4096  # 1 MiB
    create_topic(gateway, topic_name, **{"max.message.bytes": "2097152"})
    p = producer(gateway, **{"message.max.bytes": 4_000_000})
    [(err, offset)] = produce_all(p, topic_name, [{"value": big, "key": b"big"}])
    assert err is None and offset == 0
    [m] = read_partition(gateway, topic_name, 0, 1, **{"fetch.max.bytes": 4_000_000,
                                                        "receive.message.max.bytes": 5_000_000})
    assert m.value() == big

    small_limit = topic_name + "-default"
    create_topic(gateway, small_limit)
    [(err, _)] = produce_all(p, small_limit, [{"value": big}])
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE
    lo, hi = consumer(gateway).get_watermark_offsets(TopicPartition(small_limit, 0),
                                                     timeout=TIMEOUT)
    assert (lo, hi) == (0, 0)  # nothing of the rejected batch was stored


def test_latest_by_timestamp_and_exact_watermarks(gateway, topic_name):
    """Watermarks count records exactly; offsets_for_times finds the first record at/after."""
    create_topic(gateway, topic_name)
    base = 1_700_000_000_000
    p = producer(gateway)
    # Several batches: timestamps 0, 10, 20, ... ms after base.
    for chunk in range(5):
        produce_all(p, topic_name, [
            {"value": f"r{i}".encode(), "timestamp": base + 10 * i}
            for i in range(chunk * 20, chunk * 20 + 20)
        ])
    c = consumer(gateway)
    assert c.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=TIMEOUT) == (0, 100)

    lookups = [TopicPartition(topic_name, 0, ts) for ts in
               (base - 1, base + 10 * 37, base + 10 * 37 + 5, base + 10 * 99, base + 10 * 100)]
    found = []
    for lookup in lookups:
        [result] = c.offsets_for_times([lookup], timeout=TIMEOUT)
        found.append(result.offset)
    # first record, exact, next one, last one, none (-1 = end/unknown)
    assert found == [0, 37, 38, 99, -1]

    # From latest: only what is produced after the consumer starts.
    c.assign([TopicPartition(topic_name, 0, OFFSET_END)])
    assert consume(c, 1, timeout=2) == []  # resolves "latest" to 100 and starts fetching
    # librdkafka resolves "latest" in the background and says nothing of it
    # (position() stays unknown until a record is consumed): on a loaded machine
    # it may resolve only after the next record, and then rightly skips it. So
    # produce until one arrives; none of the 100 before may.
    got = []
    for attempt in range(10):
        produce_all(p, topic_name, [{"value": f"after-{attempt}".encode()}])
        got = consume(c, 1, timeout=3)
        if got:
            break
    [m] = got
    assert m.offset() >= 100
    assert m.value() == f"after-{m.offset() - 100}".encode()
    c.close()


def test_long_poll_woken_by_new_record(gateway, topic_name):
    """A fetch waiting on max wait returns as soon as a record arrives."""
    create_topic(gateway, topic_name)
    c = consumer(gateway, **{"fetch.wait.max.ms": 10_000})
    c.assign([TopicPartition(topic_name, 0, OFFSET_BEGINNING)])
    consume(c, 0, timeout=1.5)  # the consumer is now parked in a long-poll
    p = producer(gateway, **{"linger.ms": 0})
    sent = time.monotonic()
    produce_all(p, topic_name, [{"value": b"wake up"}])
    [m] = consume(c, 1, timeout=9)
    assert m.value() == b"wake up"
    assert time.monotonic() - sent < 5  # well before the 10 s max wait
    c.close()


def test_kill_9_then_read_everything_back(gateway, topic_name):
    """Every acknowledged record survives kill -9 of the gateway."""
    create_topic(gateway, topic_name, 3)
    p = producer(gateway)
    messages = [{"value": f"durable-{i}".encode(), "partition": i % 3} for i in range(3000)]
    reports = produce_all(p, topic_name, messages)
    assert all(err is None for err, _ in reports)
    gateway.kill()
    gateway.start()
    for partition in range(3):
        got = read_partition(gateway, topic_name, partition, 1000)
        assert [m.value() for m in got] == [
            f"durable-{i}".encode() for i in range(partition, 3000, 3)
        ]
    c = consumer(gateway)
    assert c.get_watermark_offsets(TopicPartition(topic_name, 2), timeout=TIMEOUT) == (0, 1000)
    c.close()
    # And the restarted gateway keeps appending after the last offset.
    [(err, offset)] = produce_all(producer(gateway), topic_name, [{"value": b"x", "partition": 0}])
    assert err is None and offset == 1000


def _raw_produce(gateway, topic: str, records: bytes):
    """One raw Produce to partition 0, sent to its leader (Metadata's)."""

    async def send():
        client = await leader_client(gateway.host_port, topic, 0)
        try:
            return await client.request(produce.ProduceRequest(
                transactional_id=None, acks=-1,
                timeout=i32Timedelta.parse(datetime.timedelta(seconds=10)),
                topic_data=(produce.TopicProduceData(name=topic, partition_data=(
                    produce.PartitionProduceData(index=0, records=Records(records)),)),),
            ))
        finally:
            await client.close()

    response = asyncio.run(send())
    return response.responses[0].partition_responses[0]


def test_corrupt_batch_rejected_while_others_work(gateway, topic_name):
    """A batch with a bad CRC gets CORRUPT_MESSAGE and nothing of it is stored."""
    create_topic(gateway, topic_name)
    good = make_batch([b"one", b"two"], base_timestamp=int(time.time() * 1000))
    assert _raw_produce(gateway, topic_name, good).error_code is ErrorCode.none

    corrupt = bytearray(good)
    corrupt[-2] ^= 0xFF  # inside the CRC'd range
    result = _raw_produce(gateway, topic_name, bytes(corrupt))
    assert result.error_code is ErrorCode.corrupt_message
    truncated = _raw_produce(gateway, topic_name, good[:-5])
    assert truncated.error_code is ErrorCode.corrupt_message
    two_batches = good + bytes(corrupt)  # Kafka takes one batch per partition
    assert _raw_produce(gateway, topic_name, two_batches).error_code is ErrorCode.invalid_record

    [(err, offset)] = produce_all(producer(gateway), topic_name, [{"value": b"three"}])
    assert err is None and offset == 2
    got = read_partition(gateway, topic_name, 0, 3)
    assert [m.value() for m in got] == [b"one", b"two", b"three"]


def _closed_by_gateway(sock: socket.socket) -> bool:
    sock.settimeout(10)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_garbage_closes_only_that_connection(gateway, topic_name):
    """Garbage, an oversized frame or an unknown API close that connection, nothing else."""
    create_topic(gateway, topic_name)
    p = producer(gateway)
    stop = threading.Event()
    errors: list = []

    def keep_producing():
        i = 0
        while not stop.is_set():
            p.produce(topic_name, value=b"steady-%d" % i,
                      on_delivery=lambda err, _m: err and errors.append(err))
            p.poll(0.01)
            i += 1
        p.flush(TIMEOUT)

    worker = threading.Thread(target=keep_producing)
    worker.start()
    try:
        payloads = [
            b"\x00\x00\x00\x10" + bytes(range(16)),  # a frame of nonsense
            struct.pack(">i", 2_000_000_000),  # oversized frame
            struct.pack(">i", -5),  # negative size
            struct.pack(">ihhih", 10, 9999, 0, 1, -1),  # unknown API key
            struct.pack(">ihhih", 10, 0, 42, 1, -1),  # Produce at an unknown version
        ]
        for payload in payloads:
            with socket.create_connection(gateway.host_port) as sock:
                sock.sendall(payload)
                assert _closed_by_gateway(sock), payload
    finally:
        stop.set()
        worker.join(TIMEOUT)
    assert errors == []
    _lo, hi = consumer(gateway).get_watermark_offsets(TopicPartition(topic_name, 0),
                                                     timeout=TIMEOUT)
    assert hi > 0
    assert "closing connection" in gateway.output()


def test_api_versions_fallback_for_newer_clients(gateway):
    """ApiVersions above v3 is answered in v0 with UNSUPPORTED_VERSION and the list."""
    with socket.create_connection(gateway.host_port) as sock:
        sock.settimeout(10)
        header = struct.pack(">hhih", 18, 9, 77, -1)
        sock.sendall(struct.pack(">i", len(header) + 1) + header + b"\x00")
        size = struct.unpack(">i", sock.recv(4))[0]
        body = b""
        while len(body) < size:
            body += sock.recv(size - len(body))
    correlation, error, count = struct.unpack_from(">ihi", body, 0)
    assert (correlation, error) == (77, ErrorCode.unsupported_version.value)
    keys = {struct.unpack_from(">hhh", body, 10 + 6 * i) for i in range(count)}
    assert (18, 0, 3) in keys and (0, 0, 9) in keys and (1, 4, 13) in keys


def test_log_append_time_topics_stamp_records(gateway, topic_name):
    """message.timestamp.type=LogAppendTime replaces the producer's timestamps."""
    from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME

    create_topic(gateway, topic_name, **{"message.timestamp.type": "LogAppendTime"})
    before = int(time.time() * 1000)
    produce_all(producer(gateway), topic_name,
                [{"value": b"v%d" % i, "timestamp": 1_000} for i in range(3)])
    after = int(time.time() * 1000)
    got = read_partition(gateway, topic_name, 0, 3)
    for m in got:
        kind, stamp = m.timestamp()
        assert kind == TIMESTAMP_LOG_APPEND_TIME
        assert before - 1000 <= stamp <= after + 1000


def test_topics_are_auto_created_on_first_use(gateway, topic_name):
    """Like Kafka: producing to an unknown topic creates it (num.partitions)."""
    [(err, offset)] = produce_all(producer(gateway), topic_name, [{"value": b"first"}])
    assert err is None and offset == 0
    metadata = admin(gateway).list_topics(topic_name, timeout=TIMEOUT)
    assert len(metadata.topics[topic_name].partitions) == 1


def test_auto_creation_can_be_turned_off(tmp_path, topic_name):
    from testkit.gateway import GatewayProcess

    with GatewayProcess(tmp_path / "data", "--auto-create-topics-enable", "false",
                        "--num-partitions", "4") as off:
        p = producer(off, **{"message.timeout.ms": 3000})
        [(err, _)] = produce_all(p, topic_name, [{"value": b"nowhere"}])
        assert err is not None and err.code() in (
            KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._MSG_TIMED_OUT)
        assert topic_name not in admin(off).list_topics(timeout=TIMEOUT).topics
        create_topic(off, topic_name)  # -1 partitions: the node's num.partitions
        assert len(admin(off).list_topics(timeout=TIMEOUT).topics[topic_name].partitions) == 1


def test_stalled_clients_do_not_stall_others(tmp_path, topic_name):
    """A client that never reads its answers, and one that sends half a frame, stall alone."""
    from testkit.gateway import GatewayProcess

    # A 4 MiB in-memory tail: the answers below are fresh reads from disk.
    with GatewayProcess(tmp_path / "data", "--tail-cache-bytes", str(4 << 20)) as gateway:
        _stall_and_check(gateway, topic_name)


def _stall_and_check(gateway, topic_name):
    create_topic(gateway, topic_name, **{"max.message.bytes": "2097152"})
    p = producer(gateway, **{"message.max.bytes": 4_000_000})
    produce_all(p, topic_name, [{"value": bytes(1 << 20)} for _ in range(16)])

    # The stalled clients go to the partition's leader, which answers their
    # Fetches: the gateway itself, or on a cluster the one of its three
    # Metadata names (another would answer NOT_LEADER_OR_FOLLOWER, a few
    # bytes, and nothing would stall).
    _, host, port = asyncio.run(asyncio.wait_for(leader_of(gateway.host_port, topic_name, 0),
                                                 TIMEOUT))
    leader = gateway.node_of(port)
    fetch_frame = _raw_fetch_frame(topic_name)
    hogs = []
    for _ in range(3):
        hog = socket.create_connection((host, port))
        hog.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        hog.sendall(fetch_frame * 200)  # ~1.6 GB of answers it will never read
        hogs.append(hog)
    half = socket.create_connection((host, port))
    half.sendall(struct.pack(">i", 1000) + b"\x00" * 10)  # and then nothing
    try:
        started = time.monotonic()
        [(err, offset)] = produce_all(p, topic_name, [{"value": b"still here"}])
        assert err is None and offset == 16
        [m] = read_partition(gateway, topic_name, 0, 1, start=16)
        assert m.value() == b"still here"
        assert time.monotonic() - started < 20
        # The premise: the hogs are answered with records (MiBs each answer),
        # not with an error of a few bytes.
        hogs[0].settimeout(TIMEOUT)
        size = b""
        while len(size) < 4:
            chunk = hogs[0].recv(4 - len(size))
            assert chunk, "the leader closed a stalled client's connection"
            size += chunk
        assert struct.unpack(">i", size)[0] > 1 << 20, struct.unpack(">i", size)
        # What waits for the stalled readers is bounded (about one answer each).
        status = Path(f"/proc/{leader.process.pid}/status").read_text()
        rss_kib = int(next(line.split()[1] for line in status.splitlines()
                           if line.startswith("VmRSS")))
        assert rss_kib < 1_000_000, rss_kib
    finally:
        for sock in (*hogs, half):
            sock.close()


def _raw_fetch_frame(topic: str) -> bytes:
    """A Fetch v4 request frame for partition 0 from offset 0, 8 MiB limit."""
    name = topic.encode()
    # replica id, max wait, min bytes, max bytes, isolation level
    body = struct.pack(">iiiib", -1, 0, 1, 64 << 20, 0)
    body += struct.pack(">ih", 1, len(name)) + name
    body += struct.pack(">iiqi", 1, 0, 0, 8 << 20)
    header = struct.pack(">hhih", 1, 4, 1, -1)
    return struct.pack(">i", len(header) + len(body)) + header + body


def test_timestamps_outside_the_allowed_window_are_refused(gateway, topic_name):
    """message.timestamp.difference.max.ms: INVALID_TIMESTAMP, and nothing stored."""
    create_topic(gateway, topic_name, **{"message.timestamp.difference.max.ms": "60000"})
    p = producer(gateway)
    [(err, _)] = produce_all(p, topic_name, [{"value": b"old", "timestamp": 1_000}])
    assert err is not None and err.code() == KafkaError.INVALID_TIMESTAMP
    [(err, offset)] = produce_all(p, topic_name, [{"value": b"now"}])
    assert err is None and offset == 0


def test_validate_only_changes_nothing(gateway, topic_name):
    """CreateTopics and CreatePartitions with validate_only check and create nothing."""
    a = admin(gateway)
    a.create_topics([NewTopic(topic_name, 2, 1)], validate_only=True)[topic_name].result(TIMEOUT)
    assert topic_name not in a.list_topics(timeout=TIMEOUT).topics
    bad = NewTopic(topic_name, 2, 1, config={"cleanup.policy": "shrink"})
    with pytest.raises(Exception, match=r"String must be one of: compact, delete"):
        a.create_topics([bad], validate_only=True)[topic_name].result(TIMEOUT)

    create_topic(gateway, topic_name, 2)
    grow = a.create_partitions([NewPartitions(topic_name, 5)], validate_only=True)
    grow[topic_name].result(TIMEOUT)
    assert len(a.list_topics(topic_name, timeout=TIMEOUT).topics[topic_name].partitions) == 2
