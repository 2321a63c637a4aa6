"""kcat, Debian's build on librdkafka 2.0.2, against the gateway.

An old librdkafka is worth keeping happy: distributions ship it, and it reads
a broker's ApiVersions more literally than newer clients do (it dropped
gzip/snappy to uncompressed while the gateway advertised Produce from v3).

kcat consumes with assign (``-C -t T -p P``), not with groups. Every kcat run
is a subprocess with a timeout. Needs the ``kcat`` Debian package.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time

import pytest
from compat_helpers import CODECS, KCAT, create_topic, kcat

# Larger than kcat's defaults so a 1 MiB record fits everywhere on the way.
BIG = ["-X", "message.max.bytes=4194304", "-X", "max.partition.fetch.bytes=4194304",
       "-X", "fetch.max.bytes=8388608", "-X", "receive.message.max.bytes=16777216"]


def produce(gateway, topic: str, lines: list[str], *args: str, partition: int | None = 0) -> None:
    """Produce one message per line (kcat -P), waiting for every delivery."""
    where = ["-p", str(partition)] if partition is not None else []
    kcat(gateway, "-P", "-t", topic, *where, *args, input="".join(f"{x}\n" for x in lines))


def consume(gateway, topic: str, *args: str, partition: int | None = 0) -> list[dict]:
    """Consume to the end (-e) with the JSON envelope (-J): one dict per message."""
    where = ["-p", str(partition)] if partition is not None else []
    done = kcat(gateway, "-C", "-t", topic, *where, "-e", "-J", *args)
    return [json.loads(line) for line in done.stdout.decode().splitlines() if line]


def query(gateway, topic: str, partition: int, timestamp: int) -> int:
    """kcat -Q: the offset for a timestamp (-1 latest, -2 earliest)."""
    done = kcat(gateway, "-Q", "-J", "-t", f"{topic}:{partition}:{timestamp}")
    return json.loads(done.stdout)[topic][str(partition)]["offset"]


def metadata(gateway, *args: str) -> dict:
    return json.loads(kcat(gateway, "-L", "-J", *args).stdout)


# ----------------------------------------------------------------- metadata
def test_metadata_lists_broker_topic_and_partitions(gateway, topic_name):
    create_topic(gateway, topic_name, partitions=3)
    # The brokers the test started: the gateway (node 0), and on a cluster
    # (KAFKA_GATEWAY_TEST_STORE=postgresql-cluster) its two siblings.
    nodes = {node: member.bootstrap for node, member in gateway.nodes().items()}
    everything = metadata(gateway)
    assert {b["id"]: b["name"] for b in everything["brokers"]} == nodes
    # The broker asked names itself the controller.
    assert everything["originating_broker"]["id"] in nodes
    assert everything["controllerid"] == everything["originating_broker"]["id"]
    topics = {t["topic"]: t for t in everything["topics"]}
    assert topic_name in topics

    one = metadata(gateway, "-t", topic_name)
    assert one["brokers"] == everything["brokers"]
    [topic] = one["topics"]
    assert topic["topic"] == topic_name and "error" not in topic
    # Each partition led by one of them, its only replica and in-sync replica.
    leaders = [p["leader"] for p in topic["partitions"]]
    assert set(leaders) <= set(nodes), (leaders, nodes)
    assert topic["partitions"] == [
        {"partition": p, "leader": leader, "replicas": [{"id": leader}], "isrs": [{"id": leader}]}
        for p, leader in zip(range(3), leaders, strict=True)
    ]


def test_metadata_for_a_missing_topic(gateway, topic_name):
    # Without auto-creation: UNKNOWN_TOPIC_OR_PARTITION, as from Kafka.
    missing = metadata(gateway, "-t", topic_name, "-X", "allow.auto.create.topics=false")
    [topic] = missing["topics"]
    assert topic["error"] == "Broker: Unknown topic or partition"
    assert topic["partitions"] == []
    # kcat -L allows it by default, and the gateway has auto.create.topics.enable.
    [created] = metadata(gateway, "-t", topic_name)["topics"]
    assert "error" not in created and [p["partition"] for p in created["partitions"]] == [0]


# ------------------------------------------------------- produce / consume
def test_keys_headers_and_nulls_read_back_exactly(gateway, topic_name):
    create_topic(gateway, topic_name)
    lines = ["k1:v1", "k2:", ":v3", "ключ:значение ☃", "k5:with spaces and : colons"]
    # -Z sends empty keys and values as NULL; -H applies to every message.
    produce(gateway, topic_name, lines, "-K", ":", "-Z",
            "-H", "h1=x", "-H", "flag", "-H", "dup=1", "-H", "dup=2")
    messages = consume(gateway, topic_name)
    assert [m["offset"] for m in messages] == [0, 1, 2, 3, 4]
    assert [(m["key"], m["payload"]) for m in messages] == [
        ("k1", "v1"), ("k2", None), (None, "v3"), ("ключ", "значение ☃"),
        ("k5", "with spaces and : colons"),
    ]
    for m in messages:
        assert m["topic"] == topic_name and m["partition"] == 0
        assert m["tstype"] == "create" and m["ts"] > 0
        # Header order and repeated names survive; a header without value is null.
        assert m["headers"] == ["h1", "x", "flag", None, "dup", "1", "dup", "2"]

    # The same through -f: lengths are -1 for NULL.
    done = kcat(gateway, "-C", "-t", topic_name, "-p", "0", "-e", "-Z",
                "-f", "%o|%K|%S|%k|%s|%h\n")
    assert done.stdout.decode().splitlines() == [
        "0|2|2|k1|v1|h1=x,flag=NULL,dup=1,dup=2",
        "1|2|-1|k2|NULL|h1=x,flag=NULL,dup=1,dup=2",
        "2|-1|2|NULL|v3|h1=x,flag=NULL,dup=1,dup=2",
        f"3|{len('ключ'.encode())}|{len('значение ☃'.encode())}|ключ|значение ☃|"
        "h1=x,flag=NULL,dup=1,dup=2",
        "4|2|24|k5|with spaces and : colons|h1=x,flag=NULL,dup=1,dup=2",
    ]


def test_format_string_offsets_and_timestamps(gateway, topic_name):
    create_topic(gateway, topic_name, partitions=2)
    produce(gateway, topic_name, ["a:1", "b:2"], "-K", ":", partition=1)
    produce(gateway, topic_name, ["c:3"], "-K", ":", partition=1)
    stamps = [m["ts"] for m in consume(gateway, topic_name, partition=1)]
    assert len(stamps) == 3 and stamps == sorted(stamps)
    done = kcat(gateway, "-C", "-t", topic_name, "-p", "1", "-e",
                "-f", "Topic %t [%p] at offset %o: key %k: %s @%T\n")
    assert done.stdout.decode() == "".join(
        f"Topic {topic_name} [1] at offset {o}: key {k}: {v} @{ts}\n"
        for o, (k, v, ts) in enumerate(zip("abc", "123", stamps, strict=True))
    )
    assert consume(gateway, topic_name, partition=0) == []


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "zstd"])
def test_compression_codec(gateway, topic_name, stored_batches, codec):
    create_topic(gateway, topic_name)
    lines = [f"key-{i}:value {i} " + "abcdefgh" * (i % 7) for i in range(200)]
    # A long linger puts the 200 records into few batches, so they compress.
    produce(gateway, topic_name, lines, "-K", ":", "-X", f"compression.codec={codec}",
            "-X", "linger.ms=500")
    batches = stored_batches(topic_name, 0)
    assert {c for _, c, _ in batches} == {CODECS[codec]}, batches
    assert sum(n for _, _, n in batches) == 200
    messages = consume(gateway, topic_name)
    assert [m["offset"] for m in messages] == list(range(200))
    assert [f"{m['key']}:{m['payload']}" for m in messages] == lines


def test_lz4_compression_needs_find_coordinator(gateway, topic_name, stored_batches):
    """librdkafka 2.0.2 compresses with lz4 only for a broker that has FindCoordinator v0.

    Its "LZ4" feature is keyed on that API (a proxy for Kafka >= 0.10), so
    until the consumer-group APIs are advertised it sends lz4 batches
    uncompressed, without an error. A Kafka 3.4 broker gets lz4 batches.
    """
    create_topic(gateway, topic_name)
    lines = [f"value {i} " + "lz4" * (i % 11) for i in range(100)]
    produce(gateway, topic_name, lines, "-z", "lz4", "-X", "linger.ms=500")
    assert [m["payload"] for m in consume(gateway, topic_name)] == lines
    batches = stored_batches(topic_name, 0)
    assert {c for _, c, _ in batches} == {CODECS["lz4"]}, batches


def test_one_mib_record_and_message_too_large(gateway, topic_name, tmp_path):
    create_topic(gateway, topic_name, configs={"max.message.bytes": "2097152"})
    payload = os.urandom(1 << 20)  # binary, newlines and all: sent from a file
    (tmp_path / "big").write_bytes(payload)
    kcat(gateway, "-P", "-t", topic_name, "-p", "0", *BIG, str(tmp_path / "big"))
    kcat(gateway, "-P", "-t", topic_name, "-p", "0", input="small\n")
    done = kcat(gateway, "-C", "-t", topic_name, "-p", "0", "-c", "1", "-e", *BIG,
                "-f", "%s")
    assert done.stdout == payload
    done = kcat(gateway, "-C", "-t", topic_name, "-p", "0", "-e", *BIG, "-f", "%o %S\n")
    assert done.stdout.decode().splitlines() == [f"0 {1 << 20}", "1 5"]

    # Over the topic's max.message.bytes: refused by the gateway, nothing stored.
    (tmp_path / "huge").write_bytes(b"x" * (2 << 20))
    refused = kcat(gateway, "-P", "-t", topic_name, "-p", "0", *BIG, str(tmp_path / "huge"),
                   check=False)
    assert refused.returncode != 0
    assert b"Broker: Message size too large" in refused.stderr
    assert query(gateway, topic_name, 0, -1) == 2


def test_keyed_messages_across_partitions(gateway, topic_name):
    create_topic(gateway, topic_name, partitions=3)
    lines = [f"user-{i % 10}:event-{i}" for i in range(90)]
    produce(gateway, topic_name, lines, "-K", ":", partition=None)  # default partitioner
    messages = consume(gateway, topic_name, partition=None)
    assert sorted(f"{m['key']}:{m['payload']}" for m in messages) == sorted(lines)
    by_partition: dict[int, list[dict]] = {}
    for m in messages:
        by_partition.setdefault(m["partition"], []).append(m)
    owner = {}
    for partition, items in by_partition.items():
        assert [m["offset"] for m in items] == list(range(len(items)))
        # Order within a key is kept: its events arrive in produce order.
        for m in items:
            assert owner.setdefault(m["key"], partition) == partition
        for key in {m["key"] for m in items}:
            events = [int(m["payload"].split("-")[1]) for m in items if m["key"] == key]
            assert events == sorted(events)
    assert sum(query(gateway, topic_name, p, -1) for p in range(3)) == 90
    assert all(query(gateway, topic_name, p, -2) == 0 for p in range(3))


# ---------------------------------------------------------------- offsets
@pytest.fixture
def twelve(gateway, topic_name) -> list[dict]:
    """12 messages m0..m11 in three produce runs (three batches, three timestamps)."""
    create_topic(gateway, topic_name)
    for run in range(3):
        if run:
            time.sleep(0.05)  # each run's records get a later timestamp
        produce(gateway, topic_name, [f"m{i}" for i in range(4 * run, 4 * run + 4)])
    messages = consume(gateway, topic_name)
    assert [m["payload"] for m in messages] == [f"m{i}" for i in range(12)]
    return messages


def offsets(messages: list[dict]) -> list[int]:
    return [m["offset"] for m in messages]


def test_offsets_beginning_end_absolute_relative(gateway, topic_name, twelve):
    assert offsets(consume(gateway, topic_name, "-o", "beginning")) == list(range(12))
    assert offsets(consume(gateway, topic_name, "-o", "5")) == list(range(5, 12))
    assert offsets(consume(gateway, topic_name, "-o", "-3")) == [9, 10, 11]
    assert offsets(consume(gateway, topic_name, "-o", "-12")) == list(range(12))
    assert consume(gateway, topic_name, "-o", "end") == []
    # Past the end: OFFSET_OUT_OF_RANGE, and librdkafka resets to the end.
    out_of_range = kcat(gateway, "-C", "-t", topic_name, "-p", "0", "-e", "-o", "1000", "-J")
    assert out_of_range.stdout == b""
    assert b"Offset out of range" in out_of_range.stderr
    assert (query(gateway, topic_name, 0, -2), query(gateway, topic_name, 0, -1)) == (0, 12)


def test_consume_by_timestamp_and_query(gateway, topic_name, twelve):
    stamps = [m["ts"] for m in twelve]
    assert stamps[3] < stamps[4] and stamps[7] < stamps[8]

    def first_at_or_after(ts: int) -> int:
        return next((o for o, t in enumerate(stamps) if t >= ts), -1)

    for target in (stamps[0] - 1000, stamps[0], stamps[0] + 1, stamps[4], stamps[8],
                   stamps[11] + 1):
        expected = first_at_or_after(target)
        assert query(gateway, topic_name, 0, target) == expected, target
        got = offsets(consume(gateway, topic_name, "-o", f"s@{target}"))
        assert got == (list(range(expected, 12)) if expected >= 0 else []), target

    # s@ start, e@ stop (not included): the second run exactly.
    window = consume(gateway, topic_name, "-o", f"s@{stamps[4]}", "-o", f"e@{stamps[8]}")
    assert offsets(window) == [4, 5, 6, 7]


def test_consumer_at_end_is_woken_by_new_records(gateway, topic_name, twelve):
    """-o end without -e: the long-polling fetch returns when a record arrives."""
    assert KCAT
    consumer = subprocess.Popen(
        [KCAT, "-b", gateway.bootstrap, "-C", "-t", topic_name, "-p", "0", "-o", "end",
         "-c", "1", "-J", "-X", "fetch.wait.max.ms=10000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        # The consumer's start position is "end" when it resolves it, which this
        # test cannot see: keep producing until it has read one record.
        deadline = time.monotonic() + 60
        sent = 0
        while consumer.poll() is None and time.monotonic() < deadline:
            produce(gateway, topic_name, [f"late-{sent}"])
            sent += 1
            with contextlib.suppress(subprocess.TimeoutExpired):
                consumer.wait(timeout=1)
        out, err = consumer.communicate(timeout=10)
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.wait()
    assert consumer.returncode == 0, err.decode()
    [message] = [json.loads(line) for line in out.decode().splitlines()]
    # Never a record from before it started, and the record at that offset.
    assert message["offset"] >= 12
    assert message["payload"] == f"late-{message['offset'] - 12}"


# ---------------------------------------------------------------- recovery
def test_kill_9_round_trip(gateway, topic_name):
    create_topic(gateway, topic_name, partitions=2)
    sent = {0: [f"p0-{i}" for i in range(300)], 1: [f"p1-{i}" for i in range(300)]}
    produce(gateway, topic_name, sent[0][:150], "-z", "gzip", partition=0)
    produce(gateway, topic_name, sent[0][150:], partition=0)
    produce(gateway, topic_name, sent[1], "-X", "compression.codec=zstd", "-X",
            "linger.ms=100", partition=1)

    gateway.kill()  # kill -9: acked data must be in the WAL
    gateway.start()

    assert [t["topic"] for t in metadata(gateway, "-t", topic_name)["topics"]] == [topic_name]
    for partition, values in sent.items():
        messages = consume(gateway, topic_name, partition=partition)
        assert [m["payload"] for m in messages] == values
        assert offsets(messages) == list(range(300))
        assert query(gateway, topic_name, partition, -1) == 300
    # Appends after the restart continue the log.
    produce(gateway, topic_name, ["after"], partition=0)
    [last] = consume(gateway, topic_name, "-o", "-1", partition=0)
    assert (last["offset"], last["payload"]) == (300, "after")
