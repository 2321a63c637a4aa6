"""A DescribeTransactions v0 answer read by hand, for ``kafka-gateway transactions
describe`` and the tests: Kafka answers -1 for "no start time" (a transaction not
open, an unknown id), which kio's datetime reader refuses. Feed it
``KafkaClient.request_frame``'s answer (the frame less its size prefix)."""

from __future__ import annotations

import dataclasses

from kio.schema.errors import ErrorCode

from ..reader import MalformedRequest, Reader


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


def decode_describe_transactions(frame: bytes) -> list[DescribedTxn]:
    r = Reader(frame, 0, flexible=True)

    def string() -> str:
        value = r.string()
        if value is None:
            raise MalformedRequest("null string in a DescribeTransactions answer")
        return value

    def topic() -> tuple[str, list[int]]:
        name, partitions = string(), r.array("partitions", r.int32)
        r.skip_tagged_fields()
        return name, partitions

    def state() -> DescribedTxn:
        described = DescribedTxn(ErrorCode(r.int16()), string(), string(), r.int32(),
                                 r.int64(), r.int64(), r.int16(), r.array("topics", topic))
        r.skip_tagged_fields()
        return described

    r.int32()  # correlation id
    r.skip_tagged_fields()
    r.int32()  # throttle time
    states = r.array("transaction_states", state)
    r.skip_tagged_fields()
    if r.pos != len(frame):
        raise ValueError(f"{len(frame) - r.pos} bytes after the DescribeTransactions answer")
    return states
