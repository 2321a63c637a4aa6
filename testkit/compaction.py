"""Compacted logs in tests: keyed batches in, the records a consumer would see
out, and the invariants every compacted log must keep.

    batch = keyed_batch([(b"k1", b"v1"), (b"k2", None)], codec=ZSTD)
    records = await read_all(tablet)          # [Rec(offset, timestamp, key, value)]
    check_log(tablet)                          # sizes, segments, time index, CRCs
    run_engine(scenario, tmp_path)             # scenario(engine), the cleaner off
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from common.clock import now_ms
from tablets import CleanerSettings, EngineSettings, PartitionTablet, StorageEngine, keys, log_entry
from tablets import batch as batch_header
from tablets.records import decompressed
from tablets.seam import FileRegion
from testkit.batches import NONE, compress, encode_record

# A compacted topic that rolls a segment for every batch stamped 2 ms or more
# after the one before (``keyed_batch`` stamps them so), so everything but the
# newest batch is cleanable, and that drops tombstones on the run after the
# one that first keeps them.
EAGER = {"cleanup.policy": "compact", "segment.ms": "1", "delete.retention.ms": "0",
         "min.cleanable.dirty.ratio": "0.01"}
_last_stamp = 0


@dataclass(frozen=True)
class Rec:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None



def next_stamp() -> int:
    """Now, but at least 2 ms after the last stamp given: each batch so stamped
    rolls a segment of an EAGER topic."""
    global _last_stamp
    _last_stamp = max(now_ms(), _last_stamp + 2)
    return _last_stamp


def stamps_past_ms() -> int:
    """How long until every stamp next_stamp() gave is at least 2 ms old on
    the millisecond clock (one more for its rounding down): the stamps run
    ahead of the clock when batches are built faster than one per 2 ms, so a
    test about a lag (max.compaction.lag.ms) waits this out."""
    return max(0, _last_stamp + 3 - now_ms())


def keyed_batch(pairs: list[tuple[bytes | None, bytes | None]], codec: int = NONE,
                timestamp: int | None = None, xerial: bool = True, attributes: int = 0,
                producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
                timestamp_deltas: list[int] | None = None) -> bytes:
    """A batch of (key, value) records (None value: a tombstone), as a producer
    sends it, stamped ``next_stamp()`` unless given a timestamp."""
    base = next_stamp() if timestamp is None else timestamp
    deltas = timestamp_deltas or [0] * len(pairs)
    records = b"".join(encode_record(value, i, key, deltas[i])
                       for i, (key, value) in enumerate(pairs))
    return batch_header.build_batch(compress(codec, records, xerial), record_count=len(pairs),
                          base_timestamp=base, max_timestamp=base + max(deltas),
                          producer_id=producer_id, producer_epoch=producer_epoch,
                          base_sequence=base_sequence, attributes=attributes | codec)


def decode(batch: bytes) -> list[Rec]:
    """Every record of one batch (the CRC checked)."""
    [header] = batch_header.parse_batches(batch)
    body = b"".join(bytes(piece) for piece in decompressed(
        header.compression, memoryview(batch)[batch_header.HEADER_SIZE:header.size]))
    append_time = header.attributes & batch_header.ATTR_TIMESTAMP_TYPE

    def zigzag(at: int) -> tuple[int, int]:  # a varint or varlong
        raw = shift = 0
        while body[at] & 0x80:
            raw |= (body[at] & 0x7F) << shift
            at, shift = at + 1, shift + 7
        raw |= body[at] << shift
        return (raw >> 1) ^ -(raw & 1), at + 1

    def field(at: int) -> tuple[bytes | None, int]:
        size, at = zigzag(at)
        return (None, at) if size < 0 else (body[at:at + size], at + size)

    out, pos = [], 0
    for _ in range(header.record_count):
        length, pos = zigzag(pos)
        end = pos + length
        ts_delta, at = zigzag(pos + 1)
        offset_delta, at = zigzag(at)
        key, at = field(at)
        value, at = field(at)
        timestamp = header.max_timestamp if append_time else header.base_timestamp + ts_delta
        out.append(Rec(header.base_offset + offset_delta, timestamp, key, value))
        pos = end
    assert pos == len(body), "bytes after the last record"
    return out


def as_batches(items: list[bytes | FileRegion]) -> list[bytes]:
    """A read's batches as bytes: regions of segment files read, and a batch
    given as patched first bytes then a region joined into one."""
    data = b"".join(item if isinstance(item, bytes) else item.read() for item in items)
    out, at = [], 0
    while at < len(data):
        size = batch_header.LOG_OVERHEAD + int.from_bytes(data[at + 8:at + 12], "big")
        out.append(data[at:at + size])
        at += size
    return out


async def read_batches(tablet: PartitionTablet, start: int | None = None,
                       max_bytes: int = 1 << 16) -> list[bytes]:
    """Every batch from ``start`` (the log start) to the high watermark, in fetches."""
    offset = tablet.log_start_offset if start is None else start
    out: list[bytes] = []
    while offset < tablet.high_watermark:
        read = await tablet.read(offset, max_bytes)
        if not read.batches:
            break
        for data in as_batches(read.batches):
            if batch_header.last_offset_of(data) >= offset:
                out.append(data)
                offset = batch_header.last_offset_of(data) + 1
    return out


async def read_all(tablet: PartitionTablet) -> list[Rec]:
    """The data records a consumer reading from the log start sees, in order."""
    out = []
    for data in await read_batches(tablet):
        if not batch_header.parse_batches(data)[0].is_control:
            out.extend(r for r in decode(data) if r.offset >= tablet.log_start_offset)
    return out


def newest(records: list[Rec]) -> dict[bytes | None, Rec]:
    """Each key's last record."""
    return {r.key: r for r in records}


def check_log(tablet: PartitionTablet) -> None:
    """What compaction must keep true: the byte count is the entries' sizes and
    the segments' sizes add up to it; every segment file's live bytes are
    those of the entries naming it; every batch is no newer than the time
    index entry covering it; every stored batch's CRC holds; offsets ascend."""
    store, prefix = tablet.store, tablet.prefix
    floor = keys.LOG + prefix
    entries = list(store.scan(floor, floor + b"\xff" * 8))
    assert tablet.size_bytes == sum(log_entry.size(e) for _k, e in entries)
    segments = tablet.segments
    assert sum(s.size for s in segments.closed) + segments.active.size == tablet.size_bytes
    previous_end = -1
    live: dict[int, int] = {}
    for _key, entry in [*entries, *tablet.pending.items()]:
        no = log_entry.locate(entry)[0]
        live[no] = live.get(no, 0) + log_entry.size(entry)
    # Each segment file counts exactly the bytes of the entries naming it.
    assert {no: f.live for no, f in tablet.files.files.items() if f.live} == live, (
        {no: f.live for no, f in tablet.files.files.items()}, live)
    for key, entry in entries:
        batch = tablet.read_entry(entry)
        [header] = batch_header.parse_batches(batch)  # CRC-checked
        assert header.base_offset == keys.offset_of_key(key) > previous_end
        previous_end = header.base_offset + header.last_offset_delta
        index = [i for i, o in enumerate(tablet._ts_offsets) if o <= header.base_offset]
        if header.base_offset >= tablet.log_start_offset and index:
            assert header.max_timestamp <= tablet._ts_values[index[-1]], (
                header.base_offset, list(tablet._ts_offsets), list(tablet._ts_values))


def run_engine(coro_fn, data_dir, **settings):
    """``coro_fn(engine)`` on an engine over ``data_dir`` (the background
    cleaner off unless ``cleaner`` is given: tests compact when they say so),
    then close it."""

    async def main():
        settings.setdefault("cleaner", CleanerSettings(enable=False))
        engine = StorageEngine(str(data_dir), EngineSettings(**settings))
        engine.start(asyncio.get_running_loop())
        try:
            return await asyncio.wait_for(coro_fn(engine), 120)
        finally:
            engine.close()

    return asyncio.run(main())


async def produce(tablet: PartitionTablet, batches: list[bytes]) -> list[int]:
    """Append each batch; their base offsets."""
    return [(await tablet.append(b, now_ms())).base_offset for b in batches]
