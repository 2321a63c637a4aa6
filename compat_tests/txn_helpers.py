"""Helpers shared by the transaction compat tests (``test_txn_*.py``).

- a gateway that aborts timed-out transactions within 200 ms;
- the scenario every client runs (two topics, several partitions, committed,
  aborted and open transactions) and the offsets its records must get;
- what is really stored, read over the wire without any client library
  (batches with their transactional/control flags, watermarks);
- raw requests a client library does not let a test send exactly: OffsetFetch
  with require_stable, and the transactional requests on a chosen connection
  (``testkit.raw_txn.RawTxn``).

Every wait is bounded; servers are a ``GatewayProcess`` or a ``KafkaBroker``
(anything with ``host_port``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from kio.schema.errors import ErrorCode
from kio.schema.offset_fetch.v8 import request as offset_fetch

from kafka_gateway.client import KafkaClient
from tablets.batch import parse_batches
from testkit import kafka_requests as rq
from testkit.gateway import GatewayProcess
from testkit.raw_txn import RawTxn as RawTxn  # re-exported: the compat tests import it here
from testkit.routing import coordinator_client, leader_client

T = TypeVar("T")
TIMEOUT_S = 30.0
TXN_TIMEOUT_MS = 2000  # the producers of the timeout tests
TXN_GATEWAY_ARGS = (
    # Aborting a timed-out transaction within 200 ms keeps the timeout tests short.
    "--transaction-abort-timed-out-transaction-cleanup-interval-ms", "200",
    "--group-initial-rebalance-delay-ms", "300",
)

# The scenario of the commit/abort tests: two topics, several partitions each.
TOPICS = {"a": 3, "b": 2}
PER_PARTITION = 4  # records per partition per transaction


class Server(Protocol):
    @property
    def host_port(self) -> tuple[str, int]: ...

    @property
    def bootstrap(self) -> str: ...


@contextlib.contextmanager
def txn_gateway(data_dir: Path) -> Iterator[GatewayProcess]:
    with GatewayProcess(data_dir, *TXN_GATEWAY_ARGS) as gateway:
        yield gateway


def wait_for(condition: Callable[[], T], timeout: float, what: str,
             interval: float = 0.1) -> T:
    """Call ``condition`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
    return value


def within(timeout: float, fn: Callable[..., T], *args: object) -> T:
    """Run a blocking client call that takes no timeout of its own (kafka-python's
    commit_transaction waits for ever); fail the test instead of hanging."""
    outcome: list = []

    def call() -> None:
        try:
            outcome.append((True, fn(*args)))
        except BaseException as exc:  # handed to the test's thread
            outcome.append((False, exc))

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(timeout)
    if not outcome:
        raise AssertionError(f"{getattr(fn, '__qualname__', fn)} did not return in {timeout}s")
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


def timed_out(gateway: GatewayProcess, transactional_id: str) -> bool:
    """Whether the gateway logged that it aborted this id's transaction on
    timeout (in a cluster: whichever of the three coordinates the id)."""
    return any(f"transaction {transactional_id} " in line and "timed out" in line
               for output in gateway.outputs() for line in output.splitlines())


# ------------------------------------------------------------------ scenario
def topic_names(base: str) -> dict[str, int]:
    """The scenario's topics for one test: name -> partition count."""
    return {f"{base}-{suffix}": count for suffix, count in TOPICS.items()}


def txn_records(tag: str, topics: dict[str, int],
                per_partition: int = PER_PARTITION) -> list[tuple[str, int, bytes]]:
    """(topic, partition, value) of one transaction: ``per_partition`` each."""
    return [(topic, partition, f"{tag}:{topic}:{partition}:{i}".encode())
            for topic, count in topics.items() for partition in range(count)
            for i in range(per_partition)]


def log_offsets(transactions: list[tuple[int, str]], keeps_aborted: bool) -> list[list[int]]:
    """The offsets the records of each transaction of one partition get, in log order.

    ``transactions``: (record count, "commit" | "abort") in the order their
    records reached the log. Every transaction that ends leaves one marker
    after its records. Kafka writes aborted records and an ABORT marker;
    the gateway writes nothing of an aborted transaction (``keeps_aborted``
    False), so the records of a later transaction follow the COMMIT marker.
    """
    out, offset = [], 0
    for count, outcome in transactions:
        if outcome == "abort" and not keeps_aborted:
            out.append([])
            continue
        out.append(list(range(offset, offset + count)))
        offset += count + 1
    return out


def by_partition(records: list[tuple[str, int, int, bytes]]
                 ) -> dict[tuple[str, int], list[tuple[int, bytes]]]:
    """(topic, partition, offset, value) rows as (topic, partition) -> [(offset, value)]."""
    out: dict[tuple[str, int], list[tuple[int, bytes]]] = {}
    for topic, partition, offset, value in records:
        out.setdefault((topic, partition), []).append((offset, value))
    return out


def expected_view(topics: dict[str, int], visible: list[tuple[str, list[int]]]
                  ) -> dict[tuple[str, int], list[tuple[int, bytes]]]:
    """(topic, partition) -> [(offset, value)] a consumer must see, in order:
    the records of the ``visible`` transactions, given as (tag, their
    offsets in each partition; see ``log_offsets``)."""
    out: dict[tuple[str, int], list[tuple[int, bytes]]] = {}
    for tag, offsets in visible:
        values: dict[tuple[str, int], list[bytes]] = {}
        for topic, partition, value in txn_records(tag, topics, len(offsets)):
            values.setdefault((topic, partition), []).append(value)
        for tp, each in values.items():
            out.setdefault(tp, []).extend(zip(offsets, each, strict=True))
    return out


# ------------------------------------------------------------- raw requests
def run_raw(server: Server, fn: Callable[[KafkaClient], Awaitable[T]],
            connect: Callable[[], Awaitable[KafkaClient]] | None = None) -> T:
    """Run ``fn`` with a fresh connection to the server (or the one
    ``connect`` opens: the leader or coordinator it routes to), bounded in time."""

    async def main() -> T:
        client = await (connect() if connect is not None
                        else KafkaClient.connect(*server.host_port))
        try:
            return await fn(client)
        finally:
            await client.close()

    return asyncio.run(asyncio.wait_for(main(), TIMEOUT_S))


@dataclass(frozen=True, slots=True)
class StoredBatch:
    base_offset: int
    records: int
    transactional: bool
    control: bool
    producer_id: int
    producer_epoch: int
    base_sequence: int


@dataclass(frozen=True, slots=True)
class StoredLog:
    batches: list[StoredBatch]
    high_watermark: int
    last_stable_offset: int

    @property
    def data_records(self) -> int:
        return sum(b.records for b in self.batches if not b.control)

    @property
    def markers(self) -> list[int]:
        """Offsets of the control batches (COMMIT or ABORT markers)."""
        return [b.base_offset for b in self.batches if b.control]


def stored_log(server: Server, topic: str, partition: int) -> StoredLog:
    """Every batch of a partition as a read_uncommitted raw Fetch returns it."""

    async def read(client: KafkaClient) -> StoredLog:
        out: list[StoredBatch] = []
        offset, high_watermark, stable = 0, 1, 0
        while offset < high_watermark:
            response = await client.request(rq.fetch(
                topic, [(partition, offset, 64 << 20)], isolation_level=0, max_bytes=64 << 20))
            data = response.responses[0].partitions[0]
            assert data.error_code is ErrorCode.none, data.error_code
            high_watermark, stable = data.high_watermark, data.last_stable_offset
            if not data.records:
                break
            raw = bytes(data.records)
            for header in parse_batches(raw):
                base = int.from_bytes(raw[header.start:header.start + 8], "big", signed=True)
                out.append(StoredBatch(base, header.record_count, header.is_transactional,
                                       header.is_control, header.producer_id,
                                       header.producer_epoch, header.base_sequence))
                offset = base + header.record_count
        return StoredLog(out, high_watermark, stable)

    return run_raw(server, read, lambda: leader_client(server.host_port, topic, partition))


def stored_log_reaching(server: Server, topic: str, partition: int,
                        high_watermark: int) -> StoredLog:
    """The partition's stored log once its leader's high watermark reaches
    ``high_watermark``. A commit through a coordinator on another gateway
    reaches the leader by a PostgreSQL notification, after EndTxn's answer
    (docs/cluster-design.md, "Cross-gateway commits"), as Kafka's markers
    reach a leader after EndTxn's; on one gateway the first read has it."""
    def reached() -> StoredLog | None:
        log = stored_log(server, topic, partition)
        return log if log.high_watermark >= high_watermark else None

    return wait_for(reached, TIMEOUT_S,
                    f"{topic}-{partition}'s high watermark to reach {high_watermark}")


def fetch_offsets(server: Server, group: str, partitions: list[tuple[str, int]],
                  require_stable: bool) -> dict[tuple[str, int], tuple[int, ErrorCode]]:
    """(topic, partition) -> (committed offset, error) from one OffsetFetch v8."""

    async def fetch_them(client: KafkaClient) -> dict:
        topics: dict[str, list[int]] = {}
        for topic, partition in partitions:
            topics.setdefault(topic, []).append(partition)
        response = await client.request(offset_fetch.OffsetFetchRequest(
            groups=(offset_fetch.OffsetFetchRequestGroup(group_id=group, topics=tuple(
                offset_fetch.OffsetFetchRequestTopics(name=name, partition_indexes=tuple(ps))
                for name, ps in topics.items())),),
            require_stable=require_stable))
        (answer,) = response.groups
        assert answer.error_code is ErrorCode.none, answer.error_code
        return {(t.name, p.partition_index): (p.committed_offset, p.error_code)
                for t in answer.topics for p in t.partitions}

    return run_raw(server, fetch_them, lambda: coordinator_client(server.host_port, group))


def assert_one_idempotent_producer(gateway, topic: str, partition: int) -> None:
    """Every stored batch of the partition is one idempotent producer's, with
    sequences equal to offsets (nothing stored twice, nothing skipped)."""
    log = stored_log(gateway, topic, partition)
    assert len({b.producer_id for b in log.batches}) == 1
    assert log.batches[0].producer_id >= 0
    assert [b.base_sequence for b in log.batches] == [b.base_offset for b in log.batches]
