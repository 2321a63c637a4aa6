"""Helpers of the compacted-topic tests: what a partition holds, read over the
wire below any client library (from the gateway or from Apache Kafka), and
waiting for compaction to get somewhere.
"""

from __future__ import annotations

import asyncio
import datetime
import re
import urllib.request

from group_helpers import wait_for
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12 import request as fetch
from kio.schema.list_offsets.v7 import request as list_offsets
from kio.static.primitive import i32Timedelta

from kafka_gateway.client import KafkaClient
from tablets import batch as rb
from testkit.compaction import EAGER, Rec, decode

__all__ = ["EAGER", "metrics", "partition_metric", "read_partition", "values", "wait_for"]


async def _earliest(client: KafkaClient, topic: str, partition: int) -> int:
    response = await client.request(list_offsets.ListOffsetsRequest(
        replica_id=-1, isolation_level=0, topics=(list_offsets.ListOffsetsTopic(
            name=topic, partitions=(list_offsets.ListOffsetsPartition(
                partition_index=partition, current_leader_epoch=-1, timestamp=-2),)),)))
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
            response = await client.request(fetch.FetchRequest(
                cluster_id=None, replica_id=-1,
                max_wait=i32Timedelta.parse(datetime.timedelta(0)), min_bytes=1,
                max_bytes=64 << 20, isolation_level=1, session_id=0, session_epoch=-1,
                topics=(fetch.FetchTopic(topic=topic, partitions=(fetch.FetchPartition(
                    partition=partition, current_leader_epoch=-1, fetch_offset=offset,
                    last_fetched_epoch=-1, log_start_offset=-1,
                    partition_max_bytes=64 << 20),)),),
                forgotten_topics_data=(), rack_id=""))
            data = response.responses[0].partitions[0]
            assert data.error_code is ErrorCode.none, data.error_code
            high_watermark = data.last_stable_offset
            if not data.records:
                break
            raw = bytes(data.records)
            for header in rb.parse_batches(raw):
                batch = raw[header.start:header.start + header.size]
                base = rb.base_offset_of(batch)
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


def admin_address(gateway) -> str:
    """The admin HTTP address of the gateway's latest start."""
    found = re.findall(r"admin http ([\d.]+:\d+)", gateway.output())
    assert found, "the gateway runs without --admin-listen"
    return found[-1]


def metrics(gateway, prefix: str = "kafka_gateway_compaction") -> dict[str, float]:
    """The gateway's /metrics lines starting with ``prefix``: name{labels} -> value."""
    with urllib.request.urlopen(f"http://{admin_address(gateway)}/metrics",
                                timeout=30) as response:
        text = response.read().decode()
    return {name: float(value) for name, value in
            (line.rsplit(" ", 1) for line in text.splitlines() if line.startswith(prefix))}


def partition_metric(gateway, name: str, topic: str, partition: int = 0) -> float:
    return metrics(gateway)[f'kafka_gateway_compaction_{name}{{topic="{topic}",'
                            f'partition="{partition}"}}']
