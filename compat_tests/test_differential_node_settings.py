"""Differential: a node configured away from the defaults, Apache Kafka 3.4.1 vs the gateway.

A second pair of servers, started for this module with the same settings:
topic auto-creation off, log.retention.ms, message.max.bytes and
num.partitions set. Unknown topics stay unknown (Metadata at every version,
Produce, the Java-style v12 request that allows creation); topics created
with -1 partitions get num.partitions; DescribeConfigs reports the node's
settings as STATIC_BROKER_CONFIG synonyms of the topic configs, and the
broker resource itself. Every response field is compared.
"""

from __future__ import annotations

import time

import pytest
from differences import EXPECTED

from testkit import kafka_requests as rq
from testkit.batches import Record, encode_batch
from testkit.gateway import GatewayProcess
from testkit.kafka_broker import KafkaBroker
from testkit.kafka_requests import BROKER, TOPIC
from testkit.server_pair import Pair, run_pair, unique_name

SETTINGS = {"auto.create.topics.enable": "false", "log.retention.ms": "86400000",
            "message.max.bytes": "2000000", "num.partitions": "2"}


@pytest.fixture(scope="module")
def configured_kafka(tmp_path_factory):
    with KafkaBroker(tmp_path_factory.mktemp("kafka-configured"), SETTINGS, heap="512m") as kafka:
        yield kafka


@pytest.fixture(scope="module")
def configured_gateway(tmp_path_factory):
    args = [arg for name, value in SETTINGS.items() for arg in (f"--{name.replace('.', '-')}",
                                                                 value)]
    data_dir = tmp_path_factory.mktemp("gateway-configured") / "data"
    with GatewayProcess(data_dir, *args) as gateway:
        yield gateway


def test_configured_node(configured_kafka, configured_gateway):
    async def scenario(pair: Pair) -> None:
        missing = unique_name("missing")
        for version in (0, 3, 4, 9, 12):
            await pair.check(f"node/metadata-unknown-v{version}", rq.metadata(
                [missing], allow_auto_topic_creation=True, version=version))
        batch = encode_batch([Record(b"x")], int(time.time() * 1000))
        await pair.check("node/produce-unknown", rq.produce([(missing, 0, batch)]))
        await pair.check("node/list-offsets-unknown", rq.list_offsets(missing, [(0, -1)]))
        topic = unique_name("defaults")
        await pair.check("node/create-default-partitions", rq.create_topics([(topic, -1, -1)]))
        await pair.wait_ready(topic, 2)
        await pair.check("node/metadata", rq.metadata([topic], version=12))
        for synonyms in (False, True):
            await pair.check(f"node/describe-topic-synonyms-{synonyms}", rq.describe_configs(
                [(TOPIC, topic, None)], include_synonyms=synonyms))
        custom = unique_name("custom")
        await pair.create_topic("node/create-custom", custom, 1,
                                {"retention.ms": "1000000", "max.message.bytes": "3000"})
        await pair.check("node/describe-custom", rq.describe_configs(
            [(TOPIC, custom, None)], include_synonyms=True))
        # A batch over the node's message.max.bytes but under a topic's own limit.
        big = encode_batch([Record(b"b" * 2_100_000)], int(time.time() * 1000))
        await pair.check("node/produce-over-node-limit", rq.produce([(topic, 0, big)]))
        keys = ["auto.create.topics.enable", "num.partitions", "log.retention.ms",
                "log.retention.bytes", "message.max.bytes", "offsets.retention.minutes",
                "group.initial.rebalance.delay.ms"]
        await pair.check("node/describe-broker", rq.describe_configs(
            [(BROKER, "1", keys)], include_synonyms=True),
            rq.describe_configs([(BROKER, "0", keys)], include_synonyms=True))

    run_pair(scenario, configured_kafka, configured_gateway, EXPECTED)
