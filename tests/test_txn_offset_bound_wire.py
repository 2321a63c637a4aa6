"""gateway.transactional.produce.offset over the wire: set by CreateTopics,
IncrementalAlterConfigs and AlterConfigs, described with its source (in
every listing where set, otherwise when asked by name, so a topic without
it is described as Kafka would), a bad value refused with INVALID_CONFIG;
a transactional Produce at every version answered with the bound on a
topic that sets ``lower-bound`` (its retry too) and -1 on one that does
not; the commit then gives exactly those offsets (one writer)."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode
from kio.static.primitive import Records

from kafka_gateway.apis import APIS
from kafka_gateway.client import KafkaClient
from kafka_gateway.server import GatewayServer
from tablets.batch import ATTR_CONTROL, ATTR_TRANSACTIONAL
from tablets.topic_config import TXN_PRODUCE_OFFSET
from testkit import kafka_requests as rq
from testkit.batches import decode_batches, make_batch
from testkit.inprocess import serve
from testkit.kafka_requests import DELETE, SET, TOPIC, Versions, ms

PRODUCE, INIT_PRODUCER_ID, ADD_PARTITIONS, END_TXN = 0, 22, 24, 26
NEWEST = Versions(1 << 10)
SOURCE_DYNAMIC_TOPIC, SOURCE_DEFAULT = 1, 5
TID = "ckpt-tx"


async def described(client: KafkaClient, topic: str) -> tuple[str, int]:
    """The topic's value of the config and its source (DescribeConfigs v4),
    asked by name; listed among all the topic's configs only when set."""
    answer = await client.request(rq.describe_configs([(TOPIC, topic, [TXN_PRODUCE_OFFSET])]))
    [result] = answer.results
    assert result.error_code is ErrorCode.none
    [entry] = result.configs
    assert entry.name == TXN_PRODUCE_OFFSET
    assert not entry.read_only and not entry.is_sensitive
    answer = await client.request(rq.describe_configs([(TOPIC, topic, None)]))
    listed = [c for c in answer.results[0].configs if c.name == TXN_PRODUCE_OFFSET]
    assert len(answer.results[0].configs) == 26 + len(listed)  # Kafka 3.4 describes 26
    assert listed == ([entry] if entry.config_source == SOURCE_DYNAMIC_TOPIC else [])
    return entry.value, entry.config_source


async def configs_api(client: KafkaClient) -> None:
    answer = await client.request(rq.create_topics([
        ("bound", 1, 1, {TXN_PRODUCE_OFFSET: "lower-bound"}), ("plain", 1),
        ("refused", 1, 1, {TXN_PRODUCE_OFFSET: "exact"})]))
    results = {t.name: t for t in answer.topics}
    assert [(c.value, c.config_source) for c in results["bound"].configs
            if c.name == TXN_PRODUCE_OFFSET] == [("lower-bound", SOURCE_DYNAMIC_TOPIC)]
    assert [c for c in results["plain"].configs if c.name == TXN_PRODUCE_OFFSET] == []
    assert results["refused"].error_code is ErrorCode.invalid_config
    assert results["refused"].error_message == (
        f"Invalid value exact for configuration {TXN_PRODUCE_OFFSET}: "
        "String must be one of: unknown, lower-bound")
    assert await described(client, "bound") == ("lower-bound", SOURCE_DYNAMIC_TOPIC)
    assert await described(client, "plain") == ("unknown", SOURCE_DEFAULT)

    # IncrementalAlterConfigs: a bad value, then SET and DELETE.
    answer = await client.request(rq.incremental_alter_configs(
        [(TOPIC, "plain", [(TXN_PRODUCE_OFFSET, SET, "LOWER-BOUND")])]))
    assert answer.responses[0].error_code is ErrorCode.invalid_config
    assert "String must be one of: unknown, lower-bound" in answer.responses[0].error_message
    for op, value, expected in ((SET, "lower-bound", ("lower-bound", SOURCE_DYNAMIC_TOPIC)),
                                (DELETE, None, ("unknown", SOURCE_DEFAULT)),
                                (SET, "unknown", ("unknown", SOURCE_DYNAMIC_TOPIC))):
        answer = await client.request(rq.incremental_alter_configs(
            [(TOPIC, "plain", [(TXN_PRODUCE_OFFSET, op, value)])]))
        assert answer.responses[0].error_code is ErrorCode.none
        assert await described(client, "plain") == expected
    # AlterConfigs replaces every override: back to the default.
    answer = await client.request(rq.alter_configs([(TOPIC, "plain", {"retention.ms": "1000"})]))
    assert answer.responses[0].error_code is ErrorCode.none
    assert await described(client, "plain") == ("unknown", SOURCE_DEFAULT)
    answer = await client.request(rq.alter_configs([(TOPIC, "plain", {TXN_PRODUCE_OFFSET: "x"})]))
    assert answer.responses[0].error_code is ErrorCode.invalid_config


async def produce(client: KafkaClient, version: int, topic: str, batch: bytes):
    """One transactional batch at Produce ``version``: its partition answer."""
    v = Versions(version - APIS[PRODUCE].min_version)
    assert v.version(PRODUCE) == version
    answer = await client.request(v.make(
        PRODUCE, "ProduceRequest", transactional_id=TID, acks=-1, timeout=ms(5000),
        topic_data=(v.make(PRODUCE, "TopicProduceData", name=topic, partition_data=(
            v.make(PRODUCE, "PartitionProduceData", index=0, records=Records(batch)),)),)))
    part = answer.responses[0].partition_responses[0]
    assert part.error_code is ErrorCode.none
    return part


async def offsets_of(client: KafkaClient, topic: str) -> dict[bytes, int]:
    """The offset of each (unique) record value, read committed."""
    answer = await client.request(rq.fetch(topic, [(0, 0, 1 << 20)], isolation_level=1))
    part = answer.responses[0].partitions[0]
    assert part.error_code is ErrorCode.none
    out = {}
    for decoded in decode_batches(bytes(part.records)):
        if not decoded["attributes"] & ATTR_CONTROL:
            for record in decoded["records"]:
                out[record["value"]] = decoded["base_offset"] + record["offset_delta"]
    return out


async def transactional_produce(client: KafkaClient) -> None:
    answer = await client.request(NEWEST.make(
        INIT_PRODUCER_ID, "InitProducerIdRequest", transactional_id=TID,
        transaction_timeout=ms(60_000), producer_id=-1, producer_epoch=-1))
    pid, epoch = answer.producer_id, answer.producer_epoch
    answer = await client.request(Versions(0).make(
        ADD_PARTITIONS, "AddPartitionsToTxnRequest", v3_and_below_transactional_id=TID,
        v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=tuple(Versions(0).make(
            ADD_PARTITIONS, "AddPartitionsToTxnTopic", name=name, partitions=(0,))
            for name in ("bound", "plain"))))
    assert all(p.partition_error_code is ErrorCode.none
               for t in answer.results_by_topic_v3_and_below for p in t.results_by_partition)
    seq = {"bound": 0, "plain": 0}
    answered: dict[bytes, int] = {}
    for version in range(3, APIS[PRODUCE].max_version + 1):  # kio encodes v3 on
        values = [f"v{version}-{i}".encode() for i in range(version % 3 + 1)]
        for topic in ("bound", "plain"):
            batch = make_batch(values, producer_id=pid, producer_epoch=epoch,
                               base_sequence=seq[topic], attributes=ATTR_TRANSACTIONAL)
            part = await produce(client, version, topic, batch)
            retry = await produce(client, version, topic, batch)  # a duplicate
            assert retry.base_offset == part.base_offset, (version, topic)
            assert part.log_append_time is None  # -1 on the wire (kio reads it as None)
            if version >= 5:
                assert part.log_start_offset == 0
            if topic == "bound":
                answered[values[0]] = part.base_offset
            else:
                assert part.base_offset == -1, version
            seq[topic] += len(values)
    answer = await client.request(NEWEST.make(
        END_TXN, "EndTxnRequest", transactional_id=TID, producer_id=pid, producer_epoch=epoch,
        committed=True))
    assert answer.error_code is ErrorCode.none
    real = await offsets_of(client, "bound")
    assert answered == {value: real[value] for value in answered}
    assert list(answered.values()) == sorted(answered.values()) and len(set(answered)) == 7


@pytest.mark.timeout(120)
def test_the_topic_config_and_the_produce_answers(tmp_path):
    async def main(client: KafkaClient, _server: GatewayServer) -> None:
        await configs_api(client)
        await transactional_produce(client)

    serve(tmp_path, main)
