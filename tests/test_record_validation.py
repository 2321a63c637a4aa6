"""Record validation at produce time: every malformed batch is refused with
Kafka's error (checked against Apache Kafka 3.4.1) and nothing of it stored;
good batches in every codec are stored; timestamps follow the topic's rules."""

from __future__ import annotations

import os
import struct

import pytest
from kio.schema.errors import ErrorCode
from test_tablet import run

from common.clock import now_ms
from kafka_gateway.errors import error_code, record_errors
from tablets import keys, log_entry
from tablets import validate as validation
from tablets.batch import build_batch, parse_batches
from tablets.records import record_timestamps
from testkit.batches import (
    GZIP,
    LZ4,
    MALFORMED,
    NONE,
    SNAPPY,
    ZSTD,
    compress,
    encode_record,
    make_batch,
)
from testkit.compaction import as_batches

# Apache Kafka 3.4.1 answers the same, except where noted.
EXPECTED = {
    # Kafka: UNKNOWN_SERVER_ERROR (the codec's IOException escapes LogValidator).
    **{f"{kind} {codec}": ErrorCode.corrupt_message
       for kind in ("garbage", "truncated") for codec in ("gzip", "snappy", "lz4", "zstd")},
    # Kafka: UNKNOWN_SERVER_ERROR ("Dependent block stream is unsupported").
    "lz4 with linked blocks": ErrorCode.corrupt_message,
    "count 2^31-1, one record": ErrorCode.invalid_record,
    "count 1, five records": ErrorCode.invalid_record,
    "count 1, five zstd records": ErrorCode.invalid_record,
    "count 0": ErrorCode.invalid_record,
    "count above last offset delta": ErrorCode.invalid_record,
    # Kafka stores these two uncompressed (with offsets that do not exist) and
    # answers UNKNOWN_SERVER_ERROR compressed: refused here.
    "negative offset delta": ErrorCode.invalid_record,
    "offset deltas 0, 2": ErrorCode.invalid_record,
    "offset deltas 0, 2 zstd": ErrorCode.invalid_record,
    "garbage records": ErrorCode.invalid_record,
    "record longer than its fields": ErrorCode.invalid_record,
    "record shorter than its fields": ErrorCode.invalid_record,
    "value past the record": ErrorCode.invalid_record,
    # Kafka reads a key length of -2 as null; librdkafka consumers then fail.
    "key length -2": ErrorCode.invalid_record,
    "negative header count": ErrorCode.invalid_record,
    # Kafka: UNKNOWN_SERVER_ERROR (an IllegalArgumentException escapes).
    "varint of 6 bytes": ErrorCode.invalid_record,
    "bytes after the last record": ErrorCode.invalid_record,
    "zstd bomb, 4 GiB of zeros": ErrorCode.invalid_record,
    "two batches": ErrorCode.invalid_record,
    "base offset 5": ErrorCode.invalid_record,
    "control batch": ErrorCode.invalid_record,
    "producer id without sequence": ErrorCode.invalid_record,
    "producer sets LogAppendTime": ErrorCode.invalid_timestamp,
    "timestamp an hour old": ErrorCode.invalid_timestamp,
}
WINDOW = {"message.timestamp.difference.max.ms": "60000"}


def test_every_malformed_case_has_an_expected_answer():
    assert set(EXPECTED) == set(MALFORMED)


def stored_keys(engine, tablet) -> list[bytes]:
    prefix = keys.LOG + tablet.prefix
    return [key for key, _ in engine.store.scan(prefix, prefix + b"\xff" * 8)]


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_batch_is_refused_and_nothing_stored(tmp_path, name):
    async def scenario(engine):
        await engine.create_topic("t", 1, WINDOW)
        tablet = engine.partition("t", 0)
        now = now_ms()
        with pytest.raises(Exception) as refused:
            await tablet.append(MALFORMED[name](now), now)
        assert error_code(refused.value) is EXPECTED[name], refused.value
        assert (tablet.log_end_offset, tablet.high_watermark, tablet.size_bytes) == (0, 0, 0)
        assert stored_keys(engine, tablet) == []
        appended = await tablet.append(make_batch([b"ok"], base_timestamp=now), now)
        assert appended.base_offset == 0 and tablet.high_watermark == 1

    run(scenario, tmp_path)


GOOD_CODECS = {"none": (NONE, True), "gzip": (GZIP, True), "snappy": (SNAPPY, True),
               "raw snappy": (SNAPPY, False), "lz4": (LZ4, True), "zstd": (ZSTD, True)}


def _big_records(count: int) -> bytes:
    """Records with keys, headers and 1 KiB values: several decompressed
    chunks and, for the Java client's snappy framing, many blocks."""
    return b"".join(
        encode_record(bytes([i % 251]) * 1024, i, key=b"k%d" % i, timestamp_delta=i,
                      headers=((b"h", b"v%d" % i), (b"n", None)))
        for i in range(count)
    )


@pytest.mark.parametrize("codec_name", sorted(GOOD_CODECS))
def test_good_batches_in_every_codec_are_stored_whole(tmp_path, codec_name):
    codec, xerial = GOOD_CODECS[codec_name]

    async def scenario(engine):
        await engine.create_topic("t", 1, {})
        tablet = engine.partition("t", 0)
        now = now_ms()
        batch = build_batch(compress(codec, _big_records(400), xerial), record_count=400,
                            base_timestamp=now, max_timestamp=now + 399, attributes=codec)
        await tablet.append(make_batch([b"first"], base_timestamp=now), now)
        appended = await tablet.append(batch, now)
        assert appended.base_offset == 1 and tablet.high_watermark == 401
        [stored] = as_batches((await tablet.read(1, 1 << 30)).batches)
        assert stored[16:] == batch[16:]  # the producer's bytes, offset aside
        assert list(record_timestamps(stored)) == [(1 + i, now + i) for i in range(400)]
        assert await tablet.offset_for_timestamp(now + 250) == (251, now + 250)

    run(scenario, tmp_path)


def test_timestamps_are_checked_per_record_not_per_header(tmp_path):
    async def scenario(engine):
        await engine.create_topic("t", 1, WINDOW)
        tablet = engine.partition("t", 0)
        now = now_ms()
        # The header's base and max are recent; records 1 and 3 are not.
        batch = make_batch([b"a", b"b", b"c", b"d"], base_timestamp=now,
                           timestamp_deltas=[0, -120_000, 5, 7_200_000], max_timestamp=now)
        with pytest.raises(Exception) as refused:
            await tablet.append(batch, now)
        assert error_code(refused.value) is ErrorCode.invalid_timestamp
        assert [index for index, _ in record_errors(refused.value)] == [1, 3]
        assert "out of range" in record_errors(refused.value)[1][1]
        # A header timestamp far off does not matter when the records are fine,
        # and records without a timestamp (-1) are not checked, as in Kafka.
        fine = make_batch([b"x", b"y"], base_timestamp=now, max_timestamp=now - 10**9)
        assert (await tablet.append(fine, now)).base_offset == 0
        untimed = make_batch([b"z"], base_timestamp=-1)
        assert (await tablet.append(untimed, now)).base_offset == 2

    run(scenario, tmp_path)


def test_stored_max_timestamp_is_the_records_own(tmp_path):
    """Kafka rewrites the max timestamp a producer wrote; the time index uses it."""
    async def scenario(engine):
        await engine.create_topic("t", 1, {})
        tablet = engine.partition("t", 0)
        lying = make_batch([b"a", b"b"], base_timestamp=1000, timestamp_deltas=[0, 40],
                           max_timestamp=9_999_999, codec=ZSTD)
        await tablet.append(lying, 0)
        [stored] = as_batches((await tablet.read(0, 1 << 20)).batches)
        [header] = parse_batches(stored)  # the CRC was recomputed
        assert header.max_timestamp == 1040
        assert await tablet.max_timestamp() == (1, 1040)
        assert await tablet.offset_for_timestamp(5000) is None

    run(scenario, tmp_path)


def test_record_errors_are_bounded(tmp_path):
    count = validation.MAX_RECORD_ERRORS * 2

    async def scenario(engine):
        await engine.create_topic("t", 1, WINDOW)
        tablet = engine.partition("t", 0)
        old = make_batch([b""] * count, base_timestamp=1, codec=ZSTD)
        with pytest.raises(Exception) as refused:
            await tablet.append(old, now_ms())
        errors = record_errors(refused.value)
        assert len(errors) == validation.MAX_RECORD_ERRORS
        assert [index for index, _ in errors] == list(range(validation.MAX_RECORD_ERRORS))

    run(scenario, tmp_path)


def test_producer_log_append_time_is_refused_on_every_topic(tmp_path):
    async def scenario(engine):
        await engine.create_topic("t", 1, {"message.timestamp.type": "LogAppendTime"})
        tablet = engine.partition("t", 0)
        batch = MALFORMED["producer sets LogAppendTime"](0)
        with pytest.raises(Exception) as refused:
            await tablet.append(batch, 5)
        assert error_code(refused.value) is ErrorCode.invalid_timestamp
        assert "LogAppendTime" in record_errors(refused.value)[0][1]
        appended = await tablet.append(make_batch([b"a"], base_timestamp=1), 77)
        assert appended.log_append_time == 77

    run(scenario, tmp_path)


def test_oversized_batch_is_refused_before_its_records_are_read(tmp_path):
    async def scenario(engine):
        await engine.create_topic("t", 1, {"max.message.bytes": "1000"})
        tablet = engine.partition("t", 0)
        big = bytearray(make_batch([b"x" * 2000]))
        big[-1] ^= 1  # corrupt too: the size is what Kafka reports first
        struct.pack_into(">i", big, 57, 2)
        with pytest.raises(Exception) as refused:
            tablet.append(bytes(big), 0)
        assert error_code(refused.value) is ErrorCode.message_too_large

    run(scenario, tmp_path)


def test_a_corrupt_stored_batch_answers_corrupt_message(tmp_path):
    """Bytes stored before validation existed, or damaged since: a timestamp
    lookup through them is CORRUPT_MESSAGE, not UNKNOWN_SERVER_ERROR."""
    async def scenario(engine):
        await engine.create_topic("t", 1, {})
        tablet = engine.partition("t", 0)
        await tablet.append(make_batch([b"a", b"b"], base_timestamp=100, codec=ZSTD), 0)
        # The zstd frame zeroed where the batch lies, in its segment file.
        entry = engine.store.get(keys.offset_key(keys.LOG, tablet.prefix, 0))
        no, position, size, _shifted = log_entry.locate(entry)
        os.pwrite(tablet.files.files[no].fileno(), bytes(size - 61), position + 61)
        with pytest.raises(Exception) as refused:
            await tablet.offset_for_timestamp(50)
        assert error_code(refused.value) is ErrorCode.corrupt_message

    run(scenario, tmp_path)
