"""aiokafka (0.14) against the gateway: admin, produce, consume, offsets, restarts.

Each test is a plain function that drives its coroutine with asyncio.run,
bounded by asyncio.wait_for. Consumers use assign()/seek with no group
(group_id=None) and commit nothing; producers keep aiokafka's defaults
(not idempotent: aiokafka's enable_idempotence defaults to False).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic, RecordsToDelete
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import MessageSizeTooLargeError
from aiokafka.structs import ConsumerRecord

from testkit.gateway import GatewayProcess

CODECS = {None: 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}  # name -> batch attribute
TIMEOUT_S = 30.0
TEST_TIMEOUT_S = 120.0
DEFAULT_MAX_MESSAGE_BYTES = 1048588
MIB = 1 << 20

# DescribeConfigs config sources (KIP-226).
DYNAMIC_TOPIC_CONFIG = 1
DEFAULT_CONFIG = 5
ERROR_TOPIC_ALREADY_EXISTS = 36
ERROR_INVALID_CONFIG = 40


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run one test's coroutine to completion, or fail it after TEST_TIMEOUT_S."""
    return asyncio.run(asyncio.wait_for(coro, TEST_TIMEOUT_S))


# --------------------------------------------------------------------- helpers
@asynccontextmanager
async def admin_client(gateway: GatewayProcess) -> AsyncIterator[AIOKafkaAdminClient]:
    admin = AIOKafkaAdminClient(bootstrap_servers=gateway.bootstrap, request_timeout_ms=20000)
    await admin.start()
    try:
        yield admin
    finally:
        await admin.close()


@asynccontextmanager
async def producer(gateway: GatewayProcess, **config: Any) -> AsyncIterator[AIOKafkaProducer]:
    config = {"acks": "all", "request_timeout_ms": 20000, **config}
    prod = AIOKafkaProducer(bootstrap_servers=gateway.bootstrap, **config)
    await prod.start()
    try:
        yield prod
    finally:
        await prod.stop()


@asynccontextmanager
async def consumer(gateway: GatewayProcess, **config: Any) -> AsyncIterator[AIOKafkaConsumer]:
    config = {"group_id": None, "enable_auto_commit": False, "request_timeout_ms": 30000,
              "auto_offset_reset": "earliest", **config}
    cons = AIOKafkaConsumer(bootstrap_servers=gateway.bootstrap, **config)
    await cons.start()
    try:
        yield cons
    finally:
        await cons.stop()


async def create_topic(admin: AIOKafkaAdminClient, name: str, partitions: int = 1,
                       configs: dict[str, str] | None = None) -> None:
    response = await admin.create_topics(
        [NewTopic(name, partitions, 1, topic_configs=configs or {})])
    assert [(t[0], t[1]) for t in response.topic_errors] == [(name, 0)], response


async def read_to_end(cons: AIOKafkaConsumer, ends: dict[TopicPartition, int],
                      timeout: float = TIMEOUT_S) -> list[ConsumerRecord]:
    """getmany until every partition's position reaches its end offset."""
    out: list[ConsumerRecord] = []
    deadline = time.monotonic() + timeout
    while True:
        positions = {tp: await cons.position(tp) for tp in ends}
        if all(positions[tp] >= end for tp, end in ends.items()):
            return out
        assert time.monotonic() < deadline, (
            f"read {len(out)} records; positions {positions} never reached {ends}")
        for records in (await cons.getmany(timeout_ms=500)).values():
            out.extend(records)


async def describe(admin: AIOKafkaAdminClient, topic: str,
                   include_synonyms: bool = False) -> dict[str, tuple]:
    """Topic configs: name -> (value, read_only, source, sensitive, synonyms)."""
    (response,) = await admin.describe_configs(
        [ConfigResource(ConfigResourceType.TOPIC, topic)], include_synonyms=include_synonyms)
    (resource,) = response.resources
    error_code, _message, _type, name, entries = resource
    assert (error_code, name) == (0, topic), resource
    return {entry[0]: tuple(entry[1:]) for entry in entries}


# ----------------------------------------------------------------------- tests
def test_admin_creates_topic_with_partitions_and_configs(gateway, topic_name):
    """create_topics honours partitions and configs; duplicates and bad configs are errors."""

    async def main() -> None:
        async with admin_client(gateway) as admin:
            await create_topic(admin, topic_name, 3, {"retention.ms": "3600000",
                                                      "max.message.bytes": "2097152"})
            (described,) = await admin.describe_topics([topic_name])
            assert described["error_code"] == 0
            assert sorted(p["partition"] for p in described["partitions"]) == [0, 1, 2]

            configs = await describe(admin, topic_name)
            overrides = {k: v[0] for k, v in configs.items() if v[2] == DYNAMIC_TOPIC_CONFIG}
            assert overrides == {"retention.ms": "3600000", "max.message.bytes": "2097152"}

            response = await admin.create_topics([NewTopic(topic_name, 1, 1)])
            assert response.topic_errors[0][1] == ERROR_TOPIC_ALREADY_EXISTS
            bad = topic_name + "-bad"
            response = await admin.create_topics(
                [NewTopic(bad, 1, 1, topic_configs={"retention.ms": "soon"})])
            assert response.topic_errors[0][1] == ERROR_INVALID_CONFIG
            assert bad not in await admin.list_topics()

            response = await admin.create_partitions({topic_name: NewPartitions(5)})
            assert response.topic_errors[0][1] == 0, response
            (described,) = await admin.describe_topics([topic_name])
            assert len(described["partitions"]) == 5

            doomed = topic_name + "-doomed"
            await create_topic(admin, doomed)
            response = await admin.delete_topics([doomed])
            assert [tuple(t[:2]) for t in response.topic_error_codes] == [(doomed, 0)]
            # aiokafka asks any broker: on a cluster of gateways, one that has
            # not read the deletion's notice yet may still list it for a moment
            # (a Kafka broker's metadata cache lags its controller the same
            # way; seen once in CI under load); it must go.
            deadline = time.monotonic() + 10
            while doomed in await admin.list_topics():
                assert time.monotonic() < deadline, f"{doomed} still listed after 10 s"
                await asyncio.sleep(0.1)

        async with producer(gateway) as prod:
            metas = [await prod.send_and_wait(topic_name, f"p{p}".encode(), partition=p)
                     for p in range(5)]
            assert [(m.partition, m.offset) for m in metas] == [(p, 0) for p in range(5)]
        async with consumer(gateway) as cons:
            tps = [TopicPartition(topic_name, p) for p in range(5)]
            cons.assign(tps)
            got = await read_to_end(cons, dict.fromkeys(tps, 1))
            assert sorted((r.partition, r.offset, r.value) for r in got) == [
                (p, 0, f"p{p}".encode()) for p in range(5)
            ]

    run(main())


@pytest.mark.parametrize("codec", list(CODECS), ids=lambda c: c or "none")
def test_compression_round_trip(gateway, topic_name, stored_batches, codec):
    """Each codec's batches are stored as sent (still compressed) and read back exactly."""
    values = [f"{codec}-{i}-".encode() * (i % 7 + 1) for i in range(200)]
    tp = TopicPartition(topic_name, 0)

    async def produce() -> None:
        async with admin_client(gateway) as admin:
            await create_topic(admin, topic_name)
        async with producer(gateway, compression_type=codec, linger_ms=50) as prod:
            futures = [await prod.send(topic_name, v, key=str(i).encode(), partition=0)
                       for i, v in enumerate(values)]
            metas = await asyncio.gather(*futures)
        assert [m.offset for m in metas] == list(range(200))

    async def consume() -> list[ConsumerRecord]:
        async with consumer(gateway) as cons:
            cons.assign([tp])
            return await read_to_end(cons, {tp: 200})

    run(produce())
    batches = stored_batches(topic_name, 0)
    assert sum(count for _, _, count in batches) == 200
    assert {codec_id for _, codec_id, _ in batches} == {CODECS[codec]}
    got = run(consume())
    assert [(r.offset, r.key, r.value) for r in got] == [
        (i, str(i).encode(), v) for i, v in enumerate(values)
    ]


def test_keys_headers_and_tombstones(gateway, topic_name):
    """Null keys, null values (tombstones), empty values and repeated headers survive."""
    sent = [
        (b"k1", b"v1", [("h", b"1")]),
        (b"k1", None, []),  # tombstone
        (None, b"no key", [("a", b""), ("a", b"again"), ("utf8-\u00e9", b"\x00\xff")]),
        (b"k2", None, [("only", b"headers")]),  # aiokafka refuses key=value=None
        (b"", b"", []),
    ]
    tp = TopicPartition(topic_name, 0)

    async def main() -> list[ConsumerRecord]:
        async with admin_client(gateway) as admin:
            await create_topic(admin, topic_name)
        async with producer(gateway) as prod:
            for key, value, headers in sent:
                await prod.send_and_wait(topic_name, value, key=key, headers=headers,
                                         partition=0)
        async with consumer(gateway) as cons:
            cons.assign([tp])
            return await read_to_end(cons, {tp: len(sent)})

    got = run(main())
    assert [(r.offset, r.key, r.value, list(r.headers)) for r in got] == [
        (i, k, v, h) for i, (k, v, h) in enumerate(sent)
    ]


def test_one_mib_record_and_message_too_large(gateway, topic_name):
    """A 1 MiB value fits a topic with max.message.bytes=2 MiB; the default limit refuses it."""
    big = topic_name + "-big"
    value = bytes(range(256)) * (MIB // 256)

    async def main() -> None:
        async with admin_client(gateway) as admin:
            await create_topic(admin, big, configs={"max.message.bytes": "2097152"})
            await create_topic(admin, topic_name)  # default limit: 1048588 bytes per batch
        async with producer(gateway, max_request_size=3 * MIB) as prod:
            meta = await prod.send_and_wait(big, value, key=b"big", partition=0)
            assert meta.offset == 0
            with pytest.raises(MessageSizeTooLargeError):
                await prod.send_and_wait(topic_name, value, partition=0)
            # The refused batch left nothing behind: the next record takes offset 0.
            meta = await prod.send_and_wait(topic_name, b"small", partition=0)
            assert meta.offset == 0

        tp, small_tp = TopicPartition(big, 0), TopicPartition(topic_name, 0)
        async with consumer(gateway, max_partition_fetch_bytes=3 * MIB,
                            fetch_max_bytes=4 * MIB) as cons:
            cons.assign([tp, small_tp])
            assert await cons.end_offsets([tp, small_tp]) == {tp: 1, small_tp: 1}
            got = await read_to_end(cons, {tp: 1, small_tp: 1})
        by_topic = {r.topic: r for r in got}
        assert len(got) == 2
        assert by_topic[big].key == b"big" and by_topic[big].value == value
        assert by_topic[topic_name].value == b"small"

        # Default fetch limits (1 MiB per partition) still get the whole batch (KIP-74).
        async with consumer(gateway) as cons:
            cons.assign([tp])
            (record,) = await read_to_end(cons, {tp: 1})
        assert record.value == value

    run(main())


def test_consume_from_earliest_and_from_latest(gateway, topic_name):
    """auto_offset_reset=earliest reads everything; latest sees only records produced after."""
    tp = TopicPartition(topic_name, 0)

    async def main() -> None:
        async with admin_client(gateway) as admin:
            await create_topic(admin, topic_name)
        async with producer(gateway) as prod, \
                consumer(gateway, auto_offset_reset="latest") as latest, \
                consumer(gateway, auto_offset_reset="earliest") as earliest:
            for i in range(5):
                await prod.send_and_wait(topic_name, f"old-{i}".encode(), partition=0)
            latest.assign([tp])
            earliest.assign([tp])
            assert await latest.position(tp) == 5  # resolved before the new records exist
            assert await earliest.position(tp) == 0

            for i in range(3):
                await prod.send_and_wait(topic_name, f"new-{i}".encode(), partition=0)

            assert [r.value for r in await read_to_end(latest, {tp: 8})] == [
                f"new-{i}".encode() for i in range(3)
            ]
            assert [r.value for r in await read_to_end(earliest, {tp: 8})] == [
                f"old-{i}".encode() for i in range(5)
            ] + [f"new-{i}".encode() for i in range(3)]

            # seek_to_beginning / seek(offset) / seek_to_end move an assigned consumer.
            await latest.seek_to_beginning(tp)
            assert await latest.position(tp) == 0
            latest.seek(tp, 6)
            assert [r.offset for r in await read_to_end(latest, {tp: 8})] == [6, 7]
            await latest.seek_to_end(tp)
            assert await latest.position(tp) == 8

    run(main())


def test_offsets_for_times(gateway, topic_name, stored_batches):
    """offsets_for_times returns the first offset at or after a timestamp, None past the end.

    One batch of four records per codec, so lookups land inside and across
    batches and the gateway reads timestamps out of every kind of batch.
    """
    base = int(time.time() * 1000) - 60_000
    stamps = [base + 10 * i for i in range(4 * len(CODECS))]
    tp = TopicPartition(topic_name, 0)

    async def produce() -> None:
        async with admin_client(gateway) as admin:
            await create_topic(admin, topic_name)
        for chunk, codec in enumerate(CODECS):
            async with producer(gateway, linger_ms=20, compression_type=codec) as prod:
                futures = [await prod.send(topic_name, f"{i}:".encode() + b"payload " * 32,
                                           partition=0, timestamp_ms=stamps[i])
                           for i in range(chunk * 4, chunk * 4 + 4)]
                await asyncio.gather(*futures)

    async def consume() -> list[ConsumerRecord]:
        async with consumer(gateway) as cons:
            async def lookup(ts: int):
                return (await cons.offsets_for_times({tp: ts}))[tp]

            for i, ts in enumerate(stamps):
                found = await lookup(ts)
                assert (found.offset, found.timestamp) == (i, ts), (i, found)
                if i:  # between two records: the later one
                    found = await lookup(ts - 5)
                    assert (found.offset, found.timestamp) == (i, ts)
            assert (await lookup(0)).offset == 0
            assert await lookup(stamps[-1] + 1) is None

            # Seeking to the offset found reads from that record on.
            cons.assign([tp])
            cons.seek(tp, (await lookup(stamps[7])).offset)
            return await read_to_end(cons, {tp: len(stamps)})

    run(produce())
    assert [(codec, count) for _, codec, count in stored_batches(topic_name, 0)] == [
        (codec, 4) for codec in CODECS.values()
    ]
    got = run(consume())
    assert [(r.offset, r.timestamp) for r in got] == list(enumerate(stamps))[7:]


def test_long_poll_is_woken_by_a_new_record(gateway, topic_name):
    """getmany, with fetches waiting up to 10 s in the gateway, returns soon after a record."""
    tp = TopicPartition(topic_name, 0)

    async def main() -> None:
        async with admin_client(gateway) as admin:
            await create_topic(admin, topic_name)
        async with producer(gateway) as prod, \
                consumer(gateway, fetch_max_wait_ms=10_000, auto_offset_reset="latest") as cons:
            await prod.send_and_wait(topic_name, b"warm-up", partition=0)
            cons.assign([tp])
            assert await cons.position(tp) == 1
            assert await cons.getmany(timeout_ms=200) == {}  # a fetch now waits in the gateway

            async def produce_later() -> None:
                await asyncio.sleep(0.5)
                await prod.send_and_wait(topic_name, b"wake up", partition=0)

            started = time.monotonic()
            sender = asyncio.create_task(produce_later())
            batches = await cons.getmany(tp, timeout_ms=20_000)
            elapsed = time.monotonic() - started
            await sender
        assert [r.value for r in batches.get(tp, [])] == [b"wake up"]
        assert elapsed < 5.0, f"getmany took {elapsed:.1f}s: not woken by the append"

    run(main())


def test_watermarks_and_delete_records(gateway, topic_name, stored_batches):
    """end/beginning offsets are exact; delete_records moves the beginning offset."""
    tp0, tp1 = TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)

    async def produce() -> None:
        async with admin_client(gateway) as admin:
            await create_topic(admin, topic_name, 2)
        async with producer(gateway, linger_ms=20) as prod:
            first = [await prod.send(topic_name, f"a{i}".encode(), partition=0)
                     for i in range(5)]
            await asyncio.gather(*first)  # batches [0..4] and [5, 6]
            rest = [await prod.send(topic_name, f"a{i}".encode(), partition=0)
                    for i in range(5, 7)]
            rest += [await prod.send(topic_name, f"b{i}".encode(), partition=1)
                     for i in range(4)]
            await asyncio.gather(*rest)

    async def check() -> None:
        async with consumer(gateway, isolation_level="read_committed") as committed:
            assert await committed.end_offsets([tp0, tp1]) == {tp0: 7, tp1: 4}
        async with admin_client(gateway) as admin, consumer(gateway) as cons:
            assert await cons.end_offsets([tp0, tp1]) == {tp0: 7, tp1: 4}
            assert await cons.beginning_offsets([tp0, tp1]) == {tp0: 0, tp1: 0}

            # Offset 3 lies inside the first batch: the batch stays, offsets 0-2 go.
            assert await admin.delete_records({tp0: RecordsToDelete(3)}) == {tp0: 3}
            assert await cons.beginning_offsets([tp0, tp1]) == {tp0: 3, tp1: 0}
            assert await cons.end_offsets([tp0, tp1]) == {tp0: 7, tp1: 4}
            # A time before the log start finds the first record still there.
            assert (await cons.offsets_for_times({tp0: 0}))[tp0].offset == 3

            cons.assign([tp0, tp1])
            await cons.seek_to_beginning()
            got = await read_to_end(cons, {tp0: 7, tp1: 4})
            assert sorted((r.partition, r.offset, r.value) for r in got) == (
                [(0, i, f"a{i}".encode()) for i in range(3, 7)]
                + [(1, i, f"b{i}".encode()) for i in range(4)]
            )
            assert (cons.highwater(tp0), cons.last_stable_offset(tp0)) == (7, 7)
            assert (cons.highwater(tp1), cons.last_stable_offset(tp1)) == (4, 4)

            # Up to the high watermark (-1): the partition reads as empty.
            assert await admin.delete_records({tp1: RecordsToDelete(-1)}) == {tp1: 4}
            assert await cons.beginning_offsets([tp1]) == {tp1: 4}
            assert await cons.end_offsets([tp1]) == {tp1: 4}

    run(produce())
    assert [count for _, _, count in stored_batches(topic_name, 0)] == [5, 2]
    run(check())


def test_kill_9_keeps_every_acknowledged_record(gateway, topic_name):
    """After kill -9 and restart, every acknowledged record reads back exactly, once."""
    tps = [TopicPartition(topic_name, p) for p in range(3)]
    expected: dict[tuple[int, int], tuple[bytes, bytes]] = {}

    async def main() -> list[ConsumerRecord]:
        async with admin_client(gateway) as admin:
            await create_topic(admin, topic_name, 3)
        async with producer(gateway, linger_ms=5, compression_type="zstd") as prod:
            sent = []
            for i in range(300):
                key, value = f"key-{i}".encode(), f"value-{i}".encode() * 3
                sent.append((await prod.send(topic_name, value, key=key, partition=i % 3),
                             key, value))
            for future, key, value in sent:
                meta = await future
                expected[(meta.partition, meta.offset)] = (key, value)

            gateway.kill()  # blocking, but brief: the loop has nothing else to do
            gateway.start()

            # The same producer reconnects and goes on where the log ended.
            meta = await prod.send_and_wait(topic_name, b"restart", key=b"after", partition=0)
            assert meta.offset == 100
            expected[(0, 100)] = (b"after", b"restart")

        async with consumer(gateway) as cons:
            ends = await cons.end_offsets(tps)
            assert ends == {tps[0]: 101, tps[1]: 100, tps[2]: 100}
            # The time index survived too.
            found = await cons.offsets_for_times(dict.fromkeys(tps, 0))
            assert {tp: f.offset for tp, f in found.items()} == dict.fromkeys(tps, 0)
            cons.assign(tps)
            return await read_to_end(cons, ends)

    got = run(main())
    assert len(got) == len(expected) == 301
    assert {(r.partition, r.offset): (r.key, r.value) for r in got} == expected


def test_kill_9_mid_stream_loses_no_acknowledged_record(gateway, topic_name):
    """kill -9 while a producer streams: every ack names a stored record, none is lost.

    Without idempotence a retried batch may be stored twice (as with Kafka),
    so keys may repeat; offsets must still be gapless and every acknowledged
    (partition, offset) must hold exactly the record that was acknowledged.
    """
    tps = [TopicPartition(topic_name, p) for p in range(3)]
    total, kill_at = 3000, 1000

    async def main() -> tuple[int, dict[tuple[int, int], int], list[ConsumerRecord], dict]:
        async with admin_client(gateway) as admin:
            await create_topic(admin, topic_name, 3)
        futures: list[asyncio.Future] = []
        acked_before_kill = 0
        async with producer(gateway, linger_ms=2) as prod:
            restart = None
            for i in range(total):
                futures.append(await prod.send(topic_name, b"v%d" % i, key=str(i).encode(),
                                               partition=i % 3))
                if i == kill_at:
                    await futures[0]
                    acked_before_kill = sum(f.done() and not f.exception() for f in futures)
                    gateway.kill()
                    # Restart in a thread: the producer keeps sending and retrying meanwhile.
                    restart = asyncio.create_task(asyncio.to_thread(gateway.start))
                await asyncio.sleep(0.0002)
            assert restart is not None
            await restart
            metas = await asyncio.gather(*futures)  # the client retried through the outage
        acked = {(m.partition, m.offset): i for i, m in enumerate(metas)}
        async with consumer(gateway) as cons:
            ends = await cons.end_offsets(tps)
            cons.assign(tps)
            return acked_before_kill, acked, await read_to_end(cons, ends), ends

    acked_before_kill, acked, got, ends = run(main())
    assert 0 < acked_before_kill < total
    stored = {(r.partition, r.offset): (r.key, r.value) for r in got}
    assert len(stored) == len(got) == sum(ends.values())
    assert sorted(stored) == [(tp.partition, o) for tp in tps for o in range(ends[tp])]
    for (partition, offset), i in acked.items():
        assert stored[(partition, offset)] == (str(i).encode(), b"v%d" % i)
        assert partition == i % 3
    assert {int(key) for key, _ in stored.values()} == set(range(total))


def test_describe_and_alter_configs_round_trip(gateway, topic_name):
    """alter_configs sets overrides (replacing the set, as AlterConfigs does); sources exact."""

    async def main() -> None:
        async with admin_client(gateway) as admin:
            await create_topic(admin, topic_name)

            async def alter(configs: dict[str, str]) -> tuple[int, str | None]:
                (response,) = await admin.alter_configs(
                    [ConfigResource(ConfigResourceType.TOPIC, topic_name, configs=configs)])
                (resource,) = response.resources
                return resource[0], resource[1]

            assert await alter({"retention.ms": "7200000"}) == (0, None)
            configs = await describe(admin, topic_name, include_synonyms=True)
            value, read_only, source, _sensitive, synonyms = configs["retention.ms"]
            assert (value, read_only, source) == ("7200000", False, DYNAMIC_TOPIC_CONFIG)
            assert tuple(synonyms[0]) == ("retention.ms", "7200000", DYNAMIC_TOPIC_CONFIG)
            # As Kafka: log.retention.ms has no default of its own, so no broker synonym.
            assert len(synonyms) == 1
            # Everything else: the defaults, reported as such.
            for name, default in {"max.message.bytes": str(DEFAULT_MAX_MESSAGE_BYTES),
                                  "cleanup.policy": "delete", "retention.bytes": "-1",
                                  "message.timestamp.type": "CreateTime",
                                  "compression.type": "producer"}.items():
                assert configs[name][0] == default, name
                assert configs[name][2] == DEFAULT_CONFIG, name
            assert {n for n, c in configs.items() if c[2] != DEFAULT_CONFIG} == {"retention.ms"}

            # AlterConfigs replaces the whole set: retention.ms goes back to its default.
            assert await alter({"retention.bytes": "1000000"}) == (0, None)
            configs = await describe(admin, topic_name)
            assert configs["retention.bytes"][:3:2] == ("1000000", DYNAMIC_TOPIC_CONFIG)
            assert configs["retention.ms"][:3:2] == ("604800000", DEFAULT_CONFIG)

            # An invalid value is refused and changes nothing.
            code, message = await alter({"retention.ms": "-7"})
            assert code == ERROR_INVALID_CONFIG, message
            configs = await describe(admin, topic_name)
            assert configs["retention.bytes"][0] == "1000000"
            assert configs["retention.ms"][0] == "604800000"

    run(main())


def test_retention_ms_set_by_admin_is_enforced(gateway, topic_name):
    """Lowering retention.ms with alter_configs removes old records; new ones stay."""
    tp = TopicPartition(topic_name, 0)

    async def main() -> list[ConsumerRecord]:
        an_hour_ago = int(time.time() * 1000) - 3_600_000
        async with admin_client(gateway) as admin, producer(gateway) as prod, \
                consumer(gateway) as cons:
            await create_topic(admin, topic_name)
            for i in range(5):
                await prod.send_and_wait(topic_name, b"old", partition=0,
                                         timestamp_ms=an_hour_ago + i)
            assert await cons.beginning_offsets([tp]) == {tp: 0}
            await admin.alter_configs([ConfigResource(
                ConfigResourceType.TOPIC, topic_name, configs={"retention.ms": "600000"})])
            deadline = time.monotonic() + TIMEOUT_S
            while (await cons.beginning_offsets([tp]))[tp] != 5:
                assert time.monotonic() < deadline, "retention never removed old records"
                await asyncio.sleep(0.2)
            await prod.send_and_wait(topic_name, b"new", partition=0)
            cons.assign([tp])
            await cons.seek_to_beginning(tp)
            return await read_to_end(cons, {tp: 6})

    got = run(main())
    assert [(r.offset, r.value) for r in got] == [(5, b"new")]
