"""Compaction of a partition's log (tablets/compaction.py, compacted_log.py,
segments.py): what stays, what goes, and how the stored batches look after.

Compaction runs here when a test asks (``engine.compact``); the background
cleaner is off, so nothing happens behind a test's back.
"""

from __future__ import annotations

import pytest

from tablets import CleanerSettings
from tablets import batch as batch_header
from tablets.errors import InvalidRecord, InvalidTimestamp, RecordBatchTooLarge
from tablets.records import RecordWalker
from testkit.batches import CODECS, GZIP, LZ4, NONE, SNAPPY, ZSTD, encode_record
from testkit.compaction import (
    EAGER,
    Rec,
    as_batches,
    check_log,
    decode,
    keyed_batch,
    newest,
    now_ms,
    produce,
    read_all,
    read_batches,
    run_engine,
)


def rounds(n_rounds: int, n_keys: int, codec: int = NONE, tag: bytes = b"v") -> list[bytes]:
    """``n_rounds`` batches, each with one value for every key."""
    return [keyed_batch([(b"k%d" % k, b"%s%d-%d" % (tag, r, k)) for k in range(n_keys)],
                        codec=codec) for r in range(n_rounds)]


# ------------------------------------------------------------------ what stays


@pytest.mark.parametrize("codec", [NONE, GZIP, SNAPPY, LZ4, ZSTD], ids=["none", *CODECS])
def test_the_newest_value_of_each_key_stays_at_its_offset(tmp_path, codec):
    """Ten rounds of ten keys: after compaction a reader from the start sees
    each key once, with its newest value and the offset it was written at;
    the head (the last segment) is untouched; every rewritten batch keeps its
    codec, base offset and last offset delta, and has a valid CRC."""
    async def scenario(engine):
        await engine.create_topic("c", 1, EAGER)
        tablet = engine.partition("c", 0)
        before = await produce(tablet, rounds(10, 10, codec))
        written = await read_all(tablet)
        old = {batch_header.base_offset_of(b): batch_header.parse_batches(b)[0]
               for b in await read_batches(tablet)}
        stats = await engine.compact("c", 0)
        assert stats is not None and stats.records_kept == 10 and stats.map_end == 90
        after = await read_all(tablet)
        head = [r for r in written if r.offset >= 90]
        assert after == sorted(newest([r for r in written if r.offset < 90]).values(),
                               key=lambda r: r.offset) + head
        for data in await read_batches(tablet):
            header = batch_header.parse_batches(data)[0]
            original = old[header.base_offset]
            assert header.compression == codec
            assert header.last_offset_delta == original.last_offset_delta
            assert header.base_offset in before
        check_log(tablet)
        assert tablet.clean_end == 90
        return after

    after = run_engine(scenario, tmp_path)
    # The same log after a restart.
    assert run_engine(lambda engine: read_all(engine.partition("c", 0)), tmp_path) == after


def test_offsets_keep_their_gaps_and_timestamps_their_values(tmp_path):
    """A batch keeping records 0 and 2 of 0..3 holds exactly those offsets and
    timestamps; readers of a missing offset get the next record."""
    async def scenario(engine):
        await engine.create_topic("c", 1, EAGER)
        tablet = engine.partition("c", 0)
        first = keyed_batch([(b"a", b"1"), (b"b", b"1"), (b"c", b"1"), (b"d", b"1")],
                            timestamp=1000, timestamp_deltas=[0, 5, 9, 3])
        await produce(tablet, [first, keyed_batch([(b"b", b"2"), (b"d", b"2")]),
                               keyed_batch([(b"head", b"x")])])
        await engine.compact("c", 0)
        [kept, second, _head] = await read_batches(tablet)
        assert decode(kept) == [Rec(0, 1000, b"a", b"1"), Rec(2, 1009, b"c", b"1")]
        header = batch_header.parse_batches(kept)[0]
        assert (header.record_count, header.last_offset_delta, header.max_timestamp) == (2, 3,
                                                                                         1009)
        # The batch holding offset 1's gap.
        assert as_batches((await tablet.read(1, 1)).batches) == [kept]
        assert [r.offset for r in decode(second)] == [4, 5]
        check_log(tablet)

    run_engine(scenario, tmp_path)


def test_records_without_a_key_go(tmp_path):
    """A topic that was not compacted may hold records without a key; once
    compacted, they go (as Kafka's cleaner drops them)."""
    async def scenario(engine):
        await engine.create_topic("c", 1, {"segment.bytes": "100"})
        tablet = engine.partition("c", 0)
        await produce(tablet, [keyed_batch([(None, b"x"), (b"k", b"1")]),
                               keyed_batch([(None, b"y")]), keyed_batch([(b"k", b"2")]),
                               keyed_batch([(b"h", b"1")])])
        await engine.set_topic_configs("c", EAGER)
        await engine.compact("c", 0)
        assert [(r.offset, r.key) for r in await read_all(tablet)] == [(3, b"k"), (4, b"h")]
        check_log(tablet)

    run_engine(scenario, tmp_path)


# -------------------------------------------------------------- tombstones


def test_a_tombstone_is_stamped_then_dropped_after_delete_retention(tmp_path):
    """The first run keeps the tombstone (and drops what it deletes), stamping
    its batch with a delete horizon (KIP-534: attribute bit 6, base timestamp
    = now + delete.retention.ms), the records keeping their timestamps; a run
    after the horizon drops it."""
    async def scenario(engine):
        await engine.create_topic("c", 1, EAGER)
        tablet = engine.partition("c", 0)
        await produce(tablet, [keyed_batch([(b"a", b"1"), (b"b", b"1")], timestamp=5000),
                               keyed_batch([(b"a", None), (b"c", b"1")], timestamp=6000,
                                           timestamp_deltas=[0, 7]),
                               keyed_batch([(b"head", b"x")])])
        started = now_ms()
        await engine.compact("c", 0)
        [first, stamped, _head] = await read_batches(tablet)
        assert decode(first) == [Rec(1, 5000, b"b", b"1")]
        header = batch_header.parse_batches(stamped)[0]
        assert header.attributes & batch_header.ATTR_DELETE_HORIZON
        assert started <= header.base_timestamp <= now_ms()  # delete.retention.ms=0
        assert decode(stamped) == [Rec(2, 6000, b"a", None), Rec(3, 6007, b"c", b"1")]
        await engine.compact("c", 0)
        assert [(r.offset, r.key) for r in await read_all(tablet)] == [(1, b"b"), (3, b"c"),
                                                                        (4, b"head")]
        check_log(tablet)

    run_engine(scenario, tmp_path)


def test_a_tombstone_stays_until_its_horizon(tmp_path):
    """With delete.retention.ms of a day the tombstone survives later runs,
    and its horizon is not moved by them."""
    async def scenario(engine):
        await engine.create_topic("c", 1, {**EAGER, "delete.retention.ms": "86400000"})
        tablet = engine.partition("c", 0)
        await produce(tablet, [keyed_batch([(b"a", b"1")]), keyed_batch([(b"a", None)]),
                               keyed_batch([(b"b", b"1")])])
        await engine.compact("c", 0)
        horizon = batch_header.parse_batches((await read_batches(tablet))[0])[0].base_timestamp
        assert horizon >= now_ms() + 86_000_000
        await produce(tablet, [keyed_batch([(b"b", b"2")]), keyed_batch([(b"z", b"1")])])
        await engine.compact("c", 0)
        [tombstone, *_] = await read_batches(tablet)
        assert decode(tombstone)[0] == Rec(1, decode(tombstone)[0].timestamp, b"a", None)
        assert batch_header.parse_batches(tombstone)[0].base_timestamp == horizon
        assert tablet.compaction.next_horizon == horizon
        # A run is due at the horizon without new dirty data.
        assert tablet.compaction.plan(horizon - 1) is None
        assert tablet.compaction.plan(horizon) is not None

    run_engine(scenario, tmp_path)


# ---------------------------------------------------- when compaction runs


def test_the_active_segment_is_never_compacted(tmp_path):
    """segment.bytes large: everything is in the active segment, nothing is
    cleanable; a batch that would pass segment.bytes rolls a segment (as
    Kafka rolls before the append), and what came before becomes cleanable."""
    async def scenario(engine):
        await engine.create_topic("c", 1, {"cleanup.policy": "compact", "segment.bytes": "600",
                                           "min.cleanable.dirty.ratio": "0.01"})
        tablet = engine.partition("c", 0)
        await produce(tablet, rounds(5, 2))  # 5 batches of about 80 bytes: one segment
        assert tablet.segments.closed == []
        assert tablet.compaction.plan(now_ms()) is None
        stats = await engine.compact("c", 0)
        assert stats is not None and stats.records_read == 0
        assert len(await read_all(tablet)) == 10
        await produce(tablet, rounds(5, 2, tag=b"w"))
        written = await read_all(tablet)
        [closed] = tablet.segments.closed
        head = tablet.segments.active.base
        assert closed.base == 0 and 10 <= head < 20
        assert tablet.compaction.plan(now_ms()) is not None
        await engine.compact("c", 0)
        assert await read_all(tablet) == [
            *sorted(newest([r for r in written if r.offset < head]).values(),
                    key=lambda r: r.offset),
            *(r for r in written if r.offset >= head)]
        check_log(tablet)

    run_engine(scenario, tmp_path)


def test_segment_ms_rolls_on_a_later_append(tmp_path):
    """A batch stamped more than segment.ms after the active segment's first
    one starts a new segment; nothing rolls without an append."""
    async def scenario(engine):
        await engine.create_topic("c", 1, {"cleanup.policy": "compact", "segment.ms": "1000"})
        tablet = engine.partition("c", 0)
        base = now_ms()
        await produce(tablet, [keyed_batch([(b"a", b"1")], timestamp=base),
                               keyed_batch([(b"a", b"2")], timestamp=base + 1000)])
        assert tablet.segments.closed == []
        await produce(tablet, [keyed_batch([(b"a", b"3")], timestamp=base + 1001)])
        assert [s.base for s in tablet.segments.closed] == [0]
        assert tablet.segments.active.base == 2

    run_engine(scenario, tmp_path)


def test_a_topic_not_compacted_keeps_its_closed_segments_as_one(tmp_path):
    """Bounded memory for any segment size; compacted later, all of it is cleanable."""
    async def scenario(engine):
        await engine.create_topic("d", 1, {"segment.ms": "1"})
        tablet = engine.partition("d", 0)
        await produce(tablet, rounds(6, 2))
        [closed] = tablet.segments.closed
        assert (closed.base, tablet.segments.active.base) == (0, 10)
        await engine.set_topic_configs("d", EAGER)
        await engine.compact("d", 0)
        assert [r.offset for r in await read_all(tablet)] == [8, 9, 10, 11]
        check_log(tablet)

    run_engine(scenario, tmp_path)


def test_dirty_ratio_and_compaction_lags_decide_when_a_run_is_due(tmp_path):
    """min.cleanable.dirty.ratio: due once the dirty share passes it;
    min.compaction.lag.ms: a segment with records younger than it is not
    cleanable; max.compaction.lag.ms: due when the oldest dirty segment's
    first batch is older, whatever the ratio."""
    async def scenario(engine):
        config = {"cleanup.policy": "compact", "segment.bytes": "100",
                  "min.cleanable.dirty.ratio": "0.5"}
        await engine.create_topic("c", 1, config)
        tablet = engine.partition("c", 0)
        now = now_ms()
        await produce(tablet, [keyed_batch([(b"k%d" % i, b"v")], timestamp=now - 60_000)
                               for i in range(4)])
        assert tablet.compaction.cleanable(now).ratio == 1.0  # nothing clean yet
        assert tablet.compaction.plan(now) is not None
        await engine.compact("c", 0)
        await produce(tablet, [keyed_batch([(b"k0", b"w")], timestamp=now - 60_000),
                               keyed_batch([(b"z", b"w")], timestamp=now - 60_000)])
        found = tablet.compaction.cleanable(now)
        assert 0 < found.ratio < 0.5 and tablet.compaction.plan(now) is None
        await engine.set_topic_configs("c", {**config, "max.compaction.lag.ms": "30000"})
        assert tablet.compaction.plan(now) is not None  # its first batch is a minute old
        await engine.set_topic_configs("c", {**config, "min.cleanable.dirty.ratio": "0.1",
                                             "min.compaction.lag.ms": "120000"})
        found = tablet.compaction.cleanable(now)
        assert found.first_uncleanable == found.first_dirty  # all of it too young
        assert tablet.compaction.plan(now) is None

    run_engine(scenario, tmp_path)


def test_a_full_offset_map_stops_a_run_where_it_filled(tmp_path):
    """log.cleaner.dedupe.buffer.size for 4 keys: each run maps 4 keys of
    the dirty section and cleans up to there; runs go on until all is clean,
    with the same result as one big run."""
    async def scenario(engine):
        await engine.create_topic("c", 1, EAGER)
        tablet = engine.partition("c", 0)
        await produce(tablet, rounds(3, 10))
        written = await read_all(tablet)
        ends = []
        while tablet.clean_end < 20:
            stats = await engine.compact("c", 0)
            ends.append(stats.map_end)
            check_log(tablet)
        assert ends == [4, 8, 12, 16, 20]  # where the map of 4 keys filled
        expected = sorted(newest([r for r in written if r.offset < 20]).values(),
                          key=lambda r: r.offset)
        assert await read_all(tablet) == expected + [r for r in written if r.offset >= 20]

    from tablets.compaction import ENTRY_COST
    run_engine(scenario, tmp_path, cleaner=CleanerSettings(enable=False,
                                                    dedupe_buffer_bytes=4 * ENTRY_COST))


# -------------------------------------------------------- stored batches


def test_snappy_keeps_its_framing_and_log_append_time_its_timestamp(tmp_path):
    """A raw snappy block (librdkafka's) is written back as one raw block, a
    xerial-framed one (the Java client's) in xerial framing; a LogAppendTime
    batch keeps the time it was stamped with."""
    async def scenario(engine):
        # Appended in one millisecond: segments roll by size (batches of 70-101 bytes).
        await engine.create_topic("c", 1, {**EAGER, "message.timestamp.type": "LogAppendTime",
                                           "segment.bytes": "140"})
        tablet = engine.partition("c", 0)
        await produce(tablet, [
            keyed_batch([(b"a", b"1"), (b"b", b"1")], codec=SNAPPY, xerial=False),
            keyed_batch([(b"c", b"1"), (b"b", b"2")], codec=SNAPPY, xerial=True),
            keyed_batch([(b"c", b"2"), (b"d", b"1")]), keyed_batch([(b"h", b"1")])])
        stamped = [batch_header.max_timestamp_of(b) for b in await read_batches(tablet)]
        await engine.compact("c", 0)
        raw, xerial, _, _ = await read_batches(tablet)
        assert not raw[batch_header.HEADER_SIZE:].startswith(b"\x82SNAPPY\x00")
        assert xerial[batch_header.HEADER_SIZE:].startswith(b"\x82SNAPPY\x00")
        assert [batch_header.max_timestamp_of(b) for b in (raw, xerial)] == stamped[:2]
        assert [(r.offset, r.timestamp) for r in decode(raw) + decode(xerial)] == [
            (0, stamped[0]), (3, stamped[1])]

    run_engine(scenario, tmp_path)


def test_a_record_too_long_to_copy_leaves_its_batch_as_it_is(tmp_path, monkeypatch):
    """Compaction holds a kept record that spans decompressed pieces only up
    to MAX_RECORD_BYTES; a batch with a longer one stays whole (readers see a
    superseded record more, never less)."""
    from tablets import compaction, records
    monkeypatch.setattr(compaction, "MAX_RECORD_BYTES", 2000)
    monkeypatch.setattr(records, "CHUNK_BYTES", 1024)

    async def scenario(engine):
        await engine.create_topic("c", 1, EAGER)
        tablet = engine.partition("c", 0)
        big = keyed_batch([(b"a", b"1"), (b"big", b"x" * 5000)], codec=ZSTD)
        await produce(tablet, [big, keyed_batch([(b"a", b"2")]), keyed_batch([(b"h", b"1")])])
        await engine.compact("c", 0)
        assert [r.key for r in await read_all(tablet)] == [b"a", b"big", b"a", b"h"]
        check_log(tablet)

    run_engine(scenario, tmp_path)


# ------------------------------------------------------------ produce checks


def test_a_record_without_a_key_is_refused_by_a_compacted_topic(tmp_path):
    """INVALID_RECORD naming each record without a key, as Kafka 3.4's
    LogValidator; a record without a key and out of the timestamp range is
    named for its key, and a timestamp error elsewhere makes the whole
    answer INVALID_TIMESTAMP; nothing is stored."""
    async def scenario(engine):
        await engine.create_topic("c", 1, {"cleanup.policy": "compact,delete",
                                           "message.timestamp.difference.max.ms": "60000"})
        tablet = engine.partition("c", 0)
        with pytest.raises(InvalidRecord) as refused:
            await tablet.append(keyed_batch([(b"k", b"1"), (None, b"2"), (None, b"3")]),
                                now_ms())
        no_key = "Compacted topic cannot accept message without key in topic partition c-0."
        assert refused.value.record_errors == ((1, no_key), (2, no_key))
        assert str(refused.value) == (
            "One or more records have been rejected due to 2 record errors in total, and only "
            f"showing the first three errors at most: [RecordError(batchIndex=1, message='"
            f"{no_key}'), RecordError(batchIndex=2, message='{no_key}')]")
        with pytest.raises(InvalidRecord):  # compressed: checked on a worker thread
            await tablet.append(keyed_batch([(None, b"x")] * 5000, codec=LZ4), now_ms())
        old = now_ms() - 3_600_000
        with pytest.raises(InvalidRecord) as refused:
            await tablet.append(keyed_batch([(None, b"1")], timestamp=old), now_ms())
        assert refused.value.record_errors == ((0, no_key),)
        with pytest.raises(InvalidTimestamp) as refused:
            await tablet.append(keyed_batch([(None, b"1"), (b"k", b"2")], timestamp=old),
                                now_ms())
        assert [i for i, _m in refused.value.record_errors] == [0, 1]
        assert refused.value.record_errors[0][1] == no_key
        assert tablet.log_end_offset == 0
        assert (await tablet.append(keyed_batch([(b"k", b"1")]), now_ms())).base_offset == 0

    run_engine(scenario, tmp_path)


def test_a_batch_larger_than_segment_bytes_is_refused(tmp_path):
    """As Kafka's log append: RECORD_LIST_TOO_LARGE, after the record checks."""
    async def scenario(engine):
        await engine.create_topic("c", 1, {"cleanup.policy": "compact", "segment.bytes": "100"})
        tablet = engine.partition("c", 0)
        with pytest.raises(RecordBatchTooLarge, match=r"Message batch size is \d+ bytes in "
                           r"append to partition c-0, which exceeds the maximum configured "
                           r"segment size of 100\."):
            await tablet.append(keyed_batch([(b"k%d" % i, b"v") for i in range(5)]), now_ms())
        with pytest.raises(InvalidRecord):  # the records are checked first
            await tablet.append(keyed_batch([(None, b"v")] * 5), now_ms())
        assert (await tablet.append(keyed_batch([(b"k", b"v")]), now_ms())).base_offset == 0

    run_engine(scenario, tmp_path)


def test_keyed_walk_reports_the_same_records_however_the_stream_is_cut():
    """The record walker's compaction mode: for each record its offset delta,
    timestamp, a digest that depends only on the key (and the run's seed), a
    tombstone flag and where its offset delta and its end lie, whatever
    chunks the stream comes in."""
    records = b"".join([encode_record(b"v", 0, b"k1", 3), encode_record(None, 1, b"k2"),
                        encode_record(b"v", 2, None, -2), encode_record(b"w" * 300, 5, b"k1"),
                        encode_record(b"", 6, b"", 1, ((b"h", None),))])
    seed = bytes(range(16))

    def walk(cuts):
        walker = RecordWalker(5, 100, contiguous=False, key_seed=seed)
        out, last = [], 0
        for cut in [*cuts, len(records)]:
            out += walker.feed(records[last:cut])
            last = cut
        walker.finish()
        return out

    whole = walk([])
    assert [(d, ts, tomb) for d, ts, _k, tomb, _b, _e in whole] == [
        (0, 103, False), (1, 100, True), (2, 98, False), (5, 100, False), (6, 101, False)]
    digests = [k for _d, _t, k, _tomb, _b, _e in whole]
    assert digests[0] == digests[3] and digests[2] is None
    assert len({digests[0], digests[1], digests[4]}) == 3
    ends = [e for *_, e in whole]
    assert ends[-1] == len(records) and ends == sorted(ends)
    for cut in range(1, len(records)):
        assert walk([cut]) == whole
    assert walk(list(range(1, len(records)))) == whole
    other = RecordWalker(5, 100, contiguous=False, key_seed=bytes(16))
    assert other.feed(records)[0][2] != digests[0]  # another seed, another digest
    with pytest.raises(ValueError):
        RecordWalker(1, 0, key_seed=b"short")


def test_the_offset_map_keys_on_the_whole_key(tmp_path):
    """Keys that share a long prefix, or differ only in length, are different keys."""
    async def scenario(engine):
        await engine.create_topic("c", 1, EAGER)
        tablet = engine.partition("c", 0)
        prefix = b"p" * 1000
        keys_ = [prefix, prefix + b"\x00", prefix + b"q", b"", b"\x00"]
        await produce(tablet, [keyed_batch([(k, b"1") for k in keys_], codec=GZIP),
                               keyed_batch([(k, b"2") for k in keys_]),
                               keyed_batch([(b"h", b"1")])])
        await engine.compact("c", 0)
        assert [(r.key, r.value) for r in await read_all(tablet)] == [
            *((k, b"2") for k in keys_), (b"h", b"1")]

    run_engine(scenario, tmp_path)


def test_segments_survive_a_restart(tmp_path):
    """The closed segments and the active one are read back as written."""
    async def write(engine):
        await engine.create_topic("c", 1, EAGER)
        await produce(engine.partition("c", 0), rounds(4, 3))
        segments = engine.partition("c", 0).segments
        return list(segments.closed), segments.active

    async def reread(engine):
        segments = engine.partition("c", 0).segments
        return list(segments.closed), segments.active

    before = run_engine(write, tmp_path)
    assert len(before[0]) == 3
    assert run_engine(reread, tmp_path) == before
