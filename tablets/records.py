"""Record-level reading of one batch: streamed, in bounded memory.

Produce checks every record once (``validate``); ListOffsets by timestamp
needs the first *record* at or after a time, which the batch header only
bounds to one batch. Both come here. A batch's records are decompressed as a
stream of chunks of at most ``CHUNK_BYTES`` and walked by the C record walker
(``tablets._records``), which skips keys, values and headers without copying
them: memory does not grow with the batch's uncompressed size, however large
the compression ratio.

The one exception is snappy, whose blocks can only be decompressed whole: a
block may declare no more than snappy can expand it to (about 21 times its
size), so a block's output stays within ~22 times the batch's own size.

Codec failures raise InvalidRecordBatch (CORRUPT_MESSAGE); a walker failure
is RecordError, which the caller turns into its own error.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterator

import cramjam
import lz4.frame
import zstandard

try:
    from ._records import RecordError, RecordWalker
except ImportError as exc:  # a source checkout where the extension was never compiled
    raise ImportError(
        "tablets._records (the C record walker) is not built: run `pip install -e .`"
    ) from exc
from .batch import (
    ATTR_COMPRESSION_MASK,
    ATTR_TIMESTAMP_TYPE,
    HEADER_SIZE,
    BatchHeader,
    InvalidRecordBatch,
    parse_batches,
)

__all__ = [
    "CHUNK_BYTES",
    "RecordError",
    "RecordWalker",
    "decompressed",
    "first_record_at_or_after",
    "record_timestamps",
    "walk",
]

CHUNK_BYTES = 256 << 10
CODEC_NAMES = ("none", "gzip", "snappy", "lz4", "zstd")
# zstd frames may ask for a window this large: zstd's own default limit, and
# the one Kafka's zstd-jni applies, so every batch Kafka reads is read here.
ZSTD_MAX_WINDOW = 1 << 27
# The most a raw snappy block can expand: a 3-byte copy emits 64 bytes.
SNAPPY_MAX_RATIO = 22
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = 16  # magic, version, compatible version
_INT32 = struct.Struct(">i")
_LE32 = struct.Struct("<I")
_ZSTD_MAGIC = 0xFD2FB528
_LZ4_MAGIC = 0x184D2204
_CODEC_ERRORS = (zlib.error, RuntimeError, zstandard.ZstdError, cramjam.DecompressionError)


def decompressed(codec: int, data: memoryview) -> Iterator[memoryview | bytes]:
    """The records bytes of a batch body, in chunks of bounded size."""
    if codec == 0:
        yield data
        return
    reader = _CODECS.get(codec)
    if reader is None:
        raise InvalidRecordBatch(f"unknown compression codec {codec}")
    try:
        yield from reader(data)
    except _CODEC_ERRORS as exc:
        raise InvalidRecordBatch(f"{CODEC_NAMES[codec]} data is corrupt: {exc}") from None


def _gzip(data: memoryview) -> Iterator[bytes]:
    # Members may follow one another, as GZIPInputStream reads them.
    inflater = zlib.decompressobj(wbits=31)
    pending: bytes | memoryview = data
    while True:
        out = inflater.decompress(pending, CHUNK_BYTES)
        if out:
            yield out
        if inflater.eof:
            pending = inflater.unused_data
            if not pending:
                return
            if pending[:2] != b"\x1f\x8b":
                raise InvalidRecordBatch("bytes follow the end of the gzip data")
            inflater = zlib.decompressobj(wbits=31)
            continue
        pending = inflater.unconsumed_tail
        if not out and not pending:
            raise InvalidRecordBatch("gzip data ends early")


def _snappy(data: memoryview) -> Iterator[memoryview]:
    # The Java client frames snappy the xerial way (blocks of up to 32 KiB);
    # librdkafka sends one raw block, as Kafka's SnappyInputStream accepts.
    if len(data) < _XERIAL_HEADER or data[:8] != _XERIAL_MAGIC:
        yield _snappy_block(data)
        return
    pos, end = _XERIAL_HEADER, len(data)
    while pos < end:
        if end - pos < 4:
            raise InvalidRecordBatch("snappy block length cut short")
        (size,) = _INT32.unpack_from(data, pos)
        pos += 4
        if size < 0 or size > end - pos:
            raise InvalidRecordBatch(f"snappy block of {size} bytes does not fit the batch")
        yield _snappy_block(data[pos : pos + size])
        pos += size


def _snappy_block(block: memoryview) -> memoryview:
    declared = cramjam.snappy.decompress_raw_len(block)
    if declared > SNAPPY_MAX_RATIO * len(block):
        raise InvalidRecordBatch(
            f"snappy block of {len(block)} bytes declares {declared} bytes uncompressed"
        )
    return memoryview(cramjam.snappy.decompress_raw(block))


def _lz4(data: memoryview) -> Iterator[bytes]:
    # One frame of independent blocks, no dictionary: all that Kafka's
    # KafkaLZ4BlockInputStream reads (so all that Java consumers can read).
    if len(data) < 7 or _LE32.unpack_from(data, 0)[0] != _LZ4_MAGIC:
        raise InvalidRecordBatch("not an lz4 frame")
    flags = data[4]
    if flags >> 6 != 1 or flags & 0x03 or not flags & 0x20:
        raise InvalidRecordBatch(
            f"lz4 frame flags {flags:#04x}: Kafka reads only version 1 frames of independent "
            "blocks without a dictionary"
        )
    inflater = lz4.frame.LZ4FrameDecompressor()
    out = inflater.decompress(data, max_length=CHUNK_BYTES)
    while True:
        if out:
            yield out
        if inflater.eof:
            if inflater.unused_data:
                raise InvalidRecordBatch("bytes follow the end of the lz4 frame")
            return
        if inflater.needs_input:
            raise InvalidRecordBatch("lz4 data ends early")
        out = inflater.decompress(b"", max_length=CHUNK_BYTES)


def _zstd(data: memoryview) -> Iterator[bytes]:
    # The stream reader returns short output, not an error, on a cut frame:
    # the frames' structure is checked first.
    _check_zstd_frames(data)
    reader = zstandard.ZstdDecompressor(max_window_size=ZSTD_MAX_WINDOW).stream_reader(
        data, read_size=CHUNK_BYTES, read_across_frames=True
    )
    with reader:
        while chunk := reader.read(CHUNK_BYTES):
            yield chunk


def _check_zstd_frames(data: memoryview) -> None:
    """Raise unless ``data`` is whole zstd frames and nothing else (RFC 8878)."""
    pos, end = 0, len(data)
    if end == 0:
        raise InvalidRecordBatch("empty zstd data")
    while pos < end:
        if end - pos < 5:
            raise InvalidRecordBatch("zstd frame cut short")
        (magic,) = _LE32.unpack_from(data, pos)
        pos += 4
        if magic & 0xFFFFFFF0 == 0x184D2A50:  # a skippable frame
            (size,) = _LE32.unpack_from(data, pos)
            pos += 4 + size
            if pos > end:
                raise InvalidRecordBatch("zstd skippable frame cut short")
            continue
        if magic != _ZSTD_MAGIC:
            raise InvalidRecordBatch("not a zstd frame")
        descriptor = data[pos]
        pos += 1
        single_segment = descriptor & 0x20
        pos += (0 if single_segment else 1) + (0, 1, 2, 4)[descriptor & 3]
        pos += (1 if single_segment else 0, 2, 4, 8)[descriptor >> 6]
        while True:
            if end - pos < 3:
                raise InvalidRecordBatch("zstd frame cut short")
            block = data[pos] | data[pos + 1] << 8 | data[pos + 2] << 16
            pos += 3
            kind = (block >> 1) & 3
            if kind == 3:
                raise InvalidRecordBatch("zstd block of the reserved type")
            pos += 1 if kind == 1 else block >> 3
            if block & 1:
                break
        if descriptor & 0x04:
            pos += 4  # content checksum
        if pos > end:
            raise InvalidRecordBatch("zstd frame cut short")


_CODECS: dict[int, Callable[[memoryview], Iterator[memoryview | bytes]]] = {
    1: _gzip, 2: _snappy, 3: _lz4, 4: _zstd}


def walk(batch: memoryview, header: BatchHeader, walker: RecordWalker) -> None:
    """Feed a batch's records to ``walker``, until the end or what it looks for."""
    body = batch[header.start + HEADER_SIZE : header.start + header.size]
    for chunk in decompressed(header.compression, body):
        walker.feed(chunk)
        if walker.found is not None:
            return
    walker.finish()


def _stored(batch: bytes | memoryview) -> tuple[memoryview, BatchHeader]:
    view = memoryview(batch)
    headers = parse_batches(view, verify_crc=False)
    if len(headers) != 1:
        raise InvalidRecordBatch(f"a stored entry holds {len(headers)} batches")
    return view, headers[0]


def _corrupt(header: BatchHeader, exc: RecordError) -> InvalidRecordBatch:
    return InvalidRecordBatch(f"stored batch at offset {header.base_offset} is corrupt: {exc}")


def first_record_at_or_after(
    batch: bytes | memoryview, target: int, min_offset: int
) -> tuple[int, int] | None:
    """(offset, timestamp) of a stored batch's first record stamped at or after
    ``target`` whose offset is at least ``min_offset``; reads only that far."""
    view, header = _stored(batch)
    base = header.base_offset
    if header.attributes & ATTR_TIMESTAMP_TYPE:
        # LogAppendTime: every record carries the batch's max timestamp.
        offset = max(base, min_offset)
        if header.max_timestamp < target or offset > base + header.last_offset_delta:
            return None
        return offset, header.max_timestamp
    walker = RecordWalker(
        header.record_count, header.base_timestamp, contiguous=False, target=target,
        min_delta=min_offset - base, release_gil=True,  # on a reader thread
    )
    try:
        walk(view, header, walker)
    except RecordError as exc:
        raise _corrupt(header, exc) from None
    found = walker.found
    return None if found is None else (base + found[0], found[1])


def record_timestamps(batch: bytes | memoryview) -> Iterator[tuple[int, int]]:
    """Yield (offset, timestamp) for each record of a stored batch, streamed."""
    view, header = _stored(batch)
    base = header.base_offset
    if header.attributes & ATTR_TIMESTAMP_TYPE:
        for delta in range(header.record_count):
            yield base + delta, header.max_timestamp
        return
    walker = RecordWalker(
        header.record_count, header.base_timestamp, contiguous=False, collect=True
    )
    body = view[HEADER_SIZE : header.size]
    try:
        for chunk in decompressed(header.attributes & ATTR_COMPRESSION_MASK, body):
            for delta, timestamp in walker.feed(chunk):
                yield base + delta, timestamp
        walker.finish()
    except RecordError as exc:
        raise _corrupt(header, exc) from None
