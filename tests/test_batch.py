"""Record batch headers: parsing, CRC, offset stamping, max timestamp rewrite."""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c

from tablets import batch as batch_header
from tablets.records import record_timestamps
from testkit.batches import make_batch


def test_parse_valid_batches_back_to_back():
    data = make_batch([b"a", b"b"], base_timestamp=5) + make_batch([b"c"], base_timestamp=9)
    first, second = batch_header.parse_batches(data)
    assert (first.start, first.record_count, first.max_timestamp) == (0, 2, 5)
    assert (second.start, second.record_count) == (first.size, 1)
    assert second.start + second.size == len(data)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: b[:-1], "does not fit"),
        (lambda b: b[:40], "truncated"),
        (lambda b: b[:16] + b"\x05" + b[17:], "magic"),
        (lambda b: b[:-1] + bytes([b[-1] ^ 1]), "CRC"),
        (lambda b: b"", "empty"),
    ],
)
def test_invalid_batches_are_rejected(mutate, message):
    with pytest.raises(batch_header.InvalidRecordBatch, match=message):
        batch_header.parse_batches(mutate(make_batch([b"x", b"y"])))


def test_crc_is_checked_apart_when_asked():
    data = bytearray(make_batch([b"x", b"y"]))
    data[-1] ^= 1
    [header] = batch_header.parse_batches(bytes(data), verify_crc=False)
    with pytest.raises(batch_header.InvalidRecordBatch, match="CRC"):
        batch_header.check_crc(memoryview(bytes(data)), header)
    struct.pack_into(">I", data, 17, crc32c(bytes(data[21:])))
    batch_header.check_crc(memoryview(bytes(data)), header)


def test_old_message_format_is_reported_as_such():
    legacy = struct.pack(">qiIbb", 0, 14, 0, 1, 0) + b"\x00" * 30
    with pytest.raises(batch_header.UnsupportedMagic):
        batch_header.parse_batches(legacy)


def test_stamp_sets_offset_and_epoch_and_keeps_crc_valid():
    data = make_batch([b"a", b"b", b"c"])
    [header] = batch_header.parse_batches(data)
    stamped = batch_header.stamp(memoryview(data), header, 1234, 7)
    assert batch_header.base_offset_of(stamped) == 1234
    assert batch_header.last_offset_of(stamped) == 1236
    assert struct.unpack_from(">i", stamped, 12)[0] == 7
    batch_header.parse_batches(stamped)  # CRC still valid: both fields lie before it
    assert stamped[16:] == data[16:]


def test_log_append_time_rewrites_timestamp_and_crc():
    data = make_batch([b"a", b"b"], base_timestamp=100)
    rewritten = batch_header.set_max_timestamp(data, 999, log_append_time=True)
    [header] = batch_header.parse_batches(rewritten)
    assert header.attributes & batch_header.ATTR_TIMESTAMP_TYPE
    assert header.max_timestamp == 999
    assert list(record_timestamps(rewritten)) == [(0, 999), (1, 999)]


def test_max_timestamp_rewrite_keeps_the_timestamp_type():
    data = make_batch([b"a"], base_timestamp=100)
    [header] = batch_header.parse_batches(batch_header.set_max_timestamp(data, 150))
    assert not header.attributes & batch_header.ATTR_TIMESTAMP_TYPE
    assert header.max_timestamp == 150


def test_record_timestamps_walk_every_record():
    raw = make_batch([b"a", None, b"ccc"], base_timestamp=50)
    [header] = batch_header.parse_batches(raw)
    data = batch_header.stamp(memoryview(raw), header, 10, 0)
    assert list(record_timestamps(data)) == [(10, 50), (11, 50), (12, 50)]
