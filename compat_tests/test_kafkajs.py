"""kafkajs 2.2.4 (Node.js) against the gateway, through the scripts in js/.

Each script takes the bootstrap address and a topic, prints one JSON document
and exits non-zero on failure; these tests assert on that JSON, and read what
kafkajs wrote back with kcat and over the wire (the codec of stored batches).

kafkajs has None and GZIP built in. Snappy, LZ4 and ZSTD come from
kafkajs-snappy, kafkajs-lz4 and @sensejs/kafkajs-zstd-support (see
js/package.json; @kafkajs/zstd does not build on Node 20).

The kafkajs consumer is always a group member, so ``test_group_consumer_*``
need the consumer-group APIs (FindCoordinator, JoinGroup, SyncGroup,
Heartbeat, OffsetCommit, OffsetFetch).

Needs Node.js and ``cd compat_tests/js && npm ci`` (the tests fail, not skip,
without them).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from compat_helpers import CODECS, create_topic, kcat

JS_DIR = Path(__file__).resolve().parent / "js"


def run_js(gateway, script: str, topic: str, *args: str, timeout: float = 150) -> dict:
    """Run ``node js/SCRIPT BOOTSTRAP TOPIC ARGS``; it must exit 0; returns its JSON."""
    node = shutil.which("node")
    assert node, "Node.js is not installed (Debian: apt-get install -y nodejs npm)"
    assert (JS_DIR / "node_modules" / "kafkajs").is_dir(), (
        f"kafkajs is not installed in {JS_DIR}: run `cd compat_tests/js && npm ci` "
        "(or npm install) first"
    )
    command = [node, script, gateway.bootstrap, topic, *args]
    try:
        done = subprocess.run(command, cwd=JS_DIR, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(
            f"{' '.join(command)} did not finish in {timeout}s; stderr:\n{exc.stderr}\n"
            f"gateway log tail:\n{gateway.output()[-3000:]}"
        ) from None
    assert done.returncode == 0, (
        f"{' '.join(command)} exited {done.returncode}; stderr:\n{done.stderr[-6000:]}\n"
        f"gateway log tail:\n{gateway.output()[-3000:]}"
    )
    return json.loads(done.stdout)


def kcat_messages(gateway, topic: str, partition: int) -> list[dict]:
    done = kcat(gateway, "-C", "-t", topic, "-p", str(partition), "-e", "-J")
    return [json.loads(line) for line in done.stdout.decode().splitlines() if line]


def flat_headers(headers: dict) -> list:
    """kafkajs headers ({key: value or [values]}) as kcat lists them: [k, v, k, v...]."""
    out = []
    for key, value in headers.items():
        for item in value if isinstance(value, list) else [value]:
            out += [key, item]
    return out


# -------------------------------------------------------------------- admin
def test_admin_create_topics_metadata_and_delete(gateway, topic_name):
    result = run_js(gateway, "admin.js", topic_name)
    assert result["created"] is True
    assert result["createdAgain"] is False  # TOPIC_ALREADY_EXISTS, as kafkajs reports it
    assert [e["type"] for e in result["badReplication"]["errors"]] == [
        "INVALID_REPLICATION_FACTOR"]

    [topic] = result["topics"]
    assert topic["name"] == topic_name
    # The brokers the test started: the gateway (node 0), and on a cluster
    # (KAFKA_GATEWAY_TEST_STORE=postgresql-cluster) its two siblings; each
    # partition led by one of them, its only replica and in-sync replica.
    nodes = gateway.nodes()
    leaders = [p["leader"] for p in topic["partitions"]]
    assert set(leaders) <= set(nodes), (leaders, sorted(nodes))
    assert topic["partitions"] == [
        {"partitionId": p, "partitionErrorCode": 0, "leader": leader, "replicas": [leader],
         "isr": [leader]}
        for p, leader in zip(range(3), leaders, strict=True)
    ]
    cluster = result["cluster"]
    assert sorted(cluster["brokers"], key=lambda b: b["nodeId"]) == [
        {"nodeId": node, "host": "127.0.0.1", "port": member.port}
        for node, member in sorted(nodes.items())]
    assert cluster["controller"] in nodes
    assert cluster["clusterId"]

    [configs] = result["configs"]
    assert configs["errorCode"] == 0 and configs["resourceName"] == topic_name
    entries = configs["entries"]
    override = {"isDefault": False, "source": 1, "readOnly": False}  # TOPIC_CONFIG
    assert entries["retention.ms"] == {"value": "3600000", **override}
    assert entries["max.message.bytes"] == {"value": "2097152", **override}
    assert entries["cleanup.policy"] == {"value": "delete", **override}
    assert entries["segment.bytes"] == {"value": "1073741824", "isDefault": True,
                                        "source": 5, "readOnly": False}  # DEFAULT_CONFIG
    assert result["listed"] == {"topic": True, "doomedBefore": True, "doomedAfter": False}
    # What kafkajs created is what other clients see.
    assert kcat(gateway, "-Q", "-t", f"{topic_name}:2:-1").stdout.split()[-1] == b"0"


def test_admin_describe_and_alter_configs_round_trip(gateway, topic_name):
    result = run_js(gateway, "configs.js", topic_name)
    default = {"isDefault": True, "source": 5}
    override = {"isDefault": False, "source": 1}
    assert result["initial"] == {
        "retention.ms": {"value": "3600000", **override},
        "retention.bytes": {"value": "-1", **default},
        "max.message.bytes": {"value": "1048588", **default},
    }
    assert result["altered"] == [{"errorCode": 0, "name": topic_name}]
    # AlterConfigs replaces the whole set: retention.ms, not named, is back to its default.
    after = {
        "retention.ms": {"value": "604800000", **default},
        "retention.bytes": {"value": "1048576", **override},
        "max.message.bytes": {"value": "500000", **override},
    }
    assert result["afterAlter"] == after
    assert result["afterValidateOnly"] == after
    assert result["invalid"]["type"] == "INVALID_CONFIG"
    assert result["afterInvalid"] == after
    assert result["broker"]["errorCode"] == 0
    assert result["broker"]["entries"]["num.partitions"]["value"] == "1"


# ----------------------------------------------------------------- producer
@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_producer_codec_keys_headers_nulls(gateway, topic_name, stored_batches, codec):
    result = run_js(gateway, "produce.js", topic_name, codec)
    [send] = result["sends"]
    assert send == {"codec": codec, "results": [
        {"partition": 0, "errorCode": 0, "baseOffset": "0"},
        {"partition": 1, "errorCode": 0, "baseOffset": "0"},
    ]}
    assert result["offsets"] == [
        {"partition": p, "offset": "20", "high": "20", "low": "0"} for p in (0, 1)]
    for partition in (0, 1):
        # One batch per partition, in the codec asked for.
        assert stored_batches(topic_name, partition) == [(0, CODECS[codec], 20)]
        sent = [m for m in result["sent"] if m["partition"] == partition]
        got = kcat_messages(gateway, topic_name, partition)
        assert [m["offset"] for m in got] == list(range(20))
        assert [(m["key"], m["payload"], m["ts"], m["headers"]) for m in got] == [
            (m["key"], m["value"], m["timestamp"], flat_headers(m["headers"])) for m in sent]
    nulls = [m for m in result["sent"] if m["key"] is None or m["value"] is None]
    assert len(nulls) == 2  # a null key and a tombstone


def test_producer_all_codecs_in_one_topic(gateway, topic_name, stored_batches):
    codecs = ["gzip", "none", "zstd", "snappy", "lz4"]
    result = run_js(gateway, "produce.js", topic_name, *codecs)
    assert [s["results"][0]["baseOffset"] for s in result["sends"]] == [
        str(20 * i) for i in range(5)]
    assert stored_batches(topic_name, 1) == [
        (20 * i, CODECS[c], 20) for i, c in enumerate(codecs)]
    got = kcat_messages(gateway, topic_name, 1)
    assert [m["payload"] for m in got] == [
        m["value"] for m in result["sent"] if m["partition"] == 1]


def test_producer_acks_0_big_record_too_large_and_create_partitions(gateway, topic_name):
    result = run_js(gateway, "producer_extras.js", topic_name)
    assert result["acks0"] == []  # acks=0: no answer, and the connection goes on
    assert result["acks1"] == [{"partition": 0, "errorCode": 0, "baseOffset": "2"}]
    assert result["big"] == [{"partition": 0, "errorCode": 0, "baseOffset": "3"}]
    assert result["tooLarge"]["type"] == "MESSAGE_TOO_LARGE"
    assert result["partitions"] == [0, 1, 2]
    assert [(o["partition"], o["high"]) for o in result["offsets"]] == [
        (0, "4"), (1, "0"), (2, "0")]
    done = kcat(gateway, "-C", "-t", topic_name, "-p", "0", "-e", "-f", "%o %k %S\n",
                "-X", "max.partition.fetch.bytes=4194304")
    assert done.stdout.decode().splitlines() == [
        "0  2", "1  2", "2  2", f"3 big {1 << 20}"]


# ------------------------------------------------------------------ offsets
def test_fetch_topic_offsets_by_timestamp_and_delete_records(gateway, topic_name):
    result = run_js(gateway, "offsets.js", topic_name)

    def marks(*pairs):
        return [{"partition": p, "offset": str(high), "high": str(high), "low": str(low)}
                for p, (low, high) in enumerate(pairs)]

    def offsets(*values):
        return [{"partition": p, "offset": str(v)} for p, v in enumerate(values)]

    assert result["empty"] == marks((0, 0), (0, 0))
    assert result["produced"] == marks((0, 10), (0, 3))
    # Partition 0 is stamped base + 1000 * i, partition 1 base + 1000 * (20 + i);
    # no record at or after the time: kafkajs answers the high watermark.
    assert result["lookups"] == {
        "beforeAll": offsets(0, 0),
        "first": offsets(0, 0),
        "exact5": offsets(5, 0),
        "between4and5": offsets(5, 0),
        "last": offsets(9, 0),
        "inPartition1Batch": offsets(10, 1),
        "afterAll": offsets(10, 3),
    }
    deleted = result["deleted"]
    assert deleted[0]["ok"] and deleted[0]["watermarks"] == marks((4, 10), (0, 3))
    assert deleted[1]["ok"] and deleted[1]["watermarks"] == marks((4, 10), (3, 3))
    assert deleted[2]["ok"] and deleted[2]["watermarks"] == marks((4, 10), (3, 3))
    assert not deleted[3]["ok"]
    assert deleted[3]["error"]["partitions"] == [{"partition": 0, "type": "OFFSET_OUT_OF_RANGE"}]
    # By timestamp after the deletion: the first record still there.
    assert result["afterDelete"] == offsets(4, 3)
    got = kcat_messages(gateway, topic_name, 0)
    assert [(m["offset"], m["payload"]) for m in got] == [(i, f"p0-{i}") for i in range(4, 10)]


# ------------------------------------------ consumer (needs consumer groups)
def test_group_consumer_from_earliest_every_codec(gateway, topic_name):
    codecs = ["none", "gzip", "snappy", "lz4", "zstd"]
    produced = run_js(gateway, "produce.js", topic_name, *codecs)
    result = run_js(gateway, "consume.js", topic_name, "earliest", "200")
    assert result["assigned"] == {topic_name: [0, 1]}
    for partition in (0, 1):
        got = [m for m in result["received"] if m["partition"] == partition]
        sent = [m for m in produced["sent"] if m["partition"] == partition]
        assert [m["offset"] for m in got] == list(range(100))
        assert [(m["key"], m["value"], m["timestamp"], m["headers"]) for m in got] == [
            (m["key"], m["value"], m["timestamp"], m["headers"]) for m in sent]
    # Offsets were committed as they were processed, and stop() committed the rest.
    assert result["committed"] == [{"partition": 0, "offset": "100"},
                                   {"partition": 1, "offset": "100"}]


def test_group_consumer_from_latest(gateway, topic_name):
    create_topic(gateway, topic_name)
    kcat(gateway, "-P", "-t", topic_name, "-p", "0",
         input="".join(f"old-{i}\n" for i in range(5)))
    result = run_js(gateway, "consume.js", topic_name, "latest")
    assert result["received"], "nothing received"
    first = result["received"][0]
    # Nothing from before the group started; the first record is one sent after.
    assert not [m for m in result["received"] if m["value"].startswith("old-")]
    assert first["offset"] >= 5
    assert first["value"] == f"new-{first['offset'] - 5}"
    assert first["value"] in result["sent"]
    last = result["received"][-1]["offset"]
    assert result["committed"] == [{"partition": 0, "offset": str(last + 1)}]


def test_group_consumer_seeks_to_offset_found_by_timestamp(gateway, topic_name):
    create_topic(gateway, topic_name)
    for run in range(3):  # three batches with increasing timestamps
        if run:
            time.sleep(0.05)
        kcat(gateway, "-P", "-t", topic_name, "-p", "0",
             input="".join(f"m{i}\n" for i in range(4 * run, 4 * run + 4)))
    stamps = [m["ts"] for m in kcat_messages(gateway, topic_name, 0)]
    target = stamps[4]
    expected = next(o for o, ts in enumerate(stamps) if ts >= target)
    assert expected == 4
    result = run_js(gateway, "consume.js", topic_name, "timestamp", str(target),
                    str(12 - expected))
    assert result["seekTo"] == [{"partition": 0, "offset": str(expected)}]
    assert [m["offset"] for m in result["received"]] == list(range(expected, 12))
    assert [m["value"] for m in result["received"]] == [f"m{i}" for i in range(expected, 12)]
    assert all(m["timestamp"] >= target for m in result["received"])


def test_group_consumer_long_poll_is_woken_by_a_new_record(gateway, topic_name):
    create_topic(gateway, topic_name)
    result = run_js(gateway, "consume.js", topic_name, "longpoll")
    # While idle the fetch stayed parked (no answers for 3 s of a 20 s max wait)...
    assert result["fetchesDuringIdle"] == 0
    # ...and the record came back before that wait was over.
    assert [m["value"] for m in result["received"]] == ["wake-up"]
    assert result["elapsedMs"] < result["maxWaitMs"]
