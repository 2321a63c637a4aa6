"""Appends take offsets in the order they were called, whether their records
are checked on the event loop (small uncompressed batches) or on a worker
thread (compressed or large ones), and whatever fails in between."""

from __future__ import annotations

import asyncio

import pytest
from test_tablet import run

from tablets import keys, validate
from tablets.errors import InvalidRecordBatch, UnknownPartition
from tablets.rocks_store import Ops
from testkit.batches import GZIP, LZ4, MALFORMED, NONE, SNAPPY, ZSTD, make_batch
from testkit.compaction import as_batches


async def stored(tablet) -> list[bytes]:
    """Every batch as bytes (from the segment files: nobody read the partition
    before, so its tail is its newest batch only)."""
    return as_batches((await tablet.read(tablet.log_start_offset, 1 << 30)).batches)


def test_a_small_uncompressed_batch_commits_before_append_returns(tmp_path):
    async def scenario(engine):
        await engine.create_topic("t", 1, {})
        tablet = engine.partition("t", 0)
        appended = tablet.append(make_batch([b"a", b"b"]), 0)
        assert tablet.log_end_offset == 2  # offsets taken before the first await
        assert (await appended).base_offset == 0

    run(scenario, tmp_path)


def test_a_batch_checked_on_a_worker_holds_back_those_after_it(tmp_path):
    async def scenario(engine):
        await engine.create_topic("t", 2, {})
        tablet, other = engine.partition("t", 0), engine.partition("t", 1)
        compressed = make_batch([b"z1", b"z2", b"z3"], codec=ZSTD)
        large = make_batch([b""] * (validate.INLINE_RECORDS + 1))
        small = make_batch([b"u"])
        first = tablet.append(compressed, 0)
        second = tablet.append(small, 0)
        third = tablet.append(large, 0)
        fourth = tablet.append(small, 0)
        assert tablet.log_end_offset == 0  # nothing commits ahead of the first
        other.append(small, 0)
        assert other.log_end_offset == 1  # another partition does not wait
        results = await asyncio.gather(first, second, third, fourth)
        assert [r.base_offset for r in results] == [0, 3, 4, 4 + validate.INLINE_RECORDS + 1]
        assert [b[16:] for b in await stored(tablet)] == [
            b[16:] for b in (compressed, small, large, small)]

    run(scenario, tmp_path)


def test_interleaved_codecs_and_failures_keep_call_order(tmp_path):
    codecs = (NONE, ZSTD, GZIP, NONE, LZ4, SNAPPY)

    async def scenario(engine):
        await engine.create_topic("t", 1, {})
        tablet = engine.partition("t", 0)
        batches: list[tuple[bytes, bool]] = []
        for i in range(60):
            if i % 7 == 3:
                batches.append((MALFORMED["garbage zstd"](0), False))  # fails on a worker
            elif i % 11 == 5:
                batches.append((MALFORMED["bytes after the last record"](0), False))  # inline
            else:
                batches.append((make_batch([b"%d" % i] * (1 + i % 4), codec=codecs[i % 6]), True))
        outcomes: list[asyncio.Future | Exception] = []
        for batch, _ in batches:
            try:
                outcomes.append(tablet.append(batch, 0))
            except Exception as exc:  # refused at once
                outcomes.append(exc)
        await asyncio.gather(*(o for o in outcomes if isinstance(o, asyncio.Future)),
                             return_exceptions=True)
        expected_offset, kept = 0, []
        for (batch, good), outcome in zip(batches, outcomes, strict=True):
            if not good:
                assert isinstance(outcome, Exception) or outcome.exception() is not None
                continue
            assert outcome.result().base_offset == expected_offset
            expected_offset += int.from_bytes(batch[57:61], "big")
            kept.append(batch)
        assert tablet.high_watermark == expected_offset
        assert [b[16:] for b in await stored(tablet)] == [b[16:] for b in kept]

    run(scenario, tmp_path)


def test_a_failed_check_frees_its_place_for_the_next(tmp_path):
    async def scenario(engine):
        await engine.create_topic("t", 1, {})
        tablet = engine.partition("t", 0)
        bad = tablet.append(MALFORMED["truncated gzip"](0), 0)
        good = tablet.append(make_batch([b"ok"]), 0)
        with pytest.raises(InvalidRecordBatch):
            await bad
        assert (await good).base_offset == 0

    run(scenario, tmp_path)


def test_a_partition_deleted_while_checking_stores_nothing(tmp_path):
    async def scenario(engine):
        await engine.create_topic("t", 1, {})
        tablet = engine.partition("t", 0)
        pending = tablet.append(make_batch([b"late"], codec=ZSTD), 0)
        await engine.delete_topic("t")
        with pytest.raises(UnknownPartition):
            await pending
        await engine.writer.submit(Ops())  # any write queued before has landed
        assert tablet.log_end_offset == 0
        log = keys.LOG + tablet.prefix
        assert list(engine.store.scan(log, log + b"\xff" * 8)) == []

    run(scenario, tmp_path)
