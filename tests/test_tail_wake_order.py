"""A long-polling Fetch woken by a produce (docs/performance.md, "End-to-end
median"): the high watermark moves before the producer's append resolves,
so a Fetch waiting on that one partition resumes before the Produce that
woke it, and its answer is written first; a record is still readable only
once its write is durable. The wait's timeout and its cancellation leave no
waiter behind.
"""

from __future__ import annotations

import asyncio

from kafka_gateway.apis import fetch
from testkit.batches import make_batch
from testkit.compaction import now_ms, run_engine

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
