"""The produce path's one C call per batch (``_records.check_batch``, behind
``validate.check_batch``) against the Python checks it stands in for
(``validate.check_header`` then, for a batch checked on the event loop,
``validate.check_records``), on the same inputs: it accepts exactly what they
accept, with the same header and max timestamp, and each check it can refuse
for is named by its own code on an input the Python checks refuse with that
check's error. Also ``_records.stamp`` and ``_records.crc32c`` against their
Python references."""

from __future__ import annotations

import random
import struct
from dataclasses import astuple, replace

import crc32c as crc32c_package
import pytest

from tablets import _records, validate
from tablets.batch import (
    ATTR_CONTROL,
    ATTR_TIMESTAMP_TYPE,
    ATTR_TRANSACTIONAL,
    BatchHeader,
    InvalidRecordBatch,
    UnsupportedMagic,
    build_batch,
)
from tablets.compaction_config import CompactionConfig
from tablets.errors import (
    InvalidRecord,
    InvalidTimestamp,
    RecordBatchTooLarge,
    RecordTooLarge,
    TabletError,
)
from tablets.tablet_settings import TabletSettings
from testkit.batches import GZIP, MALFORMED, ZSTD, encode_record, encode_records, make_batch

NOW = 1_700_000_000_000
SETTINGS = TabletSettings(max_message_bytes=1 << 20, log_append_time=False,
                          timestamp_difference_max_ms=3_600_000, retention_ms=-1,
                          retention_bytes=-1, topic="t")


def c_check(batch: bytes, settings: TabletSettings = SETTINGS,
            now_ms: int = NOW) -> tuple[BatchHeader, int | None] | int:
    return _records.check_batch(memoryview(batch), BatchHeader, settings.max_message_bytes,
                                settings.segment_bytes, settings.timestamp_difference_max_ms,
                                now_ms, settings.log_append_time,
                                settings.compaction is not None)


def python_check(batch: bytes, settings: TabletSettings = SETTINGS,
                 now_ms: int = NOW) -> tuple[BatchHeader, int | None]:
    """The Python reference: what the produce path checked before the C call."""
    view = memoryview(batch)
    header = validate.check_header(view, settings)
    if not validate.runs_inline(header):
        return header, None
    return header, validate.check_records(view, header, settings, now_ms, "t-0")


def agree(batch: bytes, settings: TabletSettings = SETTINGS,
          now_ms: int = NOW) -> int | None:
    """Assert the C call and the Python checks agree on ``batch``; the C call's
    code when both refuse it, None when both accept it."""
    checked = c_check(batch, settings, now_ms)
    try:
        expected = python_check(batch, settings, now_ms)
    except (InvalidRecordBatch, TabletError) as exc:
        assert isinstance(checked, int), f"C accepted what Python refuses: {exc!r}"
        # validate.check_batch then raises the Python checks' error.
        with pytest.raises(type(exc)) as raised:
            header, timestamp = validate.check_batch(memoryview(batch), settings, now_ms)
            if timestamp is None and validate.runs_inline(header):
                validate.check_records(memoryview(batch), header, settings, now_ms, "t-0")
        assert str(raised.value) == str(exc)
        return checked
    assert isinstance(checked, tuple), f"C refused ({checked}) what Python accepts"
    header, timestamp = checked
    assert type(header) is BatchHeader
    assert astuple(header) == astuple(expected[0])
    assert timestamp == expected[1]
    assert validate.check_batch(memoryview(batch), settings, now_ms) == checked
    return None


def one(value: bytes = b"v" * 100, **kwargs: object) -> bytes:
    return make_batch([value], base_timestamp=NOW, **kwargs)  # type: ignore[arg-type]


def set_field(batch: bytes, fmt: str, at: int, value: int) -> bytes:
    """``batch`` with one header field changed and its CRC-32C made right again."""
    out = bytearray(batch)
    struct.pack_into(fmt, out, at, value)
    struct.pack_into(">I", out, 17, crc32c_package.crc32c(bytes(out[21:])))
    return bytes(out)


# --------------------------------------------------------------- acceptance
GOOD = {
    "one record": one(),
    "no value": make_batch([None], base_timestamp=NOW),
    "empty value": make_batch([b""], base_timestamp=NOW),
    "keyed": make_batch([b"a", b"b"], key=b"k", base_timestamp=NOW),
    "many records": make_batch([b"x" * 10] * 500, base_timestamp=NOW),
    "timestamps spread": make_batch([b"a", b"b", b"c"], base_timestamp=NOW,
                                    timestamp_deltas=[5, -3, 1000]),
    "max timestamp wrong in header": make_batch([b"a"], base_timestamp=NOW,
                                                max_timestamp=NOW + 99),
    "headers": make_batch([b"a"], base_timestamp=NOW, records=encode_record(
        b"a", 0, headers=((b"h1", b"x"), (b"h2", None)))),
    "idempotent": one(producer_id=7, producer_epoch=1, base_sequence=10),
    "transactional": one(producer_id=7, producer_epoch=1, base_sequence=0,
                         attributes=ATTR_TRANSACTIONAL),
    "record timestamp -1": make_batch([b"a"], base_timestamp=-1),
    "at the inline limit": make_batch([b""] * validate.INLINE_RECORDS, base_timestamp=NOW),
    # Left to check_records, off the loop: the header alone is checked.
    "over the inline limit": make_batch([b""] * (validate.INLINE_RECORDS + 1),
                                        base_timestamp=NOW),
    "gzip": make_batch([b"x" * 100] * 3, base_timestamp=NOW, codec=GZIP),
    "zstd": make_batch([b"x" * 100] * 3, base_timestamp=NOW, codec=ZSTD),
}


@pytest.mark.parametrize("name", sorted(GOOD))
def test_good_batches_are_accepted_as_python_accepts_them(name: str) -> None:
    assert agree(GOOD[name]) is None


def test_records_left_to_check_records_when_not_inline() -> None:
    for name in ("over the inline limit", "gzip", "zstd"):
        checked = c_check(GOOD[name])
        assert isinstance(checked, tuple) and checked[1] is None, name


def test_the_inline_limit_is_validates() -> None:
    assert _records.INLINE_RECORDS == validate.INLINE_RECORDS == 4096


# ------------------------------------------------- every refusal, by its code
REFUSED: dict[str, tuple[bytes, int, type[Exception], TabletSettings]] = {
    "empty": (b"", _records.CHECK_PARSE, InvalidRecordBatch, SETTINGS),
    "truncated header": (one()[:60], _records.CHECK_PARSE, InvalidRecordBatch, SETTINGS),
    "magic 1": (one()[:16] + b"\x01" + one()[17:], _records.CHECK_PARSE, UnsupportedMagic,
                SETTINGS),
    "magic 3": (one()[:16] + b"\x03" + one()[17:], _records.CHECK_PARSE, InvalidRecordBatch,
                SETTINGS),
    "length past the end": (set_field(one(), ">i", 8, len(one())), _records.CHECK_PARSE,
                            InvalidRecordBatch, SETTINGS),
    "length below a header": (set_field(one(), ">i", 8, 48), _records.CHECK_PARSE,
                              InvalidRecordBatch, SETTINGS),
    "codec 5": (set_field(one(), ">h", 21, 5), _records.CHECK_PARSE, InvalidRecordBatch,
                SETTINGS),
    "two batches": (one() + one(), _records.CHECK_NOT_ONE, InvalidRecord, SETTINGS),
    "a batch and a torn one": (one() + one()[:30], _records.CHECK_NOT_ONE,
                               InvalidRecordBatch, SETTINGS),
    "base offset 5": (one(base_offset=5), _records.CHECK_BASE_OFFSET, InvalidRecord, SETTINGS),
    "over max.message.bytes": (one(b"v" * 2000), _records.CHECK_TOO_LARGE, RecordTooLarge,
                               replace(SETTINGS, max_message_bytes=1000)),
    "crc": (one()[:-1] + b"w", _records.CHECK_CRC, InvalidRecordBatch, SETTINGS),
    "negative last offset delta": (one(last_offset_delta=-1), _records.CHECK_COUNT,
                                   InvalidRecord, SETTINGS),
    "count 0": (one(record_count=0, last_offset_delta=-1 + 1), _records.CHECK_COUNT,
                InvalidRecord, SETTINGS),
    "count above last offset delta": (one(record_count=2, last_offset_delta=0),
                                      _records.CHECK_COUNT,
                                      InvalidRecord, SETTINGS),
    "last offset delta 2^31-1": (one(record_count=1, last_offset_delta=2**31 - 1),
                                 _records.CHECK_COUNT, InvalidRecord, SETTINGS),
    "control": (one(attributes=ATTR_CONTROL), _records.CHECK_CONTROL, InvalidRecord, SETTINGS),
    "producer without a sequence": (one(producer_id=3, producer_epoch=0, base_sequence=-1),
                                    _records.CHECK_SEQUENCE, InvalidRecord, SETTINGS),
    "producer's LogAppendTime": (one(attributes=ATTR_TIMESTAMP_TYPE), _records.CHECK_RECORDS,
                                 InvalidTimestamp, SETTINGS),
    "timestamp too old": (make_batch([b"a"], base_timestamp=NOW - 3_600_001),
                          _records.CHECK_RECORDS, InvalidTimestamp, SETTINGS),
    "timestamp too new": (make_batch([b"a", b"b"], base_timestamp=NOW,
                                     timestamp_deltas=[0, 3_600_001]),
                          _records.CHECK_RECORDS, InvalidTimestamp, SETTINGS),
    "keyless in a compacted topic": (
        one(), _records.CHECK_RECORDS, InvalidRecord,
        replace(SETTINGS, compaction=CompactionConfig())),
    "over segment.bytes": (one(b"v" * 2000), _records.CHECK_RECORDS, RecordBatchTooLarge,
                           replace(SETTINGS, segment_bytes=1000)),
    "record longer than its fields": (
        make_batch([b"a"], base_timestamp=NOW, records=b"\x14" + encode_record(b"a", 0)[1:]),
        _records.CHECK_RECORDS, InvalidRecord, SETTINGS),
    "offset deltas 0, 2": (
        make_batch([b"a", b"b"], base_timestamp=NOW,
                   records=encode_record(b"a", 0) + encode_record(b"b", 2)),
        _records.CHECK_RECORDS, InvalidRecord, SETTINGS),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_each_refusal_is_named_and_python_raises_its_error(name: str) -> None:
    batch, code, error, settings = REFUSED[name]
    assert c_check(batch, settings) == code
    with pytest.raises(error):
        python_check(batch, settings)
    assert agree(batch, settings) == code


def test_every_code_is_covered() -> None:
    codes = {getattr(_records, name) for name in dir(_records) if name.startswith("CHECK_")}
    assert codes == {code for _batch, code, _error, _settings in REFUSED.values()}
    assert len(codes) == 9


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_every_malformed_batch_is_refused_as_python_refuses_it(name: str) -> None:
    """testkit's malformed batches (header and record faults, every codec):
    a compressed batch's records are checked off the loop, so the C call
    passes its header and check_records (on the worker) refuses it."""
    batch = MALFORMED[name](NOW)
    for settings in (SETTINGS, replace(SETTINGS, timestamp_difference_max_ms=2**63 - 1)):
        checked = c_check(batch, settings)
        if isinstance(checked, tuple) and checked[1] is None:
            with pytest.raises((InvalidRecord, InvalidRecordBatch, InvalidTimestamp)):
                validate.check_records(memoryview(batch), checked[0], settings, NOW, "t-0")
        agree(batch, settings)


def test_timestamp_windows_at_their_edges() -> None:
    limit = SETTINGS.timestamp_difference_max_ms
    for delta in (-limit - 1, -limit, 0, limit, limit + 1):
        agree(make_batch([b"a"], base_timestamp=NOW + delta))
    for settings in (replace(SETTINGS, log_append_time=True),
                     replace(SETTINGS, timestamp_difference_max_ms=2**63 - 1),
                     replace(SETTINGS, timestamp_difference_max_ms=2**63 - 2),
                     replace(SETTINGS, timestamp_difference_max_ms=0)):
        for base in (-(2**62), -1, 0, NOW, 2**62):
            agree(make_batch([b"a", b"b"], base_timestamp=base, timestamp_deltas=[0, 1]),
                  settings)
    # The window saturates at the int64 bounds, as validate's max/min do.
    agree(make_batch([b"a"], base_timestamp=2**63 - 1),
          replace(SETTINGS, timestamp_difference_max_ms=2**63 - 2), now_ms=2**62)
    agree(make_batch([b"a"], base_timestamp=-(2**63)),
          replace(SETTINGS, timestamp_difference_max_ms=2**63 - 2), now_ms=-(2**62))


def test_compacted_topic_with_keys_is_accepted() -> None:
    compacted = replace(SETTINGS, compaction=CompactionConfig())
    assert agree(make_batch([b"a", None], key=b"k", base_timestamp=NOW), compacted) is None
    assert agree(make_batch([b"a"], base_timestamp=NOW, records=encode_record(b"a", 0, b"k")
                            + encode_record(b"b", 1)), compacted) == _records.CHECK_RECORDS


def test_random_corruptions_agree() -> None:
    """Bytes changed anywhere (the CRC made right again, so the record walk is
    reached): the C call and the Python checks accept and refuse the same."""
    rng = random.Random(21)
    bases = [GOOD["keyed"], GOOD["headers"], GOOD["timestamps spread"],
             make_batch([b"x" * 30] * 20, key=b"key", base_timestamp=NOW)]
    refused = 0
    for _ in range(3000):
        batch = bytearray(rng.choice(bases))
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(batch))
            batch[at] = rng.choice((0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)))
        if rng.random() < 0.1:
            batch = batch[:rng.randrange(len(batch))]
        elif rng.random() < 0.9 and len(batch) > 21:
            struct.pack_into(">I", batch, 17, crc32c_package.crc32c(bytes(batch[21:])))
        refused += agree(bytes(batch)) is not None
    assert 0 < refused < 3000


def test_header_type_and_arguments_are_checked() -> None:
    with pytest.raises(TypeError):
        _records.check_batch(one(), BatchHeader)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        _records.check_batch(12, BatchHeader, 1, 1, 1, 1, False, False)  # type: ignore[arg-type]
    with pytest.raises(OverflowError):
        _records.check_batch(one(), BatchHeader, 2**64, 1, 1, 1, False, False)


# --------------------------------------------------------- stamp and crc32c
def python_stamp(batch: bytes, size: int, base_offset: int, leader_epoch: int) -> bytes:
    return (struct.pack(">q", base_offset) + batch[8:12] + struct.pack(">i", leader_epoch)
            + batch[16:size])


def test_stamp_matches_its_python_reference() -> None:
    batch = one()
    for base_offset, epoch in ((0, 0), (123456789012, 7), (2**63 - 1, -1), (-1, 2**31 - 1)):
        assert _records.stamp(memoryview(batch), len(batch), base_offset, epoch) == \
            python_stamp(batch, len(batch), base_offset, epoch)
    two = batch + one(b"other")
    assert _records.stamp(two, len(batch), 5, 0) == python_stamp(batch, len(batch), 5, 0)


def test_stamp_refuses_what_it_cannot_do() -> None:
    batch = one()
    with pytest.raises(ValueError):
        _records.stamp(batch, len(batch) + 1, 0, 0)
    with pytest.raises(ValueError):
        _records.stamp(batch, 15, 0, 0)
    with pytest.raises(OverflowError):
        _records.stamp(batch, len(batch), 2**63, 0)
    with pytest.raises(OverflowError):
        _records.stamp(batch, len(batch), 0, 2**31)
    with pytest.raises(TypeError):
        _records.stamp(batch, len(batch), 0)  # type: ignore[call-arg]


def test_crc32c_matches_the_crc32c_package() -> None:
    rng = random.Random(32)
    for size in [*range(0, 70), 1023, 1024, 1025, 65537]:
        data = rng.randbytes(size)
        assert _records.crc32c(data) == crc32c_package.crc32c(data), size
        assert _records.crc32c(memoryview(data)[1:]) == crc32c_package.crc32c(data[1:])


def test_build_batch_crc_is_what_check_batch_verifies() -> None:
    batch = build_batch(encode_records([b"a"]), record_count=1, base_timestamp=NOW,
                        max_timestamp=NOW)
    assert isinstance(c_check(batch), tuple)
