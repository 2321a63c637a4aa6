"""Consumer groups with aiokafka (0.14): two members share partitions and
commit; one leaves and the other takes over from the committed offsets; a
static member restarts into its old assignment; commits carry metadata."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import OffsetAndMetadata
from compat_helpers import create_topic
from group_helpers import (
    SESSION_TIMEOUT_MS,
    committed_offsets,
    describe_group,
    group_gateway,
)

TEST_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with group_gateway(tmp_path_factory.mktemp("groups-aiokafka") / "data") as gw:
        yield gw


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, TEST_TIMEOUT_S))


async def produce(gateway, topic: str, values: list[str], partitions: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=gateway.bootstrap)
    await producer.start()
    try:
        for index, value in enumerate(values):
            await producer.send(topic, value.encode(), partition=index % partitions)
        await producer.flush()
    finally:
        await producer.stop()


def member(gateway, group: str, **config) -> AIOKafkaConsumer:
    config = {"session_timeout_ms": SESSION_TIMEOUT_MS, "heartbeat_interval_ms": 500, **config}
    return AIOKafkaConsumer(
        bootstrap_servers=gateway.bootstrap, group_id=group, auto_offset_reset="earliest",
        enable_auto_commit=False, **config)


async def until(condition, timeout: float, what: str):
    async def poll():
        while not (value := await condition()):
            await asyncio.sleep(0.1)
        return value

    try:
        return await asyncio.wait_for(poll(), timeout)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout}s waiting for {what}") from None


def test_members_share_partitions_and_survivor_resumes_after_leave(gateway, topic_name):
    async def main():
        create_topic(gateway, topic_name, partitions=4)
        first_half = [f"a{i}" for i in range(40)]
        second_half = [f"b{i}" for i in range(40)]
        await produce(gateway, topic_name, first_half, 4)
        group = f"g-{uuid.uuid4().hex[:10]}"
        members = [member(gateway, group, client_id=f"aio{i}") for i in range(2)]
        for each in members:
            each.subscribe([topic_name])
            await each.start()
        seen: dict[str, int] = {}

        async def drain(consumer: AIOKafkaConsumer) -> None:
            batches = await consumer.getmany(timeout_ms=100)
            for tp, records in batches.items():
                for record in records:
                    seen[record.value.decode()] = seen.get(record.value.decode(), 0) + 1
                await consumer.commit({tp: OffsetAndMetadata(records[-1].offset + 1, "aio")})

        async def consumed(values: list[str], consumers: list[AIOKafkaConsumer]) -> bool:
            for each in consumers:
                await drain(each)
            return set(values) <= set(seen)

        try:
            await until(lambda: consumed(first_half, members), 60, "the first half")

            async def split_two_ways():
                await asyncio.gather(*(drain(each) for each in members))
                described = await asyncio.to_thread(describe_group, gateway, group)
                sizes = sorted(len(m["partitions"]) for m in described["members"].values())
                return described["state"] == "Stable" and sizes == [2, 2]

            await until(split_two_ways, 30, "two members with two partitions each")
            assert await asyncio.to_thread(committed_offsets, gateway, group) == {
                (topic_name, p): (10, "aio") for p in range(4)}

            await members[1].stop()  # LeaveGroup
            await produce(gateway, topic_name, second_half, 4)
            await until(lambda: consumed(second_half, members[:1]), 60,
                        "the survivor to read the second half")
            assert members[0].assignment() == {TopicPartition(topic_name, p) for p in range(4)}
            # The survivor resumed from the committed offsets: nothing read twice.
            assert all(count == 1 for count in seen.values())
        finally:
            for each in members:
                await each.stop()

    run(main())


def test_static_member_restart_keeps_assignment(gateway, topic_name):
    async def main():
        create_topic(gateway, topic_name, partitions=2)
        group = f"g-{uuid.uuid4().hex[:10]}"

        async def static_member(instance: str) -> AIOKafkaConsumer:
            consumer = member(gateway, group, group_instance_id=instance,
                              session_timeout_ms=10_000)
            consumer.subscribe([topic_name])
            await consumer.start()
            return consumer

        async def assigned(consumer: AIOKafkaConsumer):
            await consumer.getmany(timeout_ms=100)
            return consumer.assignment()

        left, right = await static_member("left"), await static_member("right")
        try:
            await until(lambda: _both(assigned, left, right), 30, "both assigned")
            before = await asyncio.to_thread(describe_group, gateway, group)
            instances = {m["instance"]: m["partitions"] for m in before["members"].values()}
            # A static member does not leave on stop: its slot waits for it.
            await left.stop()
            left = await static_member("left")
            await until(lambda: assigned(left), 30, "the restarted member's assignment")
            after = await asyncio.to_thread(describe_group, gateway, group)
            assert {m["instance"]: m["partitions"] for m in after["members"].values()} == instances
            assert {(tp.topic, tp.partition) for tp in left.assignment()} == instances["left"]
        finally:
            await left.stop()
            await right.stop()

    run(main())


async def _both(assigned, *consumers) -> bool:
    results = await asyncio.gather(*(assigned(c) for c in consumers))
    return all(results)

