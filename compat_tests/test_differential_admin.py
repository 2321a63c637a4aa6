"""Differential: bad input and configs, through raw requests, Apache Kafka 3.4.1 vs the gateway.

Error codes for bad topic names (invalid, too long, colliding after '.'->'_'),
bad partition counts and replication factors, records over max.message.bytes,
invalid acks, unknown topics and partitions; every topic config value Kafka's
ConfigDef refuses (or takes) in CreateTopics, IncrementalAlterConfigs and
AlterConfigs; DescribeConfigs of a default topic and of one with overrides,
with and without synonyms, at every version. Every response field is compared.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from differences import EXPECTED

from kafka_gateway.codec import build, request_schema
from testkit import kafka_requests as rq
from testkit.batches import Record, encode_batch
from testkit.differential import CLOSED
from testkit.kafka_requests import APPEND, BROKER, DELETE, SET, SUBTRACT, TOPIC
from testkit.server_pair import Pair, run_pair, unique_name


# ---------------------------------------------------------------- topic names etc.
def test_bad_topics_partitions_and_replication(kafka_broker, gateway):
    u = uuid.uuid4().hex[:8]

    async def scenario(pair: Pair) -> None:
        names = {"empty": "", "dot": ".", "dots": "..", "space": "a b", "slash": "a/b",
                 "accent": "tést", "too-long": "a" * 250, "longest": f"{u}-" + "x" * 240}
        for label, name in names.items():
            await pair.check(f"topic-name/{label}", rq.create_topics([(name, 1)]))
        await pair.check("topic-name/metadata-invalid", rq.metadata(["a b", "..", "a" * 250]))
        await pair.check("topic-name/delete-invalid", rq.delete_topics(["a b"]))
        # Colliding after '.' -> '_', both ways, and validate-only.
        await pair.create_topic("collision/first", f"col.lide-{u}")
        await pair.check("collision/second", rq.create_topics([(f"col_lide-{u}", 1)]))
        await pair.check("collision/second-validate-only",
                         rq.create_topics([(f"col_lide-{u}", 1)], validate_only=True))
        await pair.check("collision/same-again", rq.create_topics([(f"col.lide-{u}", 1)]))
        await pair.create_topic("collision/underscore-first", f"coll_2-{u}")
        await pair.check("collision/dot-second", rq.create_topics([(f"coll.2-{u}", 1)]))
        await pair.check("collision/with-bad-config",
                         rq.create_topics([(f"col_lide-{u}", 1, 1, {"retention.ms": "x"})]))
        await pair.check("collision/after-delete", rq.delete_topics([f"coll_2-{u}"]))
        await pair.create_topic("collision/free-again", f"coll.2-{u}")
        await pair.check("collision/auto-create", rq.metadata(
            [f"coll_2-{u}"], allow_auto_topic_creation=True))
        # Partitions and replication factor; which check comes first.
        cases = {"partitions-0": (0, 1), "partitions-negative": (-5, 1), "rf-0": (1, 0),
                 "rf-3": (1, 3), "rf-negative": (1, -2), "both-bad": (0, 3)}
        for label, (partitions, replication) in cases.items():
            await pair.check(f"create/{label}", rq.create_topics(
                [(unique_name(label), partitions, replication)], validate_only=True))
        await pair.check("create/rf-3-bad-config", rq.create_topics(
            [(unique_name("x"), 1, 3, {"retention.ms": "soon"})], validate_only=True))
        await pair.check("create/partitions-0-bad-config", rq.create_topics(
            [(unique_name("x"), 0, 1, {"retention.ms": "soon"})], validate_only=True))
        await pair.check("create/defaults", rq.create_topics([(unique_name("d"), -1, -1)],
                                                             validate_only=True))
        twice = unique_name("twice")
        await pair.check("create/same-name-twice",
                         rq.create_topics([(twice, 1), (twice, 2)], validate_only=True))
        for version in range(2, 8):
            await pair.check(f"create/v{version}", rq.create_topics(
                [(unique_name("v"), 2, 1, {"retention.ms": "100000"}), ("a b", 1), (twice, 0)],
                validate_only=True, version=version))
        # Manual assignments name each server's own node.
        own = {"kafka": 1, "gateway": 0}
        for label, ids in {"assigned-here": None, "assigned-elsewhere": (99,)}.items():
            topic = unique_name(label)
            requests = [rq.create_topics([(topic, -1, -1, None, [(0, ids or (own[s],))])],
                                         validate_only=True) for s in ("kafka", "gateway")]
            await pair.check(f"create/{label}", *requests)
        both_ways = unique_name("pa")
        await pair.check("create/partitions-and-assignment", rq.create_topics(
            [(both_ways, 2, -1, None, [(0, (1,))])], validate_only=True),
            rq.create_topics([(both_ways, 2, -1, None, [(0, (0,))])], validate_only=True))
        # Partitions of existing topics.
        topic = unique_name("grow")
        await pair.create_topic("partitions/create", topic, 2)
        await pair.check("partitions/fewer", _create_partitions(topic, 1))
        await pair.check("partitions/same", _create_partitions(topic, 2))
        await pair.check("partitions/more-validate-only", _create_partitions(topic, 4, True))
        await pair.check("partitions/unknown-topic", _create_partitions(unique_name("nope"), 4))
        await pair.check("partitions/metadata", rq.metadata([topic]))
        await pair.check("topics/delete-unknown", rq.delete_topics([unique_name("nope")]))

    run_pair(scenario, kafka_broker, gateway, EXPECTED)


def _create_partitions(topic: str, count: int, validate_only: bool = False):
    s = request_schema(37, 3)
    return build(s.CreatePartitionsRequest, validate_only=validate_only, timeout=rq.ms(30_000),
                 topics=(build(s.CreatePartitionsTopic, name=topic, count=count,
                               assignments=None),))


def test_produce_and_read_errors(kafka_broker, gateway):
    async def scenario(pair: Pair) -> None:
        topic = unique_name("limits")
        await pair.create_topic("produce-error/create", topic, 2, {"max.message.bytes": "1000"})
        now = int(time.time() * 1000)
        small = encode_batch([Record(b"s" * 100)], now)
        large = encode_batch([Record(b"L" * 2000)], now)
        await pair.check("produce-error/fits", rq.produce([(topic, 0, small)]))
        await pair.check("produce-error/over-max-message-bytes", rq.produce([(topic, 0, large)]))
        await pair.check("produce-error/over-broker-default", rq.produce(
            [(topic, 1, encode_batch([Record(b"B" * 1_100_000)], now))]))
        await pair.check("produce-error/one-good-one-too-large",
                         rq.produce([(topic, 0, small), (topic, 1, large)]))
        for acks in (2, -2, 5):
            await pair.check(f"produce-error/acks-{acks}",
                             rq.produce([(topic, 0, small)], acks=acks))
        await pair.check("produce-error/unknown-partition", rq.produce([(topic, 7, small)]))
        await pair.check("produce-error/unknown-topic",
                         rq.produce([(unique_name("nope"), 0, small)]))
        await pair.check("produce-error/offsets-after", rq.list_offsets(topic, [(0, -1), (1, -1)]))
        await pair.check("metadata/unknown-topic-no-auto-create",
                         rq.metadata([unique_name("nope")]))
        # auto.create.topics.enable is on (both defaults): Kafka's controller
        # creates the topic after answering, the gateway before.
        created = unique_name("auto")
        await pair.check("metadata/auto-create-first",
                         rq.metadata([created], allow_auto_topic_creation=True))
        await pair.wait_ready(created, 1)
        await pair.check("metadata/auto-created", rq.metadata([created]))
        await pair.check("metadata/topic", rq.metadata([topic]))
        for version in (1, 4, 9, 12):
            await pair.check(f"metadata/v{version}", rq.metadata([topic], version=version))
        await pair.check("metadata/describe-cluster", build(
            request_schema(60, 0).DescribeClusterRequest,
            include_cluster_authorized_operations=False))
        # A deleted topic is unknown everywhere: on the gateway at once, on
        # Kafka once its broker has applied the controller's record.
        await pair.check("metadata/delete-topic", rq.delete_topics([topic]))
        await pair.wait_deleted(topic)
        await pair.check("metadata/deleted-produce", rq.produce([(topic, 0, small)]))
        await pair.check("metadata/deleted-fetch", rq.fetch(topic, [(0, 0, 1 << 20)]))
        await pair.check("metadata/deleted-list-offsets", rq.list_offsets(topic, [(0, -1)]))
        await pair.check("metadata/deleted-configs", rq.describe_configs([(TOPIC, topic, None)]))
        await pair.check("metadata/deleted-again", rq.delete_topics([topic]))

    run_pair(scenario, kafka_broker, gateway, EXPECTED)


# ---------------------------------------------------------------- config values
ARABIC_1000 = "\u0661\u0660\u0660\u0660"  # Arabic-Indic digits: Java's parseInt takes them
FULLWIDTH_1000 = "\uff11\uff10\uff10\uff10"
# (config, value): values Kafka's ConfigDef takes or refuses; each is tried in
# CreateTopics (validate-only) and in IncrementalAlterConfigs.
CONFIG_VALUES: list[tuple[str, str]] = [
    *(("max.message.bytes", v) for v in (
        "1000", " 1000 ", "+1000", "-1", "1_000", ARABIC_1000, FULLWIDTH_1000,
        "\U0001d7cf\U0001d7ce", "1e3", "1.0", "0x10", "2147483647", "2147483648",
        "1099511627776", "", "abc",
        "\t1000\n", "\x001000", "\u00a01000", "1000\u2003", "-0")),
    *(("retention.ms", v) for v in (
        "9223372036854775807", "9223372036854775808", "-9223372036854775808", "1e30",
        "-1", "-2", "1_000", ARABIC_1000, "+0100")),
    *(("min.cleanable.dirty.ratio", v) for v in (
        "nan", "NaN", "-NaN", "NAN", "0.5", "1", "1.5", "-0.1", "Infinity", "inf",
        "0x1p-1", "0x.8p0", "0.5d", "0.5F", ".5", "5.", "1e-1", "1_0", "\u0661", "0.5e", "",
        "0.0001", "1e-7")),
    *(("preallocate", v) for v in ("true", "TRUE", " true ", "yes", "1", "", "True\t")),
    *(("compression.type", v) for v in ("gzip", "GZIP", " zstd ", "lz4,gzip", "")),
    *(("message.timestamp.type", v) for v in ("LogAppendTime", "logappendtime",
                                              " CreateTime")),
    *(("message.format.version", v) for v in (
        "3.0-IV1", "0.10.0", "0.8.2", "2.8", "3.4", "3.4.1", "3.5-IV0", "4.0", "bogus", "",
        "3.", "0.10.0-IV1", "0.10.0-IV2", "free text " * 100)),
    *(("cleanup.policy", v) for v in (
        "delete", "compact", "compact,delete", "compact, delete", "", " delete ", "DELETE",
        "delete,,compact", "bogus")),
    *(("leader.replication.throttled.replicas", v) for v in (
        "*", "0:1", "0:1 , 1:1", "bogus", "", "0:x", "*,0:1", "0:1,")),
    ("segment.bytes", "13"), ("segment.bytes", "14"), ("segment.index.bytes", "3"),
    ("index.interval.bytes", "-1"), ("flush.messages", "0"), ("segment.ms", "0"),
    ("max.compaction.lag.ms", "0"), ("min.insync.replicas", "0"),
    ("min.insync.replicas", "2"), ("retention.bytes", "-2"), ("local.retention.ms", "-3"),
    ("local.retention.bytes", "-2"), ("remote.storage.enable", "true"),
    ("min.compaction.lag.ms", "-1"), ("message.downconversion.enable", "FALSE"),
    ("unclean.leader.election.enable", "true"), ("bogus.config", "1"), ("", "1"),
]


def _topic_for(index: int, config: str, u: str) -> str:
    return f"c{index:03d}-{config or 'empty'}-{u}"


def test_config_values_in_create_and_alter(kafka_broker, gateway):
    u = uuid.uuid4().hex[:6]

    async def scenario(pair: Pair) -> None:
        # One CreateTopics request, one topic per value, validate-only.
        await pair.check("config/create", rq.create_topics(
            [(_topic_for(i, c, u), 1, 1, {c: v}) for i, (c, v) in enumerate(CONFIG_VALUES)],
            validate_only=True))
        combos = {"null": [("retention.ms", None)],
                  "lag-conflict": [("min.compaction.lag.ms", "10"),
                                   ("max.compaction.lag.ms", "5")],
                  "same-name-twice": [("retention.ms", "10"), ("retention.ms", "20")]}
        await pair.check("config/create-combos", rq.create_topics(
            [(f"{label}-{u}", 1, 1, configs) for label, configs in combos.items()],
            validate_only=True))
        topic = f"alter-{u}"
        await pair.create_topic("config/alter-create", topic)
        for i, (config, value) in enumerate(CONFIG_VALUES):
            label = f"{i:03d}-{config}"
            await pair.check(f"config/alter-{label}", rq.incremental_alter_configs(
                [(TOPIC, topic, [(config, SET, value)])], validate_only=True))
        ops = {
            "set-null": [("retention.ms", SET, None)],
            "delete-unknown": [("bogus", DELETE, None)],
            "delete-unset": [("segment.ms", DELETE, None)],
            "append-non-list": [("retention.ms", APPEND, "5")],
            "append": [("leader.replication.throttled.replicas", APPEND, "0:1")],
            "append-more": [("leader.replication.throttled.replicas", APPEND, "1:1,0:1")],
            "subtract": [("leader.replication.throttled.replicas", SUBTRACT, "0:1")],
            "append-invalid": [("leader.replication.throttled.replicas", APPEND, "*")],
            "append-compact": [("cleanup.policy", APPEND, "compact")],
            "subtract-all": [("cleanup.policy", SUBTRACT, "delete")],
            "same-name-twice": [("retention.ms", SET, "1"), ("retention.ms", SET, "2")],
            "unknown-operation": [("retention.ms", 7, "1")],
            "lag-min": [("min.compaction.lag.ms", SET, "10")],
            "lag-max-below-min": [("max.compaction.lag.ms", SET, "5")],
            "32k-value": [("message.format.version", SET, "y" * 32767)],
            "set-several": [("retention.ms", SET, "+3600000"), ("segment.ms", SET, " 60000"),
                            ("min.cleanable.dirty.ratio", SET, "1e-4")],
        }
        for label, changes in ops.items():
            await pair.check(f"config/alter-{label}", rq.incremental_alter_configs(
                [(TOPIC, topic, changes)]))
        await pair.check("config/alter-after", rq.describe_configs(
            [(TOPIC, topic, None)], include_synonyms=True))
        await pair.check("config/alter-unknown-topic", rq.incremental_alter_configs(
            [(TOPIC, unique_name("nope"), [("retention.ms", SET, "1")])]))
        await pair.check("config/alter-invalid-topic-name", rq.incremental_alter_configs(
            [(TOPIC, "bad name!", [("retention.ms", SET, "1")])]))
        await pair.check("config/alter-unknown-resource-type", rq.incremental_alter_configs(
            [(3, topic, [("retention.ms", SET, "1")])]))
        await pair.check("config/alter-broker", rq.incremental_alter_configs(
            [(BROKER, "1", [("log.retention.ms", SET, "1000")])], validate_only=True),
            rq.incremental_alter_configs(
            [(BROKER, "0", [("log.retention.ms", SET, "1000")])], validate_only=True))
        # The older AlterConfigs replaces the whole set of overrides.
        legacy = {"ok": {"retention.ms": "7200000", "segment.ms": "+1000"},
                  "bad": {"retention.ms": "1_000"}, "null": [("retention.ms", None)],
                  "unknown": {"bogus": "1"}, "compact": {"cleanup.policy": "compact"},
                  "lag-conflict": {"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"}}
        for label, configs in legacy.items():
            await pair.check(f"config/alter-legacy-{label}", rq.alter_configs(
                [(TOPIC, topic, configs)]))
        await pair.check("config/alter-legacy-after", rq.describe_configs(
            [(TOPIC, topic, None)], include_synonyms=True))

    run_pair(scenario, kafka_broker, gateway, EXPECTED)


def test_describe_configs_defaults_sources_and_synonyms(kafka_broker, gateway):
    async def scenario(pair: Pair) -> None:
        plain, custom = unique_name("defaults"), unique_name("overrides")
        await pair.create_topic("describe/create-default", plain)
        await pair.create_topic("describe/create-overrides", custom, 1, {
            "retention.ms": "+3600000", "max.message.bytes": " 2000 ", "cleanup.policy": "",
            "compression.type": " zstd", "min.cleanable.dirty.ratio": "NaN",
            "message.timestamp.type": "LogAppendTime", "preallocate": "TRUE",
            "leader.replication.throttled.replicas": "0:1 , 1:1", "segment.jitter.ms": "0",
            "remote.storage.enable": "false"})
        for topic in (plain, custom):
            kind = "default" if topic == plain else "overrides"
            for synonyms in (False, True):
                await pair.check(f"describe/{kind}-synonyms-{synonyms}",
                                 rq.describe_configs([(TOPIC, topic, None)], synonyms))
            for version in range(1, 4):
                await pair.check(f"describe/{kind}-v{version}", rq.describe_configs(
                    [(TOPIC, topic, None)], include_synonyms=True, version=version))
        await pair.check("describe/named-keys", rq.describe_configs([(TOPIC, custom, [
            "retention.ms", "max.message.bytes", "bogus", "remote.storage.enable"])], True))
        await pair.check("describe/empty-key-list", rq.describe_configs([(TOPIC, plain, [])]))
        await pair.check("describe/two-topics", rq.describe_configs(
            [(TOPIC, plain, ["retention.ms"]), (TOPIC, custom, ["retention.ms"])], True))
        await pair.check("describe/unknown-topic",
                         rq.describe_configs([(TOPIC, unique_name("nope"), None)]))
        await pair.check("describe/invalid-topic-name",
                         rq.describe_configs([(TOPIC, "bad name!", None)]))
        await pair.check("describe/documentation", rq.describe_configs(
            [(TOPIC, plain, ["retention.ms"])], include_documentation=True))
        # LogAppendTime: the batch carries the broker's clock.
        now = int(time.time() * 1000)
        batch = encode_batch([Record(b"a" * 50), Record(b"b" * 50, timestamp_delta=5)], now)
        stamped = unique_name("append-time")
        await pair.create_topic("describe/log-append-time-create", stamped, 1,
                                {"message.timestamp.type": "LogAppendTime"})
        await pair.check("describe/log-append-time-produce", rq.produce([(stamped, 0, batch)]))
        await pair.check("describe/log-append-time-fetch", rq.fetch(stamped, [(0, 0, 1 << 20)]))
        # compression.type: Kafka recompresses, the gateway keeps the producer's batch.
        compressed = unique_name("compression")
        await pair.create_topic("describe/compression-type-create", compressed, 1,
                                {"compression.type": "gzip"})
        await pair.check("describe/compression-type-produce",
                         rq.produce([(compressed, 0, batch)]))
        await pair.check("describe/compression-type-fetch",
                         rq.fetch(compressed, [(0, 0, 1 << 20)]))

    run_pair(scenario, kafka_broker, gateway, EXPECTED)


def test_free_text_of_a_megabyte(kafka_broker, gateway):
    """A 1 MB value for a string config: Kafka refuses any request string over
    32,767 bytes by closing the connection; the gateway refuses the value
    (INVALID_CONFIG, a short message), or closes too once its decoder applies
    Kafka's string limit. Either way nothing is stored."""
    async def scenario(pair: Pair) -> None:
        topic = unique_name("mb")
        await pair.create_topic("megabyte/create", topic)
        value = "free text " * 104_858
        for config in ("message.format.version", "compression.type"):
            kafka, gateway_answer = await pair.send(rq.incremental_alter_configs(
                [(TOPIC, topic, [(config, SET, value)])]))
            assert kafka == CLOSED
            if gateway_answer != CLOSED:
                assert gateway_answer.responses[0].error_code.name == "invalid_config"
                assert len(gateway_answer.responses[0].error_message) < 1000
        await pair.check("megabyte/unchanged", rq.describe_configs(
            [(TOPIC, topic, ["message.format.version", "compression.type"])]))

    run_pair(scenario, kafka_broker, gateway, EXPECTED)



def test_every_intended_difference_is_documented():
    docs = (Path(__file__).resolve().parent.parent / "docs" / "compatibility.md").read_text()
    section = docs.split("## Differences from Apache Kafka", 1)[1].split("\n## ", 1)[0]
    missing = {e.doc for e in EXPECTED if f"**{e.doc}**" not in section}
    assert not missing, f"not in docs/compatibility.md, Differences from Apache Kafka: {missing}"
