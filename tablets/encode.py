"""Compressing records again, in the codec they came in (compaction only).

Compaction copies the records it keeps into a new batch of the same codec.
Each encoder takes the records as a stream of pieces and holds only what its
codec needs: gzip, lz4 and zstd compress as they go; snappy in the xerial
framing the Java client uses compresses each 32 KiB block as it fills; a raw
snappy block (what librdkafka sends) can only be compressed whole, and then
holds no more than the batch it replaces did once decompressed.

The lz4 frames are the ones Kafka reads (version 1, independent blocks, no
dictionary, no content size).
"""

from __future__ import annotations

import struct
import zlib
from typing import Protocol

import cramjam
import lz4.frame
import zstandard

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK = 32 << 10
_INT32 = struct.Struct(">i")


class Encoder(Protocol):
    def write(self, data: bytes | memoryview) -> None: ...

    def finish(self) -> bytes: ...


class _Compressor(Protocol):
    def compress(self, data: bytes | memoryview) -> bytes: ...

    def flush(self) -> bytes: ...


class _Plain:
    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: bytes | memoryview) -> None:
        self._parts.append(bytes(data))

    def finish(self) -> bytes:
        return b"".join(self._parts)


class _Streaming:
    """A codec with a compress/flush object (gzip, zstd)."""

    def __init__(self, compressor: _Compressor) -> None:
        self._compressor = compressor
        self._parts: list[bytes] = []

    def write(self, data: bytes | memoryview) -> None:
        if out := self._compressor.compress(data):
            self._parts.append(out)

    def finish(self) -> bytes:
        self._parts.append(self._compressor.flush())
        return b"".join(self._parts)


class _Lz4(_Streaming):
    def __init__(self) -> None:
        compressor = lz4.frame.LZ4FrameCompressor(block_linked=False, content_checksum=False)
        super().__init__(compressor)
        self._parts.append(compressor.begin())  # the frame header


class _XerialSnappy:
    def __init__(self) -> None:
        self._parts = [_XERIAL_HEADER]
        self._pending = bytearray()

    def write(self, data: bytes | memoryview) -> None:
        self._pending += data
        while len(self._pending) >= _XERIAL_BLOCK:
            self._block(memoryview(self._pending)[:_XERIAL_BLOCK])
            del self._pending[:_XERIAL_BLOCK]

    def _block(self, data: memoryview) -> None:
        block = bytes(cramjam.snappy.compress_raw(data))
        self._parts.append(_INT32.pack(len(block)) + block)

    def finish(self) -> bytes:
        if self._pending:
            self._block(memoryview(self._pending))
        return b"".join(self._parts)


class _RawSnappy(_Plain):
    def finish(self) -> bytes:
        return bytes(cramjam.snappy.compress_raw(super().finish()))


def encoder(codec: int, original: bytes | memoryview) -> Encoder:
    """An encoder for ``codec``; ``original`` is the compressed records of the
    batch being replaced (snappy keeps its framing)."""
    if codec == 0:
        return _Plain()
    if codec == 1:
        return _Streaming(zlib.compressobj(6, zlib.DEFLATED, 31))
    if codec == 2:
        return _XerialSnappy() if bytes(original[:8]) == _XERIAL_MAGIC else _RawSnappy()
    if codec == 3:
        return _Lz4()
    if codec == 4:
        return _Streaming(zstandard.ZstdCompressor().compressobj())
    raise ValueError(f"unknown compression codec {codec}")
