"""Malformed batches against a live gateway: each gets Kafka's error code and
nothing of it is stored; produce requests pipelined on one connection append
in the order sent; zip bombs leave memory bounded and the server responsive."""

from __future__ import annotations

import asyncio
import time

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12 import request as metadata
from test_record_validation import EXPECTED

from common.clock import now_ms
from kafka_gateway.client import KafkaClient
from testkit.batches import (
    GZIP,
    MALFORMED,
    ZSTD,
    gzip_zeros,
    huge_value_batch,
    make_batch,
    with_payload,
)
from testkit.gateway import GatewayProcess
from testkit.kafka_requests import create_topic, list_offset, pipelined_produce, send_produce


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with GatewayProcess(tmp_path_factory.mktemp("validation") / "data") as gw:
        yield gw


def ask(gateway, scenario):
    async def main():
        client = await KafkaClient.connect(*gateway.host_port)
        try:
            return await scenario(client)
        finally:
            await client.close()

    return asyncio.run(asyncio.wait_for(main(), 120))



def test_each_malformed_batch_gets_kafkas_error_and_nothing_is_stored(gateway):
    async def scenario(client):
        await create_topic(client, "malformed", {"message.timestamp.difference.max.ms": "60000"})
        for stored, (name, build) in enumerate(MALFORMED.items()):
            now = now_ms()
            answer = await send_produce(client, "malformed", build(now))
            assert answer.error_code is EXPECTED[name], (name, answer)
            assert answer.base_offset == -1 and answer.error_message
            if answer.error_code is ErrorCode.invalid_timestamp:
                assert answer.record_errors, name  # Produce v8+ names the records
            assert (await list_offset(client, "malformed")).offset == stored, name
            good = await send_produce(client, "malformed", make_batch([b"ok"], base_timestamp=now))
            assert (good.error_code, good.base_offset) == (ErrorCode.none, stored), name

    ask(gateway, scenario)


def test_pipelined_requests_append_in_the_order_sent(gateway):
    ask(gateway, lambda client: create_topic(client, "pipelined"))
    sets, expected, offset = [], [], 0
    for i in range(40):
        if i % 9 == 4:
            sets.append(MALFORMED["garbage gzip"](0))
            expected.append(None)
            continue
        count = 1 + i % 3
        codec = (0, ZSTD, GZIP, 0)[i % 4]  # checked inline, or on a worker thread
        sets.append(make_batch([b"%d" % i] * count, codec=codec, base_timestamp=now_ms()))
        expected.append(offset)
        offset += count
    answers = asyncio.run(pipelined_produce(*gateway.host_port, "pipelined", sets))
    assert [a.base_offset if a.error_code is ErrorCode.none else None
            for a in answers] == expected


def _peak_rss_mib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) >> 10


def test_zip_bombs_leave_memory_bounded_and_the_server_responsive(gateway):
    """A 131 KB zstd batch of 4 GiB of zeros and a 1 MB gzip one of 1 GiB are
    refused after their first record; a valid 2 GiB-valued record is checked
    as a stream and stored; a timestamp lookup on it reads one chunk. All the
    while a canary's requests are answered, and the peak RSS stays small."""
    timestamp = now_ms()
    bombs = [
        (MALFORMED["zstd bomb, 4 GiB of zeros"](timestamp), ErrorCode.invalid_record),
        (with_payload(GZIP, gzip_zeros(1 << 30), timestamp=timestamp), ErrorCode.invalid_record),
        (huge_value_batch(2**31 - 64, timestamp), ErrorCode.none),
    ]
    assert max(len(b) for b, _ in bombs) < 1_100_000

    async def scenario(client):
        await create_topic(client, "bombs", {"max.message.bytes": "2000000"})
        canary = await KafkaClient.connect(*gateway.host_port)
        latencies: list[float] = []
        stop = asyncio.Event()

        async def watch() -> None:
            while not stop.is_set():
                started = time.monotonic()
                await canary.request(metadata.MetadataRequest(
                    topics=None, allow_auto_topic_creation=False,
                    include_topic_authorized_operations=False))
                latencies.append(time.monotonic() - started)
                await asyncio.sleep(0.02)

        watcher = asyncio.create_task(watch())
        try:
            for batch, code in bombs:
                assert (await send_produce(client, "bombs", batch)).error_code is code
            found = await list_offset(client, "bombs", timestamp)
            assert (found.error_code, found.offset, found.timestamp) == (
                ErrorCode.none, 0, timestamp)
            # The bombs are refused in milliseconds: let the canary take a few
            # more samples, so the bound below is measured, not vacuous.
            deadline = time.monotonic() + 10
            while len(latencies) < 6 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        finally:
            stop.set()
            await watcher
            await canary.close()
        return latencies

    latencies = ask(gateway, scenario)
    assert len(latencies) > 5
    # Before: one lookup held the loop for 13 s and the process at 8.5 GB.
    assert max(latencies) < 2.0, max(latencies)
    assert _peak_rss_mib(gateway.process.pid) < 400
