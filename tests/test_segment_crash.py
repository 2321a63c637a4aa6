"""kill -9 of a gateway in the middle of appends, several times: every
acknowledged record is there after each restart, and nothing torn is served
(every fetched batch passes its CRC; what a crash left unindexed in a
segment file is cut at start-up)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time

import pytest

from kafka_gateway.client import KafkaClient
from tablets import batch as batch_header
from testkit.batches import make_batch
from testkit.compaction import decode
from testkit.gateway import GatewayProcess
from testkit.kafka_requests import create_topic, fetch, send_produce

TOPIC = "crashy"
PRODUCERS = 4
CYCLES = 3


async def _produce_until_killed(gw: GatewayProcess, cycle: int, acked: list[bytes],
                                started: threading.Event) -> None:
    """Producers sending batches until the gateway dies."""
    clients = [await KafkaClient.connect(*gw.host_port) for _ in range(PRODUCERS)]
    if cycle == 0:
        await create_topic(clients[0], TOPIC, {"segment.bytes": str(256 << 10)})

    async def producer(index: int, client: KafkaClient) -> None:
        sent = 0
        while True:
            # Big batches: the writer spends its time writing them, so a kill
            # often lands between a file write and the index write.
            values = [b"c%d-p%d-b%d-r%d-" % (cycle, index, sent, j) + b"x" * 8000
                      for j in range(32)]
            try:
                answer = await send_produce(client, TOPIC, make_batch(values))
            except Exception:  # the gateway was killed: this batch is not acknowledged
                return
            assert answer.error_code.value == 0, answer
            acked.extend(values)
            started.set()
            sent += 1

    await asyncio.gather(*(producer(i, c) for i, c in enumerate(clients)))
    for client in clients:
        with contextlib.suppress(Exception):  # closed by the kill already
            await client.close()


async def _read_everything(gw: GatewayProcess) -> list[bytes]:
    client = await KafkaClient.connect(*gw.host_port)
    try:
        offset, values = 0, []
        while True:
            response = await client.request(fetch(TOPIC, [(0, offset, 1 << 20)]))
            part = response.responses[0].partitions[0]
            assert part.error_code.value == 0, part
            data = bytes(part.records or b"")
            if not data:
                assert offset == part.high_watermark
                return values
            for header in batch_header.parse_batches(data):  # CRC-checked: nothing torn
                assert header.base_offset == offset, (header.base_offset, offset)
                offset = header.base_offset + header.last_offset_delta + 1
            for start in _batch_starts(data):
                values.extend(r.value for r in decode(data[start[0]:start[1]]))
    finally:
        await client.close()


def _batch_starts(data: bytes) -> list[tuple[int, int]]:
    out, at = [], 0
    while at < len(data):
        end = at + batch_header.LOG_OVERHEAD + int.from_bytes(data[at + 8:at + 12], "big")
        out.append((at, end))
        at = end
    return out


@pytest.mark.timeout(240)
def test_kill_9_in_the_middle_of_appends_loses_nothing_acknowledged(tmp_path):
    rng = random.Random(21)
    acked: list[bytes] = []
    with GatewayProcess(tmp_path / "data") as gw:
        for cycle in range(CYCLES):
            at_start = len(acked)
            started = threading.Event()
            load = threading.Thread(
                target=lambda c=cycle, s=started: asyncio.run(
                    _produce_until_killed(gw, c, acked, s)),
                daemon=True)
            load.start()
            assert started.wait(60), "no batch was acknowledged before the kill"
            time.sleep(rng.uniform(0.2, 0.8))
            acked_before_kill = len(acked)
            gw.kill()  # while the producers are sending: they never stop on their own
            load.join(60)
            assert not load.is_alive()
            gw.start()
            values = asyncio.run(_read_everything(gw))
            assert len(values) == len(set(values)), "a record is in the log twice"
            missing = set(acked) - set(values)
            assert not missing, f"cycle {cycle}: {len(missing)} acknowledged records lost"
            assert acked_before_kill > at_start  # appends were under way at the kill
