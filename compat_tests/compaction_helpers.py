"""Helpers of the compacted-topic tests: what a partition holds, read over the
wire below any client library (from the gateway or from Apache Kafka), and
waiting for compaction to get somewhere.
"""

from __future__ import annotations

import asyncio
import time

from group_helpers import wait_for
from kio.schema.errors import ErrorCode

from common.clock import now_ms
from kafka_gateway.client import KafkaClient
from tablets import batch as batch_header
from testkit import kafka_requests as rq
from testkit import prom
from testkit.compaction import EAGER, Rec, decode

__all__ = ["EAGER", "partition_metric", "read_partition", "rolls_after", "values", "wait_for"]


def rolls_after(stamp_ms: int) -> None:
    """Wait until a record stamped now rolls the active segment of an EAGER
    topic (segment.ms=1) whose newest record is stamped ``stamp_ms``: more
    than 1 ms after the segment's first stamp. A producer's round trip is not
    always 2 ms (2 to 107 ms here), so a "last record of the active segment"
    could otherwise share the segment of the records it is there to close."""
    while now_ms() < stamp_ms + 2:
        time.sleep(0.001)


async def _earliest(client: KafkaClient, topic: str, partition: int) -> int:
    response = await client.request(rq.list_offsets(topic, [(partition, -2)]))
    return response.topics[0].partitions[0].offset


async def _read(host_port: tuple[str, int], topic: str, partition: int
                ) -> tuple[list[Rec], list[tuple[int, bool, int]]]:
    client = await KafkaClient.connect(*host_port)
    try:
        records: list[Rec] = []
        batches: list[tuple[int, bool, int]] = []
        offset = await _earliest(client, topic, partition)
        high_watermark = offset + 1
        while offset < high_watermark:
            response = await client.request(rq.fetch(
                topic, [(partition, offset, 64 << 20)], isolation_level=1, max_bytes=64 << 20))
            data = response.responses[0].partitions[0]
            assert data.error_code is ErrorCode.none, data.error_code
            high_watermark = data.last_stable_offset
            if not data.records:
                break
            raw = bytes(data.records)
            for header in batch_header.parse_batches(raw):
                batch = raw[header.start:header.start + header.size]
                base = batch_header.base_offset_of(batch)
                batches.append((base, header.is_control, header.record_count))
                if not header.is_control:
                    records.extend(r for r in decode(batch) if r.offset >= offset)
                offset = base + header.last_offset_delta + 1
        return records, batches
    finally:
        await client.close()


def read_partition(server, topic: str, partition: int = 0
                   ) -> tuple[list[Rec], list[tuple[int, bool, int]]]:
    """(the data records a read_committed consumer from the log start sees,
    (base offset, is control, record count) of every batch), by raw Fetch."""
    return asyncio.run(asyncio.wait_for(_read(server.host_port, topic, partition), 60))


def values(records: list[Rec]) -> list[tuple[int, str, str | None]]:
    """(offset, key, value) as text."""
    return [(r.offset, r.key.decode() if r.key is not None else None,
             None if r.value is None else r.value.decode()) for r in records]


def partition_metric(gateway, name: str, topic: str, partition: int = 0) -> float:
    """A compacted partition's ``kafka_gateway_compaction_<name>`` now."""
    return prom.value(gateway.metrics(), f"kafka_gateway_compaction_{name}", topic=topic,
                      partition=str(partition))
