"""Compaction against Apache Kafka 3.4.1: the same record batches, byte for
byte, go to a compacted topic on both; once both have compacted, a
read_committed Fetch from the log start returns the same batches (base
offsets and record counts) holding the same records (offset, key, value) on
both.

The topic rolls a segment for every batch (segment.ms=1, batches stamped 2 ms
apart), so on both everything but the newest batch is cleanable: Kafka
compacts only closed segments, the gateway only what it would have in closed
segments (the same roll rule). Each phase ends with a batch of its own,
pushing the phase's last batch out of the active segment.

Where the two differ, by design, and what is checked instead:

- When: Kafka's cleaner looks every 15 s (log.cleaner.backoff.ms), the
  gateway's here every 100 ms; the test waits for each.
- Tombstones (delete.retention.ms=0): both keep a tombstone through the first
  run that sees it and stamp its batch with a delete horizon (KIP-534). Kafka
  drops it in its next run, which needs new dirty data; the gateway runs
  again once the horizon has passed, without new data. So after a phase the
  gateway may already have dropped the phase's tombstones that Kafka still
  shows; every other record is the same, and after the next phase (new
  data: Kafka runs again) the tombstones are gone on both.
- A record without a key: refused by both, INVALID_RECORD, with the same
  per-record errors and message; a batch larger than segment.bytes, by both
  with RECORD_LIST_TOO_LARGE (Kafka without a message, the gateway with the
  one Kafka logs).
"""

from __future__ import annotations

import asyncio

import pytest
from compaction_helpers import read_partition, wait_for
from kio.schema.errors import ErrorCode

from kafka_gateway.client import KafkaClient
from testkit.batches import GZIP, LZ4, NONE, SNAPPY, ZSTD
from testkit.compaction import EAGER, keyed_batch, now_ms
from testkit.gateway import GatewayProcess
from testkit.kafka_requests import create_topic, send_produce

CONFIGS = {**EAGER, "min.cleanable.dirty.ratio": "0", "segment.bytes": "1000"}
CODECS = [NONE, GZIP, SNAPPY, LZ4, ZSTD]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with GatewayProcess(tmp_path_factory.mktemp("compaction-diff") / "data",
                        "--log-cleaner-backoff-ms", "100") as gw:
        yield gw


def phases(base_ms: int) -> list[list[bytes]]:
    """Three phases of batches: keys rewritten and deleted, then quieter."""
    def batch(n: int, pairs, codec: int | None = None) -> bytes:
        return keyed_batch(pairs, codec=CODECS[n % len(CODECS)] if codec is None else codec,
                           timestamp=base_ms + 2 * n, xerial=n % 2 == 0)

    first = [batch(n, [(b"k%d" % ((n * 7 + i) % 15), b"a%d-%d" % (n, i)) for i in range(4)])
             for n in range(30)]
    first.append(batch(30, [(b"k3", None), (b"k4", None), (b"k5", b"a30")]))
    first.append(batch(31, [(b"end-a", b"x")], NONE))
    second = [batch(40 + n, [(b"k%d" % ((n * 5 + i) % 9), b"b%d-%d" % (n, i)) for i in range(3)])
              for n in range(10)]
    second.append(batch(50, [(b"k6", None), (b"k3", b"back")]))
    second.append(batch(51, [(b"end-b", b"x")], NONE))
    third = [batch(60, [(b"end-c", b"x")], NONE)]
    return [first, second, third]


async def _produce_all(server, topic: str, batches: list[bytes]) -> None:
    client = await KafkaClient.connect(*server.host_port)
    try:
        for data in batches:
            answer = await send_produce(client, topic, data)
            assert answer.error_code is ErrorCode.none, answer
    finally:
        await client.close()


async def _refused(server, topic: str, data: bytes):
    client = await KafkaClient.connect(*server.host_port)
    try:
        answer = await send_produce(client, topic, data)
        return (answer.error_code, [(e.batch_index, e.batch_index_error_message)
                                    for e in answer.record_errors], answer.error_message)
    finally:
        await client.close()


def _create(server, topic: str) -> None:
    async def main():
        client = await KafkaClient.connect(*server.host_port)
        try:
            await create_topic(client, topic, CONFIGS)
        finally:
            await client.close()

    asyncio.run(asyncio.wait_for(main(), 60))


def _compacted(server, topic: str, ends_with: bytes, tombstones: bool):
    """The log once its last batch is ``ends_with``, no key appears twice and
    (unless ``tombstones``) no tombstone is left."""
    records, batches = read_partition(server, topic)
    keys = [r.key for r in records]
    if not keys or keys[-1] != ends_with or len(keys) != len(set(keys)):
        return None
    if not tombstones and any(r.value is None for r in records):
        return None
    return records, batches


def test_compaction_keeps_what_kafka_keeps(gateway, kafka_broker, topic_name):
    servers = {"gateway": gateway, "kafka": kafka_broker}
    for server in servers.values():
        _create(server, topic_name)

    for bad, code in ((keyed_batch([(b"k1", b"x"), (None, b"y"), (None, b"z")]),
                       ErrorCode.invalid_record),
                      (keyed_batch([(b"k%d" % i, b"x" * 100) for i in range(12)]),
                       ErrorCode.record_list_too_large)):
        refused = {name: asyncio.run(_refused(server, topic_name, bad))
                   for name, server in servers.items()}
        if code is ErrorCode.record_list_too_large:
            assert refused["kafka"][2] is None
            assert "exceeds the maximum configured segment size of 1000" in refused["gateway"][2]
            refused = {name: answer[:2] for name, answer in refused.items()}
        assert refused["gateway"] == refused["kafka"]
        assert refused["kafka"][0] is code

    tombstones_kept: dict[str, list[int]] = {}
    for number, batches in enumerate(phases(now_ms() - 60_000)):
        end = f"end-{'abc'[number]}".encode()
        for server in servers.values():
            asyncio.run(asyncio.wait_for(_produce_all(server, topic_name, batches), 120))
        # The last phase adds no tombstone: Kafka's run drops the last ones.
        logs = {name: wait_for(lambda s=server, e=end, t=number < 2: _compacted(
                    s, topic_name, e, t), 90, f"{name} to compact phase {number + 1}")
                for name, server in servers.items()}
        (gw_records, gw_batches), (kafka_records, kafka_batches) = logs["gateway"], logs["kafka"]

        def live(records):
            return [(r.offset, r.key, r.value) for r in records if r.value is not None]

        assert live(gw_records) == live(kafka_records)
        tombstones_kept[f"phase {number + 1}"] = [
            r.offset for r in kafka_records if r.value is None]
        gateway_tombstones = [r.offset for r in gw_records if r.value is None]
        assert set(gateway_tombstones) <= set(tombstones_kept[f"phase {number + 1}"])
        if number == 2:  # Kafka has run again since the last tombstones: same log
            assert gw_records == kafka_records
            assert gw_batches == kafka_batches
            assert tombstones_kept["phase 3"] == []
    # What Kafka kept that the gateway had dropped already: this phase's tombstones.
    assert tombstones_kept["phase 1"] and tombstones_kept["phase 2"]
