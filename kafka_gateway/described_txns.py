"""DescribeTransactions v0 answers read by hand, for the CLI and the tests:
Kafka answers -1 for "no start time" (a transaction not open, an unknown id),
which kio's datetime reader refuses. Feed it ``KafkaClient.request_frame``'s
answer."""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable
from typing import TypeVar

from kio.schema.errors import ErrorCode

from .codec import read_uvarint, skip_tagged_fields

T = TypeVar("T")


@dataclasses.dataclass
class DescribedTxn:
    error_code: ErrorCode
    transactional_id: str
    state: str
    timeout_ms: int
    start_ms: int
    producer_id: int
    producer_epoch: int
    topics: list[tuple[str, list[int]]]


class _Reader:
    """Just enough of the flexible encoding for a DescribeTransactions v0 response."""

    def __init__(self, frame: bytes) -> None:
        self.buf, self.pos = frame, 0

    def fixed(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def uvarint(self) -> int:
        value, self.pos = read_uvarint(self.buf, self.pos)
        return value

    def string(self) -> str:
        length = self.uvarint() - 1
        self.pos += length
        return self.buf[self.pos - length:self.pos].decode()

    def array(self, item: Callable[[], T]) -> list[T]:
        return [item() for _ in range(self.uvarint() - 1)]

    def tags(self) -> None:
        self.pos = skip_tagged_fields(self.buf, self.pos)


def decode_describe_transactions(frame: bytes) -> list[DescribedTxn]:
    r = _Reader(frame)
    r.fixed(">i")  # correlation id
    r.tags()
    r.fixed(">i")  # throttle time

    def topic() -> tuple[str, list[int]]:
        name, partitions = r.string(), r.array(lambda: r.fixed(">i"))
        r.tags()
        return name, partitions

    def state() -> DescribedTxn:
        described = DescribedTxn(ErrorCode(r.fixed(">h")), r.string(), r.string(),
                                 r.fixed(">i"), r.fixed(">q"), r.fixed(">q"), r.fixed(">h"),
                                 r.array(topic))
        r.tags()
        return described

    states = r.array(state)
    r.tags()
    if r.pos != len(frame):
        raise ValueError(f"{len(frame) - r.pos} bytes after the DescribeTransactions answer")
    return states
