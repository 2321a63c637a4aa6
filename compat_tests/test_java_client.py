"""The Java client (kafka-clients 3.4.1, the reference client) against the gateway:
admin, producing with every codec, assign/seek, kill -9 while producing. The
admin tests and the default producer run on the 4.x client too
(``java_line_classes``).

The programs in jvm/src/javaclient/ are compiled by javac at test time (the
``java_classes`` fixture); each runs one scenario and prints one JSON object
per line, which these tests assert with exact counts, offsets and values.
What the client sent is also read back over the wire (``stored_batches``).

Producers run with the client's defaults: idempotent, acks=all (see
Kit.producer()). Consumer groups: test_groups_java.py; transactions:
test_txn_java.py.
"""

from __future__ import annotations

import time

import pytest
from compat_helpers import CODECS, create_topic
from confluent_kafka.admin import AdminClient
from java_helpers import JavaProcess, by_op, run_java, step

from testkit import jvm

# Record timestamps are this plus a few ms: an hour ago, well inside the
# default retention.ms (7 days), which the gateway enforces in the background.
BASE_TS = (int(time.time()) - 3600) * 1000

# (value, source, read-only, sensitive, type) of the configs AdminCheck watches.
DEFAULTS = {
    "retention.ms": ["604800000", "DEFAULT_CONFIG", False, False, "LONG"],
    "max.message.bytes": ["1048588", "DEFAULT_CONFIG", False, False, "INT"],
    "cleanup.policy": ["delete", "DEFAULT_CONFIG", False, False, "LIST"],
    "segment.bytes": ["1073741824", "DEFAULT_CONFIG", False, False, "INT"],
}
# The topic configs Kafka 3.4.1 describes (its internal tiered-storage ones,
# remote.storage.enable and local.retention.*, only once a topic sets them).
TOPIC_CONFIGS = 26


def watched(overrides: dict[str, str]) -> dict:
    """DEFAULTS with some configs set on the topic (DYNAMIC_TOPIC_CONFIG)."""
    out = {name: list(entry) for name, entry in DEFAULTS.items()}
    for name, value in overrides.items():
        out[name][:2] = [value, "DYNAMIC_TOPIC_CONFIG"]
    return out


# -------------------------------------------------------------------- admin
def test_admin_topics_configs_and_partitions(gateway, java_line_classes, topic_name):
    """createTopics with a config, listTopics, describeTopics, describeConfigs,
    incrementalAlterConfigs (SET, DELETE, invalid), the legacy alterConfigs,
    createPartitions (grow, shrink refused), duplicate create, deleteTopics."""
    lines = run_java(gateway, java_line_classes, "AdminCheck", "topics", "--topic", topic_name)
    assert [line["op"] for line in lines] == [
        "create", "list", "describe", "configs", "alter_set", "configs_after_set",
        "alter_delete", "configs_after_delete", "alter_invalid", "configs_after_invalid",
        "alter_legacy", "configs_after_legacy", "grow", "describe", "shrink", "create_again",
        "delete", "list_after_delete", "describe_deleted"]
    ops = by_op(lines)

    created = step(lines, "create")
    topic_id = created.pop("topic_id")
    assert created == {"partitions": 2, "replication": 1, "retention.ms": "3600000"}
    assert len(topic_id) == 22 and topic_id != "A" * 22  # a real (base64) topic id
    assert step(lines, "list") == {"present": True}

    # Each partition led by a broker the test started (the gateway, node 0,
    # or on a cluster one of its three), its only replica and in-sync replica.
    nodes = gateway.nodes()

    def partitions(found: dict, count: int) -> list[dict]:
        leaders = [p["leader"] for p in found["partitions"]]
        assert set(leaders) <= set(nodes), (leaders, sorted(nodes))
        return [{"partition": p, "leader": leader, "replicas": [leader], "isr": [leader]}
                for p, leader in zip(range(count), leaders, strict=True)]

    before, after = ops["describe"]
    assert before == {"op": "describe", "name": topic_name, "internal": False,
                      "topic_id": topic_id, "partitions": partitions(before, 2)}
    assert after == {**before, "partitions": partitions(after, 4)}

    def configs(op: str) -> dict:
        found = step(lines, op)
        assert found["count"] == TOPIC_CONFIGS, found
        return found["watched"]

    assert configs("configs") == watched({"retention.ms": "3600000"})
    assert step(lines, "alter_set") == {"ok": True}
    assert configs("configs_after_set") == watched({"retention.ms": "7200000",
                                                    "max.message.bytes": "2000000"})
    assert step(lines, "alter_delete") == {"ok": True}
    assert configs("configs_after_delete") == watched({"max.message.bytes": "2000000"})
    invalid = step(lines, "alter_invalid")
    assert (invalid["ok"], invalid["error"]) == (False, "InvalidConfigurationException")
    assert "retention.ms" in invalid["message"]
    assert configs("configs_after_invalid") == watched({"max.message.bytes": "2000000"})
    if jvm.classes_pom(java_line_classes) == jvm.POM:
        # AlterConfigs replaces the topic's overrides: max.message.bytes is back to its default.
        assert step(lines, "alter_legacy") == {"ok": True}
        assert configs("configs_after_legacy") == watched({"segment.bytes": "536870912"})
    else:
        # The 4.x client has no Admin.alterConfigs (removed in Kafka 4.0): no
        # request is sent, nothing changes.
        legacy = step(lines, "alter_legacy")
        assert (legacy["ok"], legacy["error"]) == (False, "NoSuchMethodException")
        assert configs("configs_after_legacy") == watched({"max.message.bytes": "2000000"})

    assert step(lines, "grow") == {"ok": True}
    shrink = step(lines, "shrink")
    assert (shrink["ok"], shrink["error"]) == (False, "InvalidPartitionsException")
    again = step(lines, "create_again")
    assert (again["ok"], again["error"]) == (False, "TopicExistsException")
    assert step(lines, "delete") == {"ok": True}
    assert step(lines, "list_after_delete") == {"present": False}
    deleted = step(lines, "describe_deleted")
    assert (deleted["ok"], deleted["error"]) == (False, "UnknownTopicOrPartitionException")


def test_admin_describe_cluster(gateway, java_line_classes):
    """The brokers the test started (one node; a cluster's three), on the
    addresses clients bootstrap from; one of them the controller."""
    cluster = step(run_java(gateway, java_line_classes, "AdminCheck", "cluster"), "cluster")
    # The program ran on the client line it was compiled for.
    assert cluster.pop("client_version") == jvm.kafka_version(
        jvm.classes_pom(java_line_classes))
    nodes = [{"id": node, "host": "127.0.0.1", "port": member.port}
             for node, member in sorted(gateway.nodes().items())]
    assert cluster["controller"] in nodes
    assert sorted(cluster["nodes"], key=lambda n: n["id"]) == [
        {**node, "rack": None} for node in nodes]
    # The same cluster id librdkafka reads from Metadata.
    metadata = AdminClient({"bootstrap.servers": gateway.bootstrap}).list_topics(timeout=30)
    assert cluster["cluster_id"] == metadata.cluster_id and cluster["cluster_id"]


def test_admin_list_offsets_and_delete_records(gateway, java_line_classes, topic_name,
                                               stored_batches):
    """listOffsets with every OffsetSpec at both isolation levels, exact offsets;
    deleteRecords moves the earliest offset, past the end is refused."""
    lines = run_java(gateway, java_line_classes, "AdminCheck", "offsets", "--topic", topic_name,
                     "--base-timestamp", str(BASE_TS))
    # Two batches of ten; record i is stamped BASE_TS + 10 i, except record 14,
    # in the middle of the second batch, which holds the largest timestamp.
    assert stored_batches(topic_name, 0) == [(0, 0, 10), (10, 0, 10)]
    lines += run_java(gateway, java_line_classes, "AdminCheck", "delete-records", "--topic",
                      topic_name, "--base-timestamp", str(BASE_TS))
    listed = {(line["phase"], line["isolation"]): line["found"]
              for line in lines if line["op"] == "list_offsets"}
    # [offset, timestamp - BASE_TS]: timestamp -1 where Kafka reports none.
    before = {
        "earliest": [0, -1], "latest": [20, -1], "max_timestamp": [14, 100_000],
        "ts-1": [0, 0],  # before every record: the first
        "ts30": [3, 30],  # exactly record 3's
        "ts35": [4, 40],  # between records 3 and 4: the next one
        # the first record (by offset) stamped at or after it: 14, ahead of 16 and 19
        "ts155": [14, 100_000], "ts190": [14, 100_000],
        "ts100000": [14, 100_000],
        "ts100001": [-1, -1],  # after every record: none
    }
    # After deleting below 13, lookups start at the new log start offset.
    after = {**before, "earliest": [13, -1], "ts-1": [13, 130], "ts30": [13, 130],
             "ts35": [13, 130]}
    # Nothing left: no record to find by timestamp. (Kafka 3.4.1 still answers
    # max_timestamp with the deleted record 14, below its log start offset.)
    emptied = {spec: [-1, -1] for spec in before} | {"earliest": [20, -1], "latest": [20, -1]}
    for phase, expected in (("before_delete", before), ("after_delete", after),
                            ("after_delete_all", emptied)):
        for isolation in ("READ_UNCOMMITTED", "READ_COMMITTED"):
            assert listed.pop((phase, isolation)) == expected, (phase, isolation)
    assert listed == {}

    ops = by_op(lines)
    assert [line["value"] for line in ops["low_watermark"]] == [13, 20]
    assert step(lines, "delete_records_13") == {"ok": True}
    past_end = step(lines, "delete_records_past_end")
    assert (past_end["ok"], past_end["error"]) == (False, "OffsetOutOfRangeException")
    assert step(lines, "delete_records_all") == {"ok": True}
    assert stored_batches(topic_name, 0) == []


# ----------------------------------------------------------------- produce
def expected_records(codec: str, count: int) -> list[dict]:
    """What ProduceCheck records sends: keys, two headers, every tenth value null."""
    return [{"partition": 0, "offset": i, "key": f"k{i}",
             "value": None if i % 10 == 0 else f"value-{i}" * 20,
             "headers": [["index", str(i)], ["codec", codec]]} for i in range(count)]


def dump(gateway, java_classes, topic: str, partitions: int = 1) -> tuple[list, list]:
    """(watermarks per partition, every record) as the Java consumer reads them."""
    lines = run_java(gateway, java_classes, "ConsumeCheck", "dump", "--topic", topic,
                     "--partitions", str(partitions))
    marks = [(line["partition"], line["start"], line["end"]) for line in lines
             if line.get("op") == "watermarks"]
    return marks, [line for line in lines if "op" not in line]


@pytest.mark.parametrize("codec", list(CODECS))
def test_produce_codec_keys_headers_nulls(gateway, java_classes, topic_name, stored_batches,
                                          codec):
    """acks=all with each codec: every ack in order, batches stored with that
    codec, and the Java consumer reads back keys, headers and null values."""
    create_topic(gateway, topic_name)
    lines = run_java(gateway, java_classes, "ProduceCheck", "records", "--topic", topic_name,
                     "--codec", codec, "--count", "300")
    assert lines == [{"ack": i, "partition": 0, "offset": i} for i in range(300)]

    batches = stored_batches(topic_name, 0)
    assert {c for _, c, _ in batches} == {CODECS[codec]}
    assert sum(n for *_, n in batches) == 300
    assert len(batches) < 300  # linger.ms=5: records travel in shared batches

    marks, records = dump(gateway, java_classes, topic_name)
    assert marks == [(0, 0, 300)]
    for record in records:
        assert record.pop("timestamp") > BASE_TS  # CreateTime: the producer's clock
    assert records == expected_records(codec, 300)


def test_default_producer_is_idempotent_and_succeeds(gateway, java_line_classes, topic_name):
    """The Java client's default producer is idempotent: it asks for a producer
    id (InitProducerId) first, then sends with sequences. Its one record lands
    at offset 0, stored once."""
    create_topic(gateway, topic_name)
    sent = step(run_java(gateway, java_line_classes, "ProduceCheck", "default", "--topic",
                         topic_name), "send")
    assert (sent["ok"], sent["offset"]) == (True, 0), sent
    marks, records = dump(gateway, java_line_classes, topic_name)
    assert marks == [(0, 0, 1)] and [r["value"] for r in records] == ["default"]


# ----------------------------------------------------------------- consume
def test_assign_seek_inside_batches_and_offsets_for_times(gateway, java_classes, topic_name,
                                                          stored_batches):
    """seek() into the middle of a compressed batch starts exactly there;
    seekToBeginning, seekToEnd, offsetsForTimes; both isolation levels."""
    create_topic(gateway, topic_name)
    acks = run_java(gateway, java_classes, "ProduceCheck", "batches", "--topic", topic_name,
                    "--codec", "lz4", "--sizes", "10,10", "--base-timestamp", str(BASE_TS))
    assert [line["offset"] for line in acks] == list(range(20))
    assert stored_batches(topic_name, 0) == [(0, CODECS["lz4"], 10), (10, CODECS["lz4"], 10)]

    lines = run_java(gateway, java_classes, "ConsumeCheck", "seek", "--topic", topic_name,
                     "--base-timestamp", str(BASE_TS))
    for isolation in ("read_uncommitted", "read_committed"):
        mine = [line for line in lines if line["isolation"] == isolation]
        assert mine[0] == {"op": "bounds", "isolation": isolation, "beginning": 0, "end": 20}
        seeks = {line["to"]: line["read"] for line in mine if line["op"] == "seek"}
        assert seeks == {start: list(range(start, 20)) for start in (5, 13, 10, 19, 0)}
        [begin] = [line for line in mine if line["op"] == "seek_to_beginning"]
        assert (begin["position"], begin["read"]) == (0, list(range(20)))
        [end] = [line for line in mine if line["op"] == "seek_to_end"]
        assert (end["position"], end["polled"]) == (20, 0)
        by_time = {line["ts"]: (line["offset"], line["timestamp"], line["read"])
                   for line in mine if line["op"] == "offsets_for_times"}
        assert by_time == {
            -1: (0, 0, list(range(20))),  # before every record
            40: (4, 40, list(range(4, 20))),  # exactly record 4's
            45: (5, 50, list(range(5, 20))),  # between 4 and 5: the next one
            185: (19, 190, [19]),  # the last record, inside the second batch
            1000: (None, None, []),  # after every record: none
        }


# ------------------------------------------------------------------ faults
def test_kill_9_while_producing_keeps_every_acknowledged_record(gateway, java_classes,
                                                                topic_name):
    """kill -9 of the gateway while a Java producer streams to 3 partitions, then
    a restart on the same port and data dir: the producer resumes, and every
    acknowledged record is read back exactly once, in order, at its offset.

    The producer is idempotent and retries (ProduceCheck stream): a batch whose
    answer was lost in the kill is retried and recognised as a duplicate by the
    sequences stored with the data, so no record is stored twice. A record
    whose send failed may or may not be stored, but never twice.
    """
    create_topic(gateway, topic_name, partitions=3)
    stream = JavaProcess(gateway, java_classes, "ProduceCheck", "stream", "--topic",
                         topic_name, "--partitions", "3", "--max", "30000")

    def acks(lines: list[dict]) -> int:
        return sum("ack" in line for line in lines)

    try:
        stream.wait_until(lambda lines: acks(lines) >= 300, 120, "300 acks before the kill")
        gateway.kill()
        time.sleep(1)  # the producer keeps sending into the outage
        gateway.start()
        resumed_from = acks(stream.lines)
        stream.wait_until(lambda lines: acks(lines) >= resumed_from + 300, 120,
                          "300 more acks after the restart")
        lines = stream.finish()
    finally:
        stream.kill()

    summary = step(lines, "summary")
    sends = [line for line in lines if "op" not in line]
    acked = {line["ack"]: (line["partition"], line["offset"]) for line in sends if "ack" in line}
    failed = {line["failed"] for line in sends if "failed" in line}
    assert len(acked) == summary["acked"] >= 600
    assert len(failed) == summary["failed"]
    assert sorted([*acked, *failed]) == list(range(summary["sent"])), "every send answered"

    marks, records = dump(gateway, java_classes, topic_name, partitions=3)
    assert marks == [(p, 0, sum(r["partition"] == p for r in records)) for p in range(3)]
    stored = {(r["partition"], r["offset"]): int(r["value"][1:]) for r in records}
    # Every acknowledged record is where its ack said, and nowhere else.
    for index, where in acked.items():
        assert stored[where] == index, (index, where)
    values = [r["value"] for r in records]
    assert len(values) == len(set(values)), "no record is stored twice"
    assert set(stored.values()) - set(acked) <= failed
    for partition in range(3):
        log = [int(r["value"][1:]) for r in records if r["partition"] == partition]
        assert log == sorted(log), f"partition {partition} keeps the send order"
        assert all(index % 3 == partition for index in log)
