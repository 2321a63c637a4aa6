"""The record walker and streamed decompression: any chunking gives the same
answer, reads stop once they have what they need, and memory stays bounded
however far a batch decompresses."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kafka_gateway.codec import encode_uvarint
from tablets import records
from tablets.batch import HEADER_SIZE, InvalidRecordBatch, parse_batches
from tablets.records import RecordError, RecordWalker, first_record_at_or_after
from testkit.batches import (
    MALFORMED,
    SNAPPY,
    ZSTD,
    encode_record,
    huge_value_batch,
    with_payload,
)


def _valid_records() -> dict[str, tuple[bytes, int]]:
    return {
        "nulls": (encode_record(None, 0) + encode_record(None, 1, key=b""), 2),
        "headers": (b"".join(
            encode_record(b"v" * 300, i, key=b"key", timestamp_delta=i * 7,
                          headers=((b"a", b"1"), (b"bb", None), (b"", b"")))
            for i in range(5)), 5),
        "wide varints": (encode_record(b"x" * 20000, 0, timestamp_delta=-(2**62))
                         + encode_record(b"", 1, timestamp_delta=2**40), 2),
    }


def _malformed_records() -> dict[str, tuple[bytes, int]]:
    """The uncompressed malformed cases, as the walker sees them."""
    out = {}
    for name, build in MALFORMED.items():
        batch = build(0)
        [header, *rest] = parse_batches(batch, verify_crc=False)
        if header.compression == 0 and not rest:
            out[name] = (batch[HEADER_SIZE:], header.record_count)
    return out


CASES = {**_valid_records(), **_malformed_records()}


def outcome(data: bytes, count: int, chunks: list[int]) -> tuple:
    walker = RecordWalker(count, 1000, timestamp_range=(0, 5000), max_errors=3)
    collector = RecordWalker(count, 1000, contiguous=False, collect=True)
    seen = []
    try:
        pos = 0
        for size in chunks:
            walker.feed(data[pos : pos + size])
            seen += collector.feed(data[pos : pos + size])
            pos += size
        walker.finish()
    except RecordError as exc:
        return ("refused", str(exc))
    return ("ok", walker.records, walker.max_timestamp, walker.bad_timestamps,
            walker.bad_timestamp_count, seen)


def _splits(total: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    sizes = []
    while total > 0:
        sizes.append(min(total, rng.choice((1, 2, 3, 5, 9, 17, 300))))
        total -= sizes[-1]
    return sizes


@pytest.mark.parametrize("name", sorted(CASES))
def test_any_chunking_gives_the_same_answer(name):
    data, count = CASES[name]
    whole = outcome(data, count, [len(data)])
    for size in (1, 2, 3, 4, 5, 7, 11):
        assert outcome(data, count, [size] * (len(data) // size + 1)) == whole, size
    for seed in range(20):
        assert outcome(data, count, _splits(len(data), seed)) == whole, seed


def test_mutated_records_walk_alike_in_any_chunking():
    """Bit flips, insertions, deletions and cuts: whatever the walker answers for
    the bytes whole, it answers for them cut anywhere (its state between chunks,
    and its fast path for whole records, agree with its step-by-step path)."""
    rng = random.Random(2024)
    bases = [data for data, _ in _valid_records().values()]
    for i in range(3000):
        data = bytearray(rng.choice(bases))
        for _ in range(rng.randint(1, 4)):
            pos = rng.randrange(len(data) + 1)
            op = rng.randrange(4)
            if op == 0 and pos < len(data):
                data[pos] = rng.randrange(256)
            elif op == 1:
                data.insert(pos, rng.randrange(256))
            elif op == 2 and pos < len(data):
                del data[pos]
            elif op == 3:
                del data[pos:]
        count = rng.randint(0, 6)
        whole = outcome(bytes(data), count, [len(data)])
        assert outcome(bytes(data), count, _splits(len(data), i)) == whole, (i, bytes(data))


def test_valid_cases_are_valid():
    for name, (data, count) in _valid_records().items():
        assert outcome(data, count, [len(data)])[0] == "ok", name


def test_search_stops_at_the_first_match_in_every_chunking():
    data = b"".join(encode_record(b"v" * 50, i, timestamp_delta=10 * i) for i in range(100))
    for size in (1, 3, 64, len(data)):
        walker = RecordWalker(100, 0, target=455, min_delta=20)
        for pos in range(0, len(data), size):
            walker.feed(data[pos : pos + size])
            if walker.found:
                break
        assert walker.found == (46, 460)
        assert pos < len(data) - 100 * 50 // 2  # stopped halfway, not at the end


def test_timestamp_lookup_reads_only_the_chunks_it_needs(monkeypatch):
    batch = huge_value_batch(1 << 30, timestamp=123)  # 1 GiB once decompressed
    chunks = []
    real = records.decompressed

    def counting(codec, data):
        for chunk in real(codec, data):
            chunks.append(len(chunk))
            yield chunk

    monkeypatch.setattr(records, "decompressed", counting)
    assert first_record_at_or_after(batch, 100, 0) == (0, 123)
    assert len(chunks) == 1


def test_a_corrupt_stored_batch_is_an_error_not_a_crash():
    for name in ("garbage zstd", "truncated lz4", "garbage records", "count 2^31-1, one record"):
        with pytest.raises(InvalidRecordBatch):  # a target no record reaches: read it all
            first_record_at_or_after(MALFORMED[name](0), 2**62, 0)
    garbage_records = MALFORMED["garbage records"](0)
    with pytest.raises(InvalidRecordBatch, match="stored batch at offset 0 is corrupt"):
        list(records.record_timestamps(garbage_records))


def test_raw_snappy_may_not_declare_more_than_it_can_hold():
    block = encode_uvarint(2**32 - 1) + b"\x00" * 5  # a preamble of 4 GiB, ten bytes long
    batch = with_payload(SNAPPY, bytes(block), record_count=1)
    with pytest.raises(InvalidRecordBatch, match="declares"):
        first_record_at_or_after(batch, 0, 0)


def test_zstd_frames_must_be_whole():
    frame = huge_value_batch(1 << 20)[HEADER_SIZE:]
    for cut in (frame[:-1], frame[:10], frame + b"x", frame + frame[:6]):
        with pytest.raises(InvalidRecordBatch):
            b"".join(records.decompressed(ZSTD, memoryview(cut)))
    assert len(b"".join(records.decompressed(ZSTD, memoryview(frame + frame)))) > 2 << 20


BOUNDED = textwrap.dedent("""
    import zlib
    import lz4.frame
    from tablets import validate
    from tablets.batch import build_batch, parse_batches
    from tablets.tablet_settings import TabletSettings
    from testkit.batches import GZIP, LZ4, huge_value_batch, varint

    def valid_bomb(codec, size):
        head = b"\\x00" + varint(0) + varint(0) + varint(-1) + varint(size)
        prefix = varint(len(head) + size + 1) + head
        zeros = bytes(1 << 20)
        if codec == GZIP:
            packer = zlib.compressobj(1, wbits=31)
            parts = [packer.compress(prefix)] + [packer.compress(zeros) for _ in range(size >> 20)]
            parts += [packer.compress(varint(0)), packer.flush()]
        else:
            packer = lz4.frame.LZ4FrameCompressor(block_linked=False)
            parts = [packer.begin(), packer.compress(prefix)]
            parts += [packer.compress(zeros) for _ in range(size >> 20)]
            parts += [packer.compress(varint(0)), packer.flush()]
        return build_batch(b"".join(parts), record_count=1, base_timestamp=5, max_timestamp=5,
                           attributes=codec)

    bombs = [huge_value_batch(2**31 - 64, 5), valid_bomb(GZIP, 256 << 20),
             valid_bomb(LZ4, 256 << 20)]
    settings = TabletSettings(2**31 - 1, False, 2**63 - 1, -1, -1)

    def status(field):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(field))

    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak RSS starts again from here
    before = status("VmRSS:")
    for batch in bombs:
        view = memoryview(batch)
        [header] = parse_batches(view)
        assert validate.check_records(view, header, settings, 0) == 5
    print((status("VmHWM:") - before) // 1024, "MiB")
""")


def test_checking_a_batch_holds_bounded_memory_however_far_it_expands():
    """2 GiB (zstd), 256 MiB (gzip, lz4) of decompressed records checked in
    a fresh process: its peak RSS grows by a few MiB, not by the data."""
    done = subprocess.run([sys.executable, "-c", BOUNDED], capture_output=True, text=True,
                          timeout=240, check=True, cwd=Path(__file__).resolve().parent.parent)
    grown = int(done.stdout.split()[0])
    assert grown < 64, done.stdout
