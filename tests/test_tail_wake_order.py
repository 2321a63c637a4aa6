"""A long-polling Fetch woken by a produce (docs/performance.md, "End-to-end
median"): the high watermark moves before the producer's append resolves,
so a Fetch waiting on that one partition resumes before the Produce that
woke it, and its answer is written first; a record is still readable only
once its write is durable. The wait's timeout and its cancellation leave no
waiter behind.
"""

from __future__ import annotations

import asyncio
import datetime
import struct
from typing import Any

from kio.static.primitive import Records, i32Timedelta

from kafka_gateway.apis import fetch
from kafka_gateway.client import KafkaClient
from kafka_gateway.codec import ChunkWriter, entity_writer_for, request_schema
from testkit.batches import make_batch
from testkit.compaction import now_ms, run_engine
from testkit.inprocess import running

TOPIC = "t"


def test_the_append_resolves_after_the_high_watermark_moved(tmp_path):
    """When the producer's append resolves, its records are readable and the
    fetchers waiting on the partition are already woken."""

    async def scenario(engine):
        await engine.create_topic(TOPIC, 1, {})
        tablet = engine.partition(TOPIC, 0)
        waiter = tablet.waiter()
        appended = tablet.append(make_batch([b"a", b"b"]), now_ms())
        assert tablet.high_watermark == 0  # not durable yet: nothing readable
        assert (await tablet.read(0, 1 << 20)).batches == []
        seen: list[tuple[int, bool]] = []
        appended.add_done_callback(
            lambda _f: seen.append((tablet.high_watermark, waiter.done())))
        await appended
        assert seen == [(2, True)]

    run_engine(scenario, tmp_path)


def test_a_fetch_waiting_on_one_partition_resumes_before_the_produce(tmp_path):
    """The Fetch's task is scheduled before the Produce's, so the Fetch's answer
    is the first of the two the connection writes."""

    async def scenario(engine):
        await engine.create_topic(TOPIC, 1, {})
        tablet = engine.partition(TOPIC, 0)
        order: list[str] = []

        async def fetching() -> None:
            await fetch._wait_for_data([tablet], 30)
            order.append("fetch")
            assert tablet.high_watermark == 1

        async def producing() -> None:
            await tablet.append(make_batch([b"a"]), now_ms())
            order.append("produce")

        waiting = asyncio.create_task(fetching())
        await asyncio.sleep(0)  # the fetch waits first
        assert len(tablet.reads._waiters) == 1
        await asyncio.gather(waiting, producing())
        assert order == ["fetch", "produce"]
        assert not tablet.reads._waiters

    run_engine(scenario, tmp_path)


def test_the_wait_times_out_and_forgets_its_waiter(tmp_path):
    async def scenario(engine):
        await engine.create_topic(TOPIC, 1, {})
        tablet = engine.partition(TOPIC, 0)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await fetch._wait_for_data([tablet], 0.05)
        assert loop.time() - started >= 0.04  # woken by its timeout, not before
        assert tablet.high_watermark == 0
        assert not tablet.reads._waiters

        # A fetch cancelled while waiting (its connection closed) leaves none either.
        waiting = asyncio.create_task(fetch._wait_for_data([tablet], 30))
        await asyncio.sleep(0)
        assert len(tablet.reads._waiters) == 1
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        assert waiting.cancelled()
        assert not tablet.reads._waiters
        # The next append still wakes a new waiter.
        waiter = tablet.waiter()
        await tablet.append(make_batch([b"a"]), now_ms())
        assert waiter.done()

    run_engine(scenario, tmp_path)


def _frame(body: Any, correlation: int) -> bytes:
    """A request frame as KafkaClient writes it, for pipelining by hand."""
    cls = type(body)
    out = ChunkWriter()
    out.write(struct.pack(">hhih", int(cls.__api_key__), int(cls.__version__),
                          correlation, 1))
    out.write(b"t")
    if cls.__flexible__:
        out.write(b"\x00")
    entity_writer_for(cls)(out, body)
    return struct.pack(">i", out.size) + b"".join(out.chunks)


async def _answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    frame = await reader.readexactly(size)
    return struct.unpack_from(">i", frame)[0], frame


def test_answers_written_by_their_own_task_keep_request_order(tmp_path):
    """A request answered while an earlier one of its connection still waits
    (a long-polling Fetch, then a Metadata) is answered after it: when the
    Fetch, woken by a Produce on another connection, is answered, the
    Metadata's answer follows; a connection's answers stay in request order."""

    async def main() -> None:
        async with running(tmp_path) as server:
            host, port = server.config.listen
            client = await KafkaClient.connect(host, port)
            create = request_schema(19, 7)
            await client.request(create.CreateTopicsRequest(
                topics=(create.CreatableTopic(name=TOPIC, num_partitions=1,
                                              replication_factor=1, assignments=(),
                                              configs=()),),
                timeout=datetime.timedelta(seconds=5), validate_only=False))
            reader, writer = await asyncio.open_connection(host, port)
            fetch_v4, metadata_v1 = request_schema(1, 4), request_schema(3, 1)
            writer.write(_frame(fetch_v4.FetchRequest(
                replica_id=-1, max_wait=datetime.timedelta(seconds=30), min_bytes=1,
                max_bytes=1 << 20, isolation_level=0, topics=(fetch_v4.FetchTopic(
                    topic=TOPIC, partitions=(fetch_v4.FetchPartition(
                        partition=0, fetch_offset=0, partition_max_bytes=1 << 20),)),)), 1))
            writer.write(_frame(metadata_v1.MetadataRequest(
                topics=(metadata_v1.MetadataRequestTopic(name=TOPIC),)), 2))
            await writer.drain()
            answered = asyncio.ensure_future(_answer(reader))
            done, _ = await asyncio.wait([answered], timeout=0.5)
            assert not done  # the Metadata's answer waits behind the Fetch's

            produce = request_schema(0, 7)
            record = b"woken" * 10
            await client.request(produce.ProduceRequest(
                transactional_id=None, acks=-1,
                timeout=i32Timedelta.parse(datetime.timedelta(seconds=5)),
                topic_data=(produce.TopicProduceData(name=TOPIC, partition_data=(
                    produce.PartitionProduceData(index=0, records=Records(make_batch([record]))),
                )),)))
            first, fetched = await asyncio.wait_for(answered, 30)
            second, _ = await asyncio.wait_for(_answer(reader), 30)
            assert (first, second) == (1, 2)
            assert record in fetched
            writer.close()
            await client.close()

    asyncio.run(main())
