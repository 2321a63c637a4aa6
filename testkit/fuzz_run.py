"""Mutated frames against a live gateway, with a canary that must not lose a record.

A run starts with the boundary sweep (every field of every seed at the edges
of its range: testkit.fuzz.boundaries), then sends random mutations. Workers
each keep one connection and send one frame at a time, waiting for its
answer: an answer counts as answered, the server closing the connection as
closed, no answer within ``wait`` (Produce with acks=0, a long poll) as
unanswered (the worker then closes that connection). Meanwhile, every
``CANARY_EVERY`` frames, a canary produces a batch with acks=-1 on its own
connection and reads it back; at the end every acknowledged batch must be in
the log, at its offset, byte for byte. Used by tests/test_fuzz.py (bounded)
and bench/fuzz.py (long runs).

The gateway also has a SASL_PLAINTEXT listener, and one random frame in
``1 / SASL_SHARE`` is a login message before authentication instead
(testkit/fuzz_sasl.py): on a fresh connection to that listener, after the
valid frames its stage needs, each answered without error. The outcome of the
fuzzed frame counts like any other's (a bare token after a v0 handshake is
answered by a bare token, or not at all), by stage in ``Totals.sasl``.
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import re
import struct
import time
from collections import Counter
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode
from kio.static.primitive import Records

from kafka_gateway.client import KafkaClient
from kafka_gateway.codec import request_schema
from kafka_gateway.prometheus import API_NAMES
from testkit import fuzz_sasl, prom
from testkit.batches import make_batch
from testkit.fuzz import Names, Seed, boundaries, frame, frame_rng, seeds
from testkit.fuzz_sasl import SaslCase
from testkit.gateway import GatewayProcess

# Flags for a gateway under fuzzing: a new group forms at once (JoinGroup
# answers instead of waiting out the initial delay), and /metrics is served.
GATEWAY_FLAGS = ("--group-initial-rebalance-delay-ms", "0", "--admin-listen", "127.0.0.1:0",
                 "--listeners", "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0")
SASL_SHARE = 0.05  # of the random frames, login messages (testkit/fuzz_sasl.py)
CANARY_TOPIC = "canary-topic-that-no-seed-names"
CANARY_EVERY = 50
_ADMIN = re.compile(r"admin http ([\d.]+:\d+)")
_SIZE = struct.Struct(">i")
_CRC_START = 21  # a stored batch differs from the one sent only before this byte


@dataclass
class Totals:
    sent: int = 0
    answered: int = 0
    closed: int = 0  # the server closed the connection instead of answering
    unanswered: int = 0  # no answer within the wait: the worker closed the connection
    mismatched: int = 0  # an answer to some other request: must stay 0
    crashes: int = 0
    canary_batches: int = 0
    canary_lost: int = 0
    canary_failure: str | None = None  # why the canary stopped, if it did
    handler_errors: int = 0  # requests whose handler raised (kafka_gateway_request_errors_total)
    peak_rss_mib: float = 0.0
    seconds: float = 0.0
    by_api: Counter[str] = field(default_factory=Counter)
    sasl: Counter[str] = field(default_factory=Counter)  # "stage outcome" of SASL cases
    sasl_setup_failures: int = 0  # a valid setup frame not answered without error: must stay 0

    @property
    def ok(self) -> bool:
        return not (self.crashes or self.mismatched or self.canary_lost or self.handler_errors
                    or self.canary_failure or self.sasl_setup_failures) and self.canary_batches > 0

    def line(self) -> str:
        canary = self.canary_failure or f"batches {self.canary_batches}, lost {self.canary_lost}"
        return (f"frames sent {self.sent}, answered {self.answered}, closed by the server "
                f"{self.closed}, unanswered {self.unanswered}, mismatched {self.mismatched}, "
                f"crashes {self.crashes}; handler errors {self.handler_errors}; canary "
                f"{canary}; SASL cases {sum(self.sasl.values())}, setup failures "
                f"{self.sasl_setup_failures}; peak RSS {self.peak_rss_mib:.0f} MiB; "
                f"{self.seconds:.1f} s")


def run(gateway: GatewayProcess, frames: int, run_seed: int, workers: int = 8,
        wait: float = 1.0) -> Totals:
    """Fuzz a started gateway (GATEWAY_FLAGS) with ``frames`` mutated frames."""
    return asyncio.run(_run(gateway, frames, run_seed, workers, wait))


async def _run(gateway: GatewayProcess, frames: int, run_seed: int, workers: int,
               wait: float) -> Totals:
    totals = Totals()
    started = time.monotonic()
    host, port = gateway.host_port
    names = Names(topic_id=await _create_topics(host, port))
    sasl_port = gateway.listener_ports.get(fuzz_sasl.SASL_LISTENER)
    if sasl_port is not None:
        await fuzz_sasl.create_user(host, port)
    source = _Frames(seeds(names), run_seed, sasl=sasl_port is not None)
    canary = await Canary.start(host, port)
    numbers = itertools.count()
    due = asyncio.Event()  # set every CANARY_EVERY frames
    stop = asyncio.Event()

    async def canary_loop() -> None:
        while not stop.is_set():
            await due.wait()
            due.clear()
            await canary.produce_and_read_back()

    canary_task = asyncio.create_task(canary_loop())
    try:
        await asyncio.gather(*(
            _worker(host, port, sasl_port, gateway, source, numbers, frames, wait, totals, due)
            for _ in range(workers)))
    finally:
        stop.set()
        due.set()
        try:
            await asyncio.wait_for(canary_task, 60)
        except Exception as exc:
            totals.canary_failure = repr(exc)
    if not gateway.process or gateway.process.poll() is not None:
        totals.crashes = max(totals.crashes, 1)
        return totals
    totals.canary_batches, totals.canary_lost = await canary.verify()
    await canary.close()
    totals.handler_errors = _handler_errors(gateway)
    totals.peak_rss_mib = _peak_rss_mib(gateway)
    totals.seconds = time.monotonic() - started
    return totals


async def _create_topics(host: str, port: int):
    """The topic the seeds name (so data requests reach a partition), and its id."""
    client = await KafkaClient.connect(host, port)
    try:
        schema = request_schema(3, 12)
        answer = await client.request(schema.MetadataRequest(
            topics=(schema.MetadataRequestTopic(topic_id=None, name=Names().topic),),
            allow_auto_topic_creation=True, include_topic_authorized_operations=False))
        return answer.topics[0].topic_id
    finally:
        await client.close()


class _Frames:
    """Frame ``n`` of a run: the boundary sweep first, then random mutations, and
    (``sasl``) now and then a login message before authentication."""

    def __init__(self, all_seeds: list[Seed], run_seed: int, sasl: bool = False) -> None:
        self.seeds = all_seeds
        self.sweep = boundaries(all_seeds)
        self.run_seed = run_seed
        self.sasl = sasl

    def __call__(self, number: int) -> tuple[Seed, bytes] | SaslCase:
        correlation_id = number & 0x7FFFFFFF
        if number < len(self.sweep):
            seed, body = self.sweep[number]
            return seed, frame(seed, correlation_id, body=body)
        rng = frame_rng(self.run_seed, number)
        if self.sasl and rng.random() < SASL_SHARE:
            return fuzz_sasl.sasl_case(self.seeds, rng, correlation_id)
        seed = self.seeds[rng.randrange(len(self.seeds))]
        return seed, frame(seed, correlation_id, rng)


async def _worker(host: str, port: int, sasl_port: int | None, gateway: GatewayProcess,
                  source: _Frames, numbers: itertools.count, frames: int, wait: float,
                  totals: Totals, canary_due: asyncio.Event) -> None:
    reader = writer = None
    try:
        for number in numbers:
            if number >= frames or totals.crashes:
                return
            if number % CANARY_EVERY == 0:
                canary_due.set()
            item = source(number)
            correlation_id = number & 0x7FFFFFFF
            if isinstance(item, SaslCase):
                assert sasl_port is not None
                totals.sent += 1
                outcome = await _sasl_exchange(host, sasl_port, gateway, item, correlation_id,
                                               wait, totals)
                setattr(totals, outcome, getattr(totals, outcome) + 1)
                totals.sasl[f"{item.stage} {outcome}"] += 1
                continue
            seed, data = item
            if writer is None:
                try:
                    reader, writer = await asyncio.open_connection(host, port)
                except OSError:
                    if gateway.process is None or gateway.process.poll() is not None:
                        totals.crashes = 1  # the process is gone
                        return
                    raise
            assert reader is not None
            totals.sent += 1
            outcome = await _exchange(reader, writer, data, correlation_id, wait)
            setattr(totals, outcome, getattr(totals, outcome) + 1)
            totals.by_api[f"{seed.name} {outcome}"] += 1
            if outcome != "answered":
                writer.close()
                reader = writer = None
    finally:
        if writer is not None:
            writer.close()


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes,
                    correlation_id: int, wait: float) -> str:
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(wait):
            (size,) = _SIZE.unpack(await reader.readexactly(4))
            answer = await reader.readexactly(size)
    except TimeoutError:
        return "unanswered"
    except (asyncio.IncompleteReadError, ConnectionError):
        return "closed"
    (answered_id,) = _SIZE.unpack_from(answer, 0)
    return "answered" if answered_id == correlation_id else "mismatched"


async def _sasl_exchange(host: str, port: int, gateway: GatewayProcess, case: SaslCase,
                         correlation_id: int, wait: float, totals: Totals) -> str:
    """One SASL case on a fresh connection: its setup, then the fuzzed frame's outcome."""
    try:
        opened = await fuzz_sasl.open_case(host, port, case, wait)
    except OSError:
        if gateway.process is None or gateway.process.poll() is not None:
            totals.crashes = 1  # the process is gone
            return "closed"
        raise
    if opened is None:
        totals.sasl_setup_failures += 1
        return "closed"
    reader, writer = opened
    try:
        if case.raw:
            return await fuzz_sasl.raw_exchange(reader, writer, case.frame, wait)
        return await _exchange(reader, writer, case.frame, correlation_id, wait)
    finally:
        writer.close()


def _admin_address(gateway: GatewayProcess) -> str:
    match = _ADMIN.search(gateway.output())
    assert match, "the gateway must be started with GATEWAY_FLAGS (admin http)"
    return match.group(1)


# The counter the handler-error bound reads: its exact sample name, and the
# series every API has from the start (kafka_gateway.prometheus).
HANDLER_ERRORS = "kafka_gateway_request_errors_total"


def _handler_errors(gateway: GatewayProcess) -> int:
    """Requests whose handler raised, summed over every API's series.

    Raises when the counter, or any API's series of it, is missing from
    /metrics: a renamed metric must not read as "no errors".
    """
    parsed = prom.samples(prom.scrape(_admin_address(gateway)))
    per_api = {dict(labels).get("api"): value for (name, labels), value in parsed.items()
               if name == HANDLER_ERRORS}
    missing = sorted(set(API_NAMES) - set(per_api))
    if missing:
        raise RuntimeError(f"/metrics has no {HANDLER_ERRORS} series for {missing} "
                           f"(found {len(per_api)}): cannot count handler errors")
    return sum(int(value) for value in per_api.values())


def _peak_rss_mib(gateway: GatewayProcess) -> float:
    """The gateway's peak resident memory (VmHWM); raises when it cannot be read."""
    assert gateway.process is not None
    path = f"/proc/{gateway.process.pid}/status"
    with open(path) as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{path} has no VmHWM line: cannot read the peak RSS")


class Canary:
    """A producer with acks=-1 and a reader of what it produced, on its own connection."""

    def __init__(self, client: KafkaClient) -> None:
        self.client = client
        self.acked: dict[int, bytes] = {}  # base offset -> the batch from its CRC on
        self._number = 0

    @classmethod
    async def start(cls, host: str, port: int) -> Canary:
        client = await KafkaClient.connect(host, port)
        schema = request_schema(19, 7)
        created = await client.request(schema.CreateTopicsRequest(
            topics=(schema.CreatableTopic(name=CANARY_TOPIC, num_partitions=1,
                                          replication_factor=1, assignments=(), configs=()),),
            timeout=datetime.timedelta(seconds=5), validate_only=False))
        assert created.topics[0].error_code is ErrorCode.none, created
        return cls(client)

    async def produce_and_read_back(self, timeout: float = 30.0) -> None:
        """One batch in, acknowledged, and read back at its offset: or an assertion."""
        self._number += 1
        batch = make_batch([f"canary {self._number} {i}".encode() for i in range(3)],
                           base_timestamp=int(time.time() * 1000))
        schema = request_schema(0, 9)
        async with asyncio.timeout(timeout):
            answer = await self.client.request(schema.ProduceRequest(
                transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=10),
                topic_data=(schema.TopicProduceData(name=CANARY_TOPIC, partition_data=(
                    schema.PartitionProduceData(index=0, records=Records(batch)),)),)))
            part = answer.responses[0].partition_responses[0]
            assert part.error_code is ErrorCode.none, part
            self.acked[part.base_offset] = batch[_CRC_START:]
            stored = await self._read(part.base_offset)
        assert stored.get(part.base_offset) == batch[_CRC_START:], "canary batch not read back"

    async def verify(self) -> tuple[int, int]:
        """(acknowledged batches, how many of them are missing or changed)."""
        stored = await self._read(0, everything=True)
        lost = sum(1 for offset, data in self.acked.items() if stored.get(offset) != data)
        return len(self.acked), lost

    async def _read(self, offset: int, everything: bool = False) -> dict[int, bytes]:
        schema = request_schema(1, 11)
        found: dict[int, bytes] = {}
        while True:
            answer = await self.client.request(schema.FetchRequest(
                replica_id=-1, max_wait=datetime.timedelta(0), min_bytes=1,
                max_bytes=8 << 20, isolation_level=0, session_id=0, session_epoch=-1,
                topics=(schema.FetchTopic(topic=CANARY_TOPIC, partitions=(schema.FetchPartition(
                    partition=0, fetch_offset=offset, partition_max_bytes=8 << 20,
                    current_leader_epoch=-1, log_start_offset=-1),)),),
                forgotten_topics_data=(), rack_id=""))
            part = answer.responses[0].partitions[0]
            assert part.error_code is ErrorCode.none, part
            records = bytes(part.records or b"")
            pos = 0
            while pos + 12 <= len(records):
                base, length = struct.unpack_from(">qi", records, pos)
                found[base] = records[pos + _CRC_START: pos + 12 + length]
                last_delta = struct.unpack_from(">i", records, pos + 23)[0]
                offset = base + last_delta + 1
                pos += 12 + length
            if not everything or not records or offset >= part.high_watermark:
                return found

    async def close(self) -> None:
        await self.client.close()
