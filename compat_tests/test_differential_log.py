"""Differential: the log, through raw requests (kio), Apache Kafka 3.4.1 vs the gateway.

The same requests go to both servers and every field of every response is
compared (testkit/differential.py says what is normalised and why):
offsets and watermarks after produce (one record, many, each codec, several
partitions in one request), ListOffsets by position and by timestamp at
every version, Fetch inside a batch, at the log end and past it, with byte
limits, at every version, and everything again after DeleteRecords.
"""

from __future__ import annotations

import time
import uuid

from differences import EXPECTED

from testkit import kafka_requests as rq
from testkit.batches import GZIP, LZ4, NONE, SNAPPY, ZSTD, Record, encode_batch
from testkit.server_pair import Pair, run_pair, unique_name

EARLIEST, LATEST, MAX_TIMESTAMP = -2, -1, -3


class Log:
    """Three partitions: p0 plain batches, p1 one batch per codec, p2 empty."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        # A minute ago: inside any retention, and the same on both servers.
        self.t0 = (int(time.time()) - 60) * 1000

    def p0(self) -> list[bytes]:
        t0 = self.t0
        return [
            encode_batch([Record(b"one", key=b"k", headers=(("h", b"v"),))], t0),
            encode_batch([Record(f"m{i}".encode(), timestamp_delta=10 * i) for i in range(5)],
                         t0 + 100),
            # Same timestamp as the previous batch's last record: ties in max-timestamp.
            encode_batch([Record(None, key=b"tombstone")], t0 + 140),
            encode_batch([Record(b"x" * 3000, timestamp_delta=i) for i in range(3)], t0 + 300),
        ]

    def p1(self) -> list[bytes]:
        return [
            encode_batch([Record(f"{codec}-{i}".encode() * 20, key=f"k{i}".encode(),
                                 headers=(("codec", str(codec).encode()),), timestamp_delta=i)
                          for i in range(4)], self.t0 + 1000 * codec, codec=codec)
            for codec in (GZIP, SNAPPY, LZ4, ZSTD, NONE)
        ]


async def _produce_log(pair: Pair, log: Log) -> dict[str, object]:
    """Create and fill the log; returns each server's id for the topic."""
    ids = await pair.create_topic("produce/create", log.topic, partitions=3)
    p0, p1 = log.p0(), log.p1()
    await pair.check("produce/one-record", rq.produce([(log.topic, 0, p0[0])]))
    await pair.check("produce/many-records", rq.produce([(log.topic, 0, p0[1])]))
    await pair.check("produce/null-value", rq.produce([(log.topic, 0, p0[2])]))
    for i, batch in enumerate(p1[:4]):
        await pair.check(f"produce/codec-{i + 1}", rq.produce([(log.topic, 1, batch)]))
    # Several partitions in one request, acks=1.
    await pair.check("produce/two-partitions",
                     rq.produce([(log.topic, 0, p0[3]), (log.topic, 1, p1[4])], acks=1))
    # Produce at older versions still answers with offsets (and v2+ the append time).
    for version in (3, 5, 7, 8):
        batch = encode_batch([Record(f"v{version}".encode())], log.t0 + 9000 + version)
        await pair.check(f"produce/v{version}",
                         rq.produce([(log.topic, 2, batch)], version=version))
    return ids


def test_offsets_watermarks_and_list_offsets(kafka_broker, gateway):
    log = Log(unique_name("log"))

    async def scenario(pair: Pair) -> None:
        await _produce_log(pair, log)
        t0 = log.t0
        positions = {"earliest": EARLIEST, "latest": LATEST, "max-timestamp": MAX_TIMESTAMP,
                     "before-all": t0 - 1000, "first-record": t0, "between-batches": t0 + 50,
                     "inside-batch": t0 + 115, "tie": t0 + 140, "inside-large": t0 + 301,
                     "inside-gzip": t0 + 1002, "inside-snappy": t0 + 2001,
                     "inside-lz4": t0 + 3003, "inside-zstd": t0 + 4002,
                     "after-all": t0 + 10**7}
        for label, timestamp in positions.items():
            await pair.check(f"list-offsets/{label}", rq.list_offsets(
                log.topic, [(p, timestamp) for p in range(3)]))
        for version in range(1, 8):
            for label in ("earliest", "latest", "inside-batch", "after-all"):
                await pair.check(f"list-offsets/v{version}-{label}", rq.list_offsets(
                    log.topic, [(0, positions[label]), (1, positions[label])],
                    version=version))
        await pair.check("list-offsets/read-committed", rq.list_offsets(
            log.topic, [(0, LATEST), (1, MAX_TIMESTAMP)], isolation_level=1))
        await pair.check("list-offsets/unknown-partition",
                         rq.list_offsets(log.topic, [(7, LATEST)]))
        await pair.check("list-offsets/unknown-topic",
                         rq.list_offsets(unique_name("missing"), [(0, LATEST)]))
        await pair.check("list-offsets/same-partition-twice",
                         rq.list_offsets(log.topic, [(0, EARLIEST), (0, LATEST)]))

    run_pair(scenario, kafka_broker, gateway, EXPECTED)


def test_fetch_positions_limits_and_versions(kafka_broker, gateway):
    log = Log(unique_name("fetch"))

    async def scenario(pair: Pair) -> None:
        ids = await _produce_log(pair, log)
        # p0: offsets 0 | 1-5 | 6 | 7-9, high watermark 10.
        for offset in (0, 1, 3, 5, 6, 8, 9, 10, 11, 1000):
            await pair.check(f"fetch/p0-at-{offset}", rq.fetch(log.topic, [(0, offset, 1 << 20)]))
        for offset in (0, 2, 4, 13, 18, 19, 20, 21):
            await pair.check(f"fetch/p1-at-{offset}", rq.fetch(log.topic, [(1, offset, 1 << 20)]))
        await pair.check("fetch/empty-partition", rq.fetch(log.topic, [(2, 0, 1 << 20)]))
        await pair.check("fetch/all-partitions", rq.fetch(
            log.topic, [(0, 0, 1 << 20), (1, 0, 1 << 20), (2, 0, 1 << 20)]))
        # Byte limits: the first batch comes whole even when over the limit (KIP-74).
        await pair.check("fetch/partition-limit-1-byte", rq.fetch(log.topic, [(0, 7, 1)]))
        await pair.check("fetch/partition-limit-200", rq.fetch(log.topic, [(0, 0, 200)]))
        await pair.check("fetch/response-limit-1-byte", rq.fetch(
            log.topic, [(0, 0, 1 << 20), (1, 0, 1 << 20)], max_bytes=1))
        await pair.check("fetch/read-committed",
                         rq.fetch(log.topic, [(0, 0, 1 << 20)], isolation_level=1))
        await pair.check("fetch/unknown-partition", rq.fetch(log.topic, [(9, 0, 1 << 20)]))
        await pair.check("fetch/unknown-topic", rq.fetch(unique_name("missing"), [(0, 0, 1 << 20)]))
        for version in range(4, 13):
            await pair.check(f"fetch/v{version}", rq.fetch(
                log.topic, [(0, 2, 1 << 20), (1, 4, 1 << 20)], version=version))
            await pair.check(f"fetch/v{version}-past-end",
                             rq.fetch(log.topic, [(0, 11, 1 << 20)], version=version))
        # v13 names the topic by its id: each server's own.
        await pair.check("fetch/v13-by-id", *(
            rq.fetch(ids[s], [(0, 2, 1 << 20), (1, 4, 1 << 20)], version=13)
            for s in ("kafka", "gateway")))
        await pair.check("fetch/v13-unknown-id", rq.fetch(uuid.uuid4(), [(0, 0, 1 << 20)],
                                                          version=13))
        # Leader epochs: every partition is at epoch 0, which ends at the log end.
        for version in (2, 3, 4):
            await pair.check(f"leader-epoch/v{version}", rq.offset_for_leader_epoch(
                log.topic, [(0, -1, 0), (1, 0, 0), (2, -1, 5)], version=version))
        await pair.check("leader-epoch/fenced-and-unknown", rq.offset_for_leader_epoch(
            log.topic, [(0, 7, 0), (1, -2, 0), (9, -1, 0)]))
        for epoch in (-2, 1, 0):  # current leader epoch named by the client
            await pair.check(f"leader-epoch/fetch-at-{epoch}", rq.fetch(
                log.topic, [(0, 0, 1 << 20)], current_leader_epoch=epoch))
            await pair.check(f"leader-epoch/list-offsets-at-{epoch}", rq.list_offsets(
                log.topic, [(0, -1)], current_leader_epoch=epoch))

    run_pair(scenario, kafka_broker, gateway, EXPECTED)


def test_delete_records_then_read(kafka_broker, gateway):
    log = Log(unique_name("delete"))

    async def scenario(pair: Pair) -> None:
        await _produce_log(pair, log)
        await pair.check("delete-records/inside-batch", rq.delete_records(log.topic, [(0, 3)]))
        await pair.check("delete-records/earliest", rq.list_offsets(
            log.topic, [(0, EARLIEST), (1, EARLIEST)]))
        await pair.check("delete-records/by-old-timestamp",
                         rq.list_offsets(log.topic, [(0, log.t0)]))
        for offset in (0, 2, 3, 4, 6):
            await pair.check(f"delete-records/fetch-at-{offset}",
                             rq.fetch(log.topic, [(0, offset, 1 << 20)]))
        await pair.check("delete-records/backwards", rq.delete_records(log.topic, [(0, 1)]))
        await pair.check("delete-records/past-end", rq.delete_records(log.topic, [(0, 11)]))
        await pair.check("delete-records/to-high-watermark",
                         rq.delete_records(log.topic, [(0, -1), (1, 7)]))
        await pair.check("delete-records/unknown-partition",
                         rq.delete_records(log.topic, [(5, 0)]))
        await pair.check("delete-records/after", rq.list_offsets(
            log.topic, [(0, EARLIEST), (1, EARLIEST)]))
        await pair.check("delete-records/after-latest", rq.list_offsets(log.topic, [(0, LATEST)]))
        for offset in (9, 10):
            await pair.check(f"delete-records/fetch-emptied-at-{offset}",
                             rq.fetch(log.topic, [(0, offset, 1 << 20)]))
        for version in (0, 1):
            await pair.check(f"delete-records/v{version}",
                             rq.delete_records(log.topic, [(1, 8)], version=version))

    run_pair(scenario, kafka_broker, gateway, EXPECTED)
