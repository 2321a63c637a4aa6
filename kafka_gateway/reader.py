"""Kafka's wire encoding read by hand: the one module that does it.

kio reads most request bodies; what it does not read is read here:

- ``read_uvarint`` and ``skip_tagged_fields``: the request header's tagged
  fields (codec.py) and every varint of body_bounds.py's walk over a body
  before kio reads it;
- ``Reader``, a cursor over one frame, for the hand-written readers: the
  Produce request (apis/produce_request.py, a hot path) and the
  DescribeTransactions answer (cli/describe_transactions_answer.py).

Every read is bounded by the frame: reading past its end raises
``MalformedRequest`` (or ``struct.error``/``IndexError`` from the fixed-size
reads, which the readers turn into ``MalformedRequest`` once, around their
whole parse, instead of paying for a check on every field).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


class MalformedRequest(ValueError):
    """The frame cannot be read: the connection that sent it is closed."""


def read_uvarint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """An unsigned varint (at most 5 bytes, an int32's worth) at ``pos``, and the
    position after it."""
    if pos < len(buf):
        byte = buf[pos]
        if byte < 0x80:  # nearly every varint of a request: a length or count below 128
            return byte, pos + 1
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 28:
            raise MalformedRequest("bad or truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def skip_tagged_fields(buf: bytes | memoryview, pos: int) -> int:
    """The position after the tagged fields at ``pos`` (their contents unread)."""
    count, pos = read_uvarint(buf, pos)
    for _ in range(count):
        _tag, pos = read_uvarint(buf, pos)
        length, pos = read_uvarint(buf, pos)
        pos += length
    if pos > len(buf):
        raise MalformedRequest("tagged fields run past the end of the frame")
    return pos


class Reader:
    """A cursor over one frame; ``flexible``: the compact encodings of flexible
    versions (varint lengths, tagged fields)."""

    __slots__ = ("buf", "flexible", "pos")

    def __init__(self, buf: bytes | memoryview, pos: int, flexible: bool) -> None:
        self.buf = memoryview(buf)
        self.pos = pos
        self.flexible = flexible

    def int16(self) -> int:
        (value,) = _I16.unpack_from(self.buf, self.pos)
        self.pos += 2
        return value

    def int32(self) -> int:
        (value,) = _I32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return value

    def int64(self) -> int:
        (value,) = _I64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return value

    def uvarint(self) -> int:
        value, self.pos = read_uvarint(self.buf, self.pos)
        return value

    def length(self) -> int:
        """An array or bytes length; -1 for null."""
        return self.uvarint() - 1 if self.flexible else self.int32()

    def count(self, what: str) -> int:
        """An array count that is neither null nor more than the bytes left."""
        count = self.length()
        if count < 0:
            raise MalformedRequest(f"{what}: array count {count} where the schema has no null")
        if count > len(self.buf) - self.pos:
            raise MalformedRequest(f"{what}: array count of {count} does not fit in the "
                                   f"{len(self.buf) - self.pos} bytes left")
        return count

    def string_length(self) -> int:
        return self.uvarint() - 1 if self.flexible else self.int16()

    def take(self, size: int) -> memoryview:
        """The next ``size`` bytes, a view of the frame (no copy)."""
        end = self.pos + size
        if size < 0 or end > len(self.buf):
            raise MalformedRequest("field runs past the end of the frame")
        view = self.buf[self.pos : end]
        self.pos = end
        return view

    def string(self) -> str | None:
        size = self.string_length()
        return None if size < 0 else bytes(self.take(size)).decode()

    def array(self, what: str, item: Callable[[], T]) -> list[T]:
        """A non-null array of ``item()``s."""
        return [item() for _ in range(self.count(what))]

    def skip_tagged_fields(self) -> None:
        if self.flexible:
            buf, pos = self.buf, self.pos
            if pos < len(buf) and buf[pos] == 0:  # none: nearly always (a Produce's partitions)
                self.pos = pos + 1
            else:
                self.pos = skip_tagged_fields(buf, pos)
