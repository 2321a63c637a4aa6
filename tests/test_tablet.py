"""PartitionTablet and StorageEngine: append, read, restart, retention, timestamps."""

from __future__ import annotations

import asyncio

import pytest

from tablets import EngineSettings, StorageEngine
from tablets.errors import (
    InvalidRecordBatch,
    OffsetOutOfRange,
    RecordTooLarge,
    TopicAlreadyExists,
    UnknownTopic,
)
from tablets.records import record_timestamps
from testkit.batches import make_batch
from testkit.compaction import as_batches
from testkit.tail_budget import reshared


def run(coro_fn, data_dir, **settings):
    """Run ``coro_fn(engine)`` against an engine on ``data_dir``, then close it."""

    async def main():
        engine = StorageEngine(str(data_dir), EngineSettings(**settings))
        engine.start(asyncio.get_running_loop())
        try:
            return await coro_fn(engine)
        finally:
            engine.close()

    return asyncio.run(main())


def offsets_of(batches):
    return [o for b in as_batches(batches) for o, _ in record_timestamps(b)]


def test_append_assigns_consecutive_offsets_and_survives_restart(tmp_path):
    async def write(engine):
        await engine.create_topic("t", 2, {})
        tablet = engine.partition("t", 1)
        results = [await tablet.append(make_batch([b"x"] * n), 0) for n in (3, 1, 5)]
        assert [r.base_offset for r in results] == [0, 3, 4]
        assert tablet.high_watermark == tablet.log_end_offset == 9

    async def reread(engine):
        tablet = engine.partition("t", 1)
        assert (tablet.log_start_offset, tablet.high_watermark) == (0, 9)
        result = await tablet.read(0, 1 << 20)
        assert offsets_of(result.batches) == list(range(9))
        assert engine.partition("t", 0).high_watermark == 0
        appended = await tablet.append(make_batch([b"y"]), 0)
        assert appended.base_offset == 9

    run(write, tmp_path)
    run(reread, tmp_path)


def test_concurrent_appends_share_one_write(tmp_path):
    async def scenario(engine):
        await engine.create_topic("t", 4, {})
        before = engine.store.stats.writes
        futures = [engine.partition("t", i % 4).append(make_batch([b"v"] * 10), 0)
                   for i in range(200)]
        results = await asyncio.gather(*futures)
        writes = engine.store.stats.writes - before
        assert sorted(r.base_offset for r in results) == sorted(
            [10 * k for k in range(50)] * 4)
        assert writes < 200  # group commit merged concurrent changes
        for i in range(4):
            assert engine.partition("t", i).high_watermark == 500

    run(scenario, tmp_path)


def test_read_from_tail_and_from_disk_agree(tmp_path):
    async def scenario(engine):
        await engine.create_topic("t", 1, {})
        tablet = engine.partition("t", 0)
        for _ in range(50):
            await tablet.append(make_batch([b"z" * 100] * 4), 0)
        assert tablet.reads.tail_start > 0  # the small cache evicted the oldest batches
        for offset in (0, 1, 7, 100, 198, 199):
            result = await tablet.read(offset, 10_000)
            got = offsets_of(result.batches)
            assert got[0] == offset - offset % 4  # the batch containing the offset
            assert got == list(range(got[0], got[0] + len(got)))
        one = await tablet.read(0, 1)  # KIP-74: at least one whole batch
        assert len(as_batches(one.batches)) == 1
        empty = await tablet.read(200, 10_000)
        assert empty.batches == [] and empty.high_watermark == 200
        with pytest.raises(OffsetOutOfRange):
            await tablet.read(201, 10_000)

    run(scenario, tmp_path, tail_cache_bytes=2000)


def test_invalid_and_oversized_batches_store_nothing(tmp_path):
    async def scenario(engine):
        await engine.create_topic("t", 1, {"max.message.bytes": "200"})
        tablet = engine.partition("t", 0)
        with pytest.raises(RecordTooLarge):
            tablet.append(make_batch([b"x" * 300]), 0)
        good = make_batch([b"ok"])
        with pytest.raises(InvalidRecordBatch):
            tablet.append(good + good[:-3], 0)
        assert tablet.log_end_offset == 0
        assert (await tablet.append(good, 0)).base_offset == 0

    run(scenario, tmp_path)


def test_offset_for_timestamp_is_exact(tmp_path):
    async def scenario(engine):
        await engine.create_topic("t", 1, {})
        tablet = engine.partition("t", 0)
        await tablet.append(make_batch([b"a"] * 5, base_timestamp=1000), 0)  # 0-4 @1000
        await tablet.append(make_batch([b"b"] * 5, base_timestamp=900), 0)  # 5-9 @900
        await tablet.append(make_batch([b"c"] * 5, base_timestamp=2000), 0)  # 10-14 @2000
        assert await tablet.offset_for_timestamp(0) == (0, 1000)
        assert await tablet.offset_for_timestamp(1000) == (0, 1000)
        assert await tablet.offset_for_timestamp(1001) == (10, 2000)
        assert await tablet.offset_for_timestamp(2001) is None
        assert await tablet.max_timestamp() == (10, 2000)

    run(scenario, tmp_path)


def test_retention_by_time_and_size_and_delete_records(tmp_path):
    async def scenario(engine):
        await engine.create_topic("t", 1, {"retention.ms": "1000"})
        tablet = engine.partition("t", 0)
        for ts in (100, 200, 5000, 6000):
            await tablet.append(make_batch([b"r" * 50] * 2, base_timestamp=ts), 0)
        await tablet.truncation.enforce_retention(now_ms=5500)  # cutoff 4500: first two batches go
        assert tablet.log_start_offset == 4
        with pytest.raises(OffsetOutOfRange):
            await tablet.read(0, 10_000)
        assert offsets_of((await tablet.read(4, 10_000)).batches) == [4, 5, 6, 7]

        assert await tablet.delete_records(5) == 5  # mid-batch: that batch stays
        assert offsets_of((await tablet.read(5, 10_000)).batches)[0] == 4

        await engine.set_topic_configs("t", {"retention.bytes": "100", "retention.ms": "-1"})
        await tablet.truncation.enforce_retention(now_ms=5500)
        assert tablet.log_start_offset == 6
        assert 100 <= tablet.size_bytes <= 200  # Kafka keeps at least retention.bytes
        return tablet.log_start_offset

    assert run(scenario, tmp_path) == 6

    async def reopened(engine):
        tablet = engine.partition("t", 0)
        assert (tablet.log_start_offset, tablet.high_watermark) == (6, 8)
        assert offsets_of((await tablet.read(6, 10_000)).batches) == [6, 7]

    run(reopened, tmp_path)


def test_topic_lifecycle(tmp_path):
    async def scenario(engine):
        topic = await engine.create_topic("t", 1, {})
        with pytest.raises(TopicAlreadyExists):
            await engine.create_topic("t", 1, {})
        await engine.partition("t", 0).append(make_batch([b"old"]), 0)
        await engine.create_partitions("t", 3)
        assert len(engine.topic("t").partitions) == 3
        await engine.delete_topic("t")
        with pytest.raises(UnknownTopic):
            engine.topic("t")
        again = await engine.create_topic("t", 1, {})
        assert again.topic_id != topic.topic_id
        assert again.partitions[0].high_watermark == 0  # nothing of the old topic remains
        return again.topic_id

    topic_id = run(scenario, tmp_path)

    async def reopened(engine):
        assert engine.topic("t").topic_id == topic_id
        assert len(engine.topic("t").partitions) == 1

    run(reopened, tmp_path)


def test_consumers_below_the_tail_are_served_on_the_loop(tmp_path):
    """A read below the in-memory tail hands nothing to a reader thread: the
    index is walked on the event loop, fetch after fetch, in order."""
    async def scenario(engine):
        await engine.create_topic("t", 1, {})
        tablet = engine.partition("t", 0)
        for _ in range(40):
            await tablet.append(make_batch([b"z" * 1000] * 4), 0)
        handed_off = []
        engine.store.readers.submit = lambda *args, **kw: handed_off.append(args)
        offset, seen = 0, []
        while offset < 100:  # all below the tiny tail: in the files
            result = await tablet.read(offset, 4500)
            got = offsets_of(result.batches)
            assert got[0] == offset
            seen += got
            offset = got[-1] + 1
        assert seen == list(range(100))
        assert handed_off == []

    run(scenario, tmp_path, tail_cache_bytes=2000)


def test_the_tail_budget_is_shared_by_the_partitions_that_are_read(tmp_path):
    async def scenario(engine):
        await engine.create_topic("a", 2, {})
        a0, a1 = engine.topic("a").partitions
        assert [a0.reads._tail_cache_bytes, a1.reads._tail_cache_bytes] == [0, 0]
        for _ in range(8):
            await a0.append(make_batch([b"y" * 500] * 2), 0)
        assert len(a0._tail) == 1  # nobody reads it: its newest batch only
        await a0.read(0, 1 << 20)  # read once: the whole budget is its share
        await reshared(engine.catalog.tail_budget)
        assert [a0.reads._tail_cache_bytes, a1.reads._tail_cache_bytes] == [10_000, 0]
        for _ in range(8):
            await a0.append(make_batch([b"y" * 500] * 2), 0)
        assert len(a0._tail) >= 5 and a0._tail.nbytes <= 10_000
        await engine.create_topic("b", 3, {})  # unread partitions share nothing
        assert a0.reads._tail_cache_bytes == 10_000
        await engine.partition("b", 2).read(0, 1 << 20)
        await reshared(engine.catalog.tail_budget)
        assert a0.reads._tail_cache_bytes == 5000 and a0._tail.nbytes <= 5000
        assert engine.partition("b", 2).reads._tail_cache_bytes == 5000
        await engine.delete_topic("b")
        assert a0.reads._tail_cache_bytes == 10_000
        assert engine.catalog.tail_budget.share(a1) == 0

    run(scenario, tmp_path, tail_cache_bytes=10_000)
