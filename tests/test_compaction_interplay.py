"""Compaction alongside everything else that changes or reads a log:
transactions (blobs and COMMIT markers), retention (compact,delete),
DeleteRecords, concurrent produce and fetch, ListOffsets by time, a crash
between two swaps, and the metrics.

The background cleaner is off: each run is started by the test, and a run
is driven chunk by chunk where a test needs to act between two swaps.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading

import pytest

from kafka_gateway.prometheus import compaction_families
from tablets import batch as batch_header
from tablets import compaction, keys, log_entry, segment_files
from tablets.compaction import Throttle
from tablets.errors import PolicyViolation
from tablets.seam import RunStats
from tablets.stored_batches import StoredBatches
from testkit.batches import LZ4, ZSTD
from testkit.compaction import (
    EAGER,
    as_batches,
    check_log,
    keyed_batch,
    newest,
    now_ms,
    produce,
    read_all,
    read_batches,
    run_engine,
)
from txn import TransactionCoordinator, TxnSettings


def chunks_of(engine, tablet, max_keys=1 << 20):
    """A forced run's plan and its chunks, to be swapped in one by one."""
    plan = tablet.compaction.plan(now_ms(), force=True)
    chunks = compaction.run(StoredBatches(engine.store, tablet.prefix, tablet.read_entry), plan,
                            os.urandom(16), max_keys, Throttle(float("inf"), threading.Event()),
                            RunStats())
    return plan, chunks


def blob_keys(engine):
    return [k for k, _ in engine.store.scan(keys.TXN_BLOB, keys.prefix_end(keys.TXN_BLOB))]


def references(engine, tablet):
    """Offsets of the log's entries that name a transactional batch's bytes
    where it was produced (not rewritten by compaction)."""
    floor = keys.LOG + tablet.prefix
    return [keys.offset_of_key(k) for k, e in engine.store.scan(floor, floor + b"\xff" * 8)
            if log_entry.locate(e)[3]]


# ------------------------------------------------------------ transactions


async def commit(txns, engine, tid, tp, batches, abort=False):
    """One transaction of ``batches`` (lists of (key, value)) on ``tp``."""
    pid, epoch = await txns.init_producer_id(tid, 60_000)
    await txns.add_partitions(tid, pid, epoch, [tp], -1)
    sequence = 0
    for pairs in batches:
        data = keyed_batch(pairs, producer_id=pid, producer_epoch=epoch, base_sequence=sequence,
                           attributes=batch_header.ATTR_TRANSACTIONAL, codec=ZSTD)
        await engine.partition(*tp).append(data, now_ms(), txns.sink_for(tid, pid, epoch, *tp, -1))
        sequence += len(pairs)
    await txns.end_txn(tid, pid, epoch, not abort, -1)


def test_committed_transactions_are_compacted_inline_and_their_markers_go(tmp_path):
    """A committed transaction's batches are references to blobs: compaction
    resolves them, keeps what is newest, writes it inline and deletes the
    blobs (a batch that keeps every record stays a reference). A COMMIT
    marker stays while a record of its transaction does; once none is left,
    the next run stamps it with a delete horizon and the one after
    (delete.retention.ms=0) drops it. read_committed readers see only
    the newest values throughout."""
    async def scenario(engine):
        await engine.create_topic("c", 1, EAGER)
        tablet = engine.partition("c", 0)
        txns = TransactionCoordinator(engine, TxnSettings(), now_ms)
        txns.load()
        await commit(txns, engine, "t1", ("c", 0), [[(b"a", b"1"), (b"b", b"1")],
                                                     [(b"c", b"1")]])
        await commit(txns, engine, "t2", ("c", 0), [[(b"a", b"2")]])
        await commit(txns, engine, "t3", ("c", 0), [[(b"x", b"3")]], abort=True)
        await produce(tablet, [keyed_batch([(b"b", b"4"), (b"c", b"4")]),
                               keyed_batch([(b"head", b"5")])])
        assert len(references(engine, tablet)) == 3 and len(blob_keys(engine)) == 0

        def markers():
            return [batch_header.base_offset_of(b) for b in batches
                    if batch_header.parse_batches(b)[0].is_control]

        await engine.compact("c", 0)
        batches = await read_batches(tablet)
        assert references(engine, tablet) == [4] and len(blob_keys(engine)) == 0
        assert markers() == [3, 5]  # t1's marker is kept this run, t2's still marks a=2
        [t1_marker] = [b for b in batches if batch_header.base_offset_of(b) == 3]
        [t1_header] = batch_header.parse_batches(t1_marker)
        assert t1_header.attributes & batch_header.ATTR_DELETE_HORIZON
        await engine.compact("c", 0)
        batches = await read_batches(tablet)
        assert markers() == [5]
        assert [(r.offset, r.key, r.value) for r in await read_all(tablet)] == [
            (4, b"a", b"2"), (6, b"b", b"4"), (7, b"c", b"4"), (8, b"head", b"5")]
        check_log(tablet)

    run_engine(scenario, tmp_path)


def test_commits_within_segment_ms_stay_in_the_head_segment_until_a_later_commit(tmp_path):
    """What test_compaction_streams relies on: a COMMIT marker bears the
    commit's time, so with segment.ms=200 and records stamped long ago (a
    Kafka Streams changelog of old input) a segment rolls at the first commit
    200 ms after the segment began. Everything committed within those 200 ms
    stays in the head segment, which compaction never touches: nothing there
    is cleanable (cleanable_bytes 0) until a later commit rolls it."""
    async def scenario(engine):
        await engine.create_topic("c", 1, {"cleanup.policy": "compact", "segment.ms": "200",
                                           "min.cleanable.dirty.ratio": "0.01"})
        tablet = engine.partition("c", 0)
        clock = [now_ms()]
        txns = TransactionCoordinator(engine, TxnSettings(), lambda: clock[0])
        txns.load()
        stamp = clock[0] - 90_000

        async def commit_at(ms, tid, rounds):
            clock[0] = ms
            pid, epoch = await txns.init_producer_id(tid, 60_000)
            await txns.add_partitions(tid, pid, epoch, [("c", 0)], -1)
            for n in range(rounds):
                data = keyed_batch([(b"k%d" % k, b"%s-%d" % (tid.encode(), n)) for k in range(4)],
                                   timestamp=stamp, producer_id=pid, producer_epoch=epoch,
                                   base_sequence=4 * n, attributes=batch_header.ATTR_TRANSACTIONAL)
                await tablet.append(data, ms, txns.sink_for(tid, pid, epoch, "c", 0, -1))
            await txns.end_txn(tid, pid, epoch, True, -1)
            return tablet.log_end_offset

        start = clock[0]
        first = await commit_at(start, "t1", 1)  # records 0-3, its marker 4 starts a segment
        second = await commit_at(start + 100, "t2", 5)  # 100 ms later: the same segment
        assert [s.base for s in tablet.segments.closed] == [0]
        assert tablet.segments.active.base == first - 1
        await engine.compact("c", 0)
        assert tablet.clean_end == first - 1
        # t2 is dirty, in the head
        assert tablet.compaction.cleanable(now_ms()).cleanable_bytes == 0
        assert tablet.compaction.plan(now_ms()) is None
        await commit_at(start + 5_000, "t3", 1)  # its marker rolls the head segment
        assert tablet.segments.active.base == tablet.log_end_offset - 1
        assert tablet.compaction.cleanable(now_ms()).cleanable_bytes > 0
        await engine.compact("c", 0)
        assert tablet.clean_end >= second  # compacted past t2
        assert [r.value for r in await read_all(tablet)] == [b"t3-0"] * 4
        check_log(tablet)

    run_engine(scenario, tmp_path)


# -------------------------------------------------- retention, DeleteRecords


def test_delete_records_needs_a_delete_policy(tmp_path):
    """DeleteRecords on a compact-only topic: POLICY_VIOLATION, as Kafka; with
    compact,delete it moves the log start and compaction starts over there."""
    async def scenario(engine):
        await engine.create_topic("c", 1, EAGER)
        tablet = engine.partition("c", 0)
        await produce(tablet, [keyed_batch([(b"k%d" % i, b"1")]) for i in range(6)])
        with pytest.raises(PolicyViolation, match="can not be deleted due to the configured"):
            await tablet.delete_records(3)
        await engine.compact("c", 0)
        assert tablet.clean_end == 5
        await engine.set_topic_configs("c", {**EAGER, "cleanup.policy": "compact,delete"})
        await produce(tablet, [keyed_batch([(b"k%d" % i, b"2")]) for i in range(6)])
        assert await tablet.delete_records(7) == 7
        check_log(tablet)
        await engine.compact("c", 0)
        assert [(r.offset, r.value) for r in await read_all(tablet)] == [
            (7, b"2"), (8, b"2"), (9, b"2"), (10, b"2"), (11, b"2")]
        check_log(tablet)

    run_engine(scenario, tmp_path)


def test_retention_and_compaction_share_a_compact_delete_log(tmp_path):
    """compact,delete: retention.ms drops the old batches, compaction the
    superseded records of the rest; compact alone keeps old data forever."""
    async def scenario(engine):
        old = now_ms() - 3_600_000
        for name, policy in (("both", "compact,delete"), ("compact", "compact")):
            await engine.create_topic(name, 1, {**EAGER, "cleanup.policy": policy,
                                                "retention.ms": "600000"})
            await produce(engine.partition(name, 0), [
                keyed_batch([(b"a", b"old"), (b"b", b"old")], timestamp=old),
                keyed_batch([(b"a", b"new"), (b"c", b"new")]),
                keyed_batch([(b"c", b"newer")]), keyed_batch([(b"head", b"x")])])
        await engine.enforce_retention()
        for name in ("both", "compact"):
            await engine.compact(name, 0)
            check_log(engine.partition(name, 0))
        values = {name: [(r.offset, r.key, r.value) for r in await read_all(
            engine.partition(name, 0))] for name in ("both", "compact")}
        assert values["both"] == [(2, b"a", b"new"), (4, b"c", b"newer"), (5, b"head", b"x")]
        assert values["compact"] == [(1, b"b", b"old"), *values["both"]]

    run_engine(scenario, tmp_path)


def test_a_run_stops_when_the_log_start_moves_between_two_swaps(tmp_path, monkeypatch):
    """DeleteRecords between two chunks: the rest of the run is not swapped in
    (its chunks were read before the log start moved), the log stays whole,
    and the next run compacts from the new log start."""
    monkeypatch.setattr(compaction, "CHUNK_BATCHES", 2)

    async def scenario(engine):
        await engine.create_topic("c", 1, {**EAGER, "cleanup.policy": "compact,delete"})
        tablet = engine.partition("c", 0)
        await produce(tablet, [keyed_batch([(b"k%d" % (i % 3), b"%d" % i)]) for i in range(10)])
        plan, chunks = chunks_of(engine, tablet)
        assert await tablet.compaction.apply(next(chunks), plan)
        await tablet.delete_records(5)
        assert not await tablet.compaction.apply(next(chunks), plan)
        assert tablet.clean_end == 0
        check_log(tablet)
        await engine.compact("c", 0)
        assert [(r.offset, r.value) for r in await read_all(tablet)] == [
            (6, b"6"), (7, b"7"), (8, b"8"), (9, b"9")]  # k0's newest is in the head
        check_log(tablet)

    run_engine(scenario, tmp_path)


# ----------------------------------------------------- concurrent readers


def test_produce_and_fetch_go_on_while_compaction_runs(tmp_path, monkeypatch):
    """Runs of small chunks, one after another, while a producer appends 300
    batches and two readers read the log to its end over and over: every
    read is a log of ascending offsets in which each key's last record is its
    newest (nothing live ever missing), and the final log is the model's."""
    monkeypatch.setattr(compaction, "CHUNK_BATCHES", 3)
    rng = random.Random(7)
    produced: list[bytes] = []  # the key of the n-th record produced (its value is b"n")

    async def producer(tablet):
        for _ in range(300):
            first = len(produced)
            produced.extend(b"k%d" % rng.randrange(40) for _ in range(3))
            pairs = [(produced[n], b"%d" % n) for n in range(first, first + 3)]
            await tablet.append(keyed_batch(pairs, codec=rng.choice([0, LZ4, ZSTD])), now_ms())
            await asyncio.sleep(0.002)

    def check(records) -> int:
        """Ascending, and each key's last record its newest up to the last one read."""
        seen: dict[bytes, int] = {}
        last_offset = last = -1
        for record in records:
            number = int(record.value)
            assert record.offset > last_offset and number > last
            last_offset, last = record.offset, number
            seen[record.key] = number
        assert seen == {produced[n]: n for n in range(last + 1)}
        return last

    async def reader(tablet, stop, scans):
        while not stop.is_set():
            scans.append(check(await read_all(tablet)))
            await asyncio.sleep(0.005)

    async def scenario(engine):
        await engine.create_topic("c", 1, EAGER)
        tablet = engine.partition("c", 0)
        stop = asyncio.Event()
        scans: list[int] = []
        producing = asyncio.create_task(producer(tablet))
        readers = [asyncio.create_task(reader(tablet, stop, scans)) for _ in range(2)]
        runs = 0
        try:
            while not producing.done():
                if (await engine.compact("c", 0)) is not None:
                    runs += 1
                await asyncio.sleep(0.01)
            await producing
        finally:
            stop.set()
            await asyncio.gather(*readers)
        assert runs > 5 and len(scans) > 10 and engine.cleaner.stats.chunks > runs
        await engine.compact("c", 0)
        check_log(tablet)
        assert check(await read_all(tablet)) == len(produced) - 1

    run_engine(scenario, tmp_path)


def test_a_read_that_began_before_a_swap_finds_the_rewritten_batch(tmp_path, monkeypatch):
    """A disk read whose scan still saw an entry, after compaction rewrote
    that batch to a new file and deleted the old file, reads the entry again."""
    monkeypatch.setattr(segment_files, "FILE_MIN_BYTES", 0)  # a file per batch

    async def scenario(engine):
        await engine.create_topic("c", 1, {**EAGER, "segment.bytes": "100"})
        tablet = engine.partition("c", 0)
        txns = TransactionCoordinator(engine, TxnSettings(), now_ms)
        txns.load()
        await commit(txns, engine, "t", ("c", 0), [[(b"a", b"1"), (b"b", b"1")]])
        await produce(tablet, [keyed_batch([(b"a", b"2")]), keyed_batch([(b"h", b"1")])])
        floor = keys.LOG + tablet.prefix
        stale = list(engine.store.scan(floor, floor + b"\xff" * 8))
        await engine.compact("c", 0)
        old_file = log_entry.locate(stale[0][1])[0]
        assert old_file not in tablet.files.files  # the premise: its file is gone
        engine.store.scan_from_containing = lambda *_args: iter(stale)
        batches = as_batches(tablet.reads.read(0, 1 << 20).batches)
        assert [batch_header.base_offset_of(b) for b in batches] == [0, 2, 3, 4]  # 2: the marker
        assert [batch_header.record_count_of(b) for b in batches] == [1, 1, 1, 1]

    run_engine(scenario, tmp_path)


# --------------------------------------------------------- time and crashes


def test_offsets_by_time_and_retention_by_time_stay_exact(tmp_path):
    """The time index of a compacted range is rebuilt from the batches kept:
    ListOffsets by timestamp finds the first kept record at or after a time,
    and time-based retention still keeps every batch newer than its cutoff."""
    async def scenario(engine):
        base = now_ms() - 100_000
        await engine.create_topic("c", 1, {**EAGER, "cleanup.policy": "compact,delete"})
        tablet = engine.partition("c", 0)
        stamps = [base + t for t in (10_000, 50_000, 20_000, 30_000, 60_000, 40_000, 70_000)]
        keys_ = [b"a", b"b", b"c", b"b", b"d", b"e", b"f"]
        await produce(tablet, [keyed_batch([(k, b"v")], timestamp=t)
                               for k, t in zip(keys_, stamps, strict=True)])
        await engine.compact("c", 0)  # offset 1 (b @ +50s) goes: b is newer at offset 3
        check_log(tablet)
        assert await tablet.offset_for_timestamp(base + 45_000) == (4, base + 60_000)
        assert await tablet.offset_for_timestamp(base + 25_000) == (3, base + 30_000)
        await engine.set_topic_configs("c", {**EAGER, "cleanup.policy": "compact,delete",
                                             "retention.ms": str(now_ms() - base - 35_000)})
        await engine.enforce_retention()
        assert [r.offset for r in await read_all(tablet)] == [4, 5, 6]
        check_log(tablet)

    run_engine(scenario, tmp_path)


def test_a_crash_between_two_swaps_loses_nothing(tmp_path, monkeypatch):
    """Stop a run after two of its chunks and reopen the store (as after
    kill -9: the swaps written are whole, the rest never happened): every
    key's newest record is there, the byte counts match the entries, and
    the next run finishes the job."""
    monkeypatch.setattr(compaction, "CHUNK_BATCHES", 4)
    expected = {}

    async def first(engine):
        await engine.create_topic("c", 1, EAGER)
        tablet = engine.partition("c", 0)
        for r in range(8):
            await produce(tablet, [keyed_batch([(b"k%d" % k, b"%d" % r)], codec=LZ4)
                                   for k in range(3)])
        expected.update(newest(await read_all(tablet)))
        plan, chunks = chunks_of(engine, tablet)
        for _ in range(2):
            assert await tablet.compaction.apply(next(chunks), plan)
        chunks.close()

    async def after_restart(engine):
        tablet = engine.partition("c", 0)
        assert tablet.clean_end == 0  # that run never finished
        assert newest(await read_all(tablet)) == expected
        check_log(tablet)
        await engine.compact("c", 0)
        records = await read_all(tablet)
        assert newest(records) == expected and len(records) == 3 + 1  # and the head's
        check_log(tablet)

    run_engine(first, tmp_path)
    run_engine(after_restart, tmp_path)


def compaction_samples(engine) -> dict[str, float]:
    """The cleaner's /metrics samples: name (with its labels, as exported) -> value."""
    found = {}
    for family in compaction_families(engine):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sample.labels.items())
            name = sample.name.removeprefix("kafka_gateway_") if not labels else sample.name
            found[name + (f"{{{labels}}}" if labels else "")] = sample.value
    return found


def test_metrics_show_cleanable_bytes_runs_and_lag(tmp_path):
    async def scenario(engine):
        await engine.create_topic("c", 1, EAGER)
        await engine.create_topic("plain", 1, {})
        tablet = engine.partition("c", 0)
        await produce(tablet, [keyed_batch([(b"a", b"%d" % i)], timestamp=now_ms() - 5000 + 2 * i)
                               for i in range(4)])
        samples = compaction_samples(engine)
        assert samples["compaction_runs_total"] == 0
        assert not [name for name in samples if 'topic="plain"' in name]
        by_name = {name.split("{")[0]: value for name, value in samples.items()}
        assert by_name["kafka_gateway_compaction_cleanable_bytes"] > 0
        assert by_name["kafka_gateway_compaction_lag_ms"] >= 5000
        await engine.compact("c", 0)
        samples = compaction_samples(engine)
        by_name = {name.split("{")[0]: value for name, value in samples.items()}
        assert samples["compaction_runs_total"] == 1
        assert samples["compaction_bytes_reclaimed_total"] == by_name[
            "kafka_gateway_compaction_partition_bytes_reclaimed_total"] > 0
        assert by_name["kafka_gateway_compaction_cleanable_bytes"] == 0
        assert by_name["kafka_gateway_compaction_clean_offset"] == 3

    run_engine(scenario, tmp_path)
