"""Differential: malformed record batches (testkit/batches.MALFORMED), Apache
Kafka 3.4.1 vs the gateway, through raw Produce v9 requests.

Each batch goes to a fresh partition of each server. The gateway must answer
Kafka's error code, except where docs/compatibility.md ("Produced batches:
what is refused") says it answers better, and must store nothing it refuses:
its high watermark stays 0 (Kafka stores a few of these, as that table says).
"""

from __future__ import annotations

import asyncio
import time
import uuid

from kio.schema.errors import ErrorCode

from testkit import kafka_requests as rq
from testkit.batches import MALFORMED
from testkit.differential import Differ
from testkit.server_pair import CLOSED, Pair

# Where the gateway answers otherwise than Kafka 3.4.1, on purpose (the
# reasons are in docs/compatibility.md): case -> (Kafka's code, the gateway's).
# Kafka answers UNKNOWN_SERVER_ERROR where decompression or a varint fails
# inside its validator; the gateway names the problem.
INTENDED = {
    **{f"garbage {codec}": ("unknown_server_error", "corrupt_message")
       for codec in ("gzip", "snappy", "lz4", "zstd")},
    **{f"truncated {codec}": ("unknown_server_error", "corrupt_message")
       for codec in ("gzip", "snappy", "lz4", "zstd")},
    "lz4 with linked blocks": ("unknown_server_error", "corrupt_message"),
    "negative offset delta": ("none", "invalid_record"),
    "offset deltas 0, 2": ("none", "invalid_record"),
    "offset deltas 0, 2 zstd": ("unknown_server_error", "invalid_record"),
    "key length -2": ("none", "invalid_record"),
    "varint of 6 bytes": ("unknown_server_error", "invalid_record"),
}


def _code(response) -> str:
    if response is CLOSED:
        return "closed"
    return response.responses[0].partition_responses[0].error_code.name


async def _high_watermark(pair: Pair, topic: str, partition: int) -> dict[str, int]:
    kafka, gateway = await pair.send(rq.list_offsets(topic, [(partition, -1)]))
    return {name: response.topics[0].partitions[0].offset
            for name, response in (("kafka", kafka), ("gateway", gateway))}


def test_malformed_batches_are_refused_as_kafka_refuses_them(kafka_broker, gateway):
    cases = sorted(MALFORMED)
    seen: dict[str, tuple[str, str]] = {}
    watermarks: dict[str, dict[str, int]] = {}

    async def main() -> None:
        async with Pair(kafka_broker, gateway, Differ([])) as pair:
            topic = f"diff-malformed-{uuid.uuid4().hex[:10]}"
            await pair.create_topic("malformed/create", topic, partitions=len(cases))
            now = int(time.time() * 1000)
            for partition, case in enumerate(cases):
                batch = MALFORMED[case](now)
                kafka, gateway_answer = await pair.send(
                    rq.produce([(topic, partition, batch)]), timeout=120)
                seen[case] = (_code(kafka), _code(gateway_answer))
                watermarks[case] = await _high_watermark(pair, topic, partition)

    asyncio.run(asyncio.wait_for(main(), 600))
    report = "\n".join(f"{case}: kafka {k}, gateway {g}" for case, (k, g) in seen.items())
    print(f"\nmalformed batches ({len(seen)} cases):\n{report}")
    for case, (kafka, gateway_code) in seen.items():
        expected = INTENDED.get(case, (kafka, kafka))
        assert (kafka, gateway_code) == expected, (case, report)
        if gateway_code != ErrorCode.none.name:  # (an old timestamp is valid by default)
            assert watermarks[case]["gateway"] == 0, (case, "the gateway stored a refused batch")
    assert set(INTENDED) <= set(seen), "a listed difference no longer has a case"
