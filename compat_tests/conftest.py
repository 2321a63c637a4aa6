"""Fixtures shared by the real-client tests: a gateway subprocess per module, and
Apache Kafka 3.4.1 (the reference broker) plus compiled Java programs per session."""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from kafka_gateway.client import KafkaClient
from tablets.batch import parse_batches
from testkit import jvm, pg_store_mode
from testkit import kafka_requests as rq
from testkit.differential import TALLY
from testkit.gateway import GatewayProcess
from testkit.kafka_broker import KafkaBroker
from testkit.routing import leader_client

# Stored batch headers as a raw Fetch returns them: [(base offset, codec, records)].
StoredBatches = Callable[[str, int], list[tuple[int, int, int]]]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    """A gateway on a free port with a fresh data dir, shared by one test module."""
    data_dir = tmp_path_factory.mktemp("gateway") / "data"
    with GatewayProcess(data_dir, "--log-retention-check-interval-ms", "500") as gw:
        yield gw


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory):
    """Apache Kafka 3.4.1, KRaft, one node: the reference for differential tests.

    Shared by the whole session (it takes seconds to start); tests use unique
    topic and group names. Its log is ``kafka.log`` in its directory.
    """
    with KafkaBroker(tmp_path_factory.mktemp("kafka")) as kafka:
        yield kafka


@pytest.fixture(scope="session")
def java_classes():
    """The Java test programs of compat_tests/jvm/src, compiled once per session
    against the 3.4.1 client and Kafka Streams."""
    return jvm.compile_java()


@pytest.fixture(params=jvm.LINES, ids=lambda pom: f"java-{jvm.kafka_version(pom)}")
def java_line_classes(request):
    """The same programs compiled against each client line, 3.4.1 and 4.x
    (compat_tests/jvm/kafka4/pom.xml): a test taking this runs on both, one
    line after the other. Function-scoped, so pytest keeps each module's
    tests together (a session-scoped parameter would regroup the whole run
    by line, starting each module's gateway twice); compiled once per line."""
    return _compiled(request.param)


@functools.cache
def _compiled(pom: Path) -> Path:
    return jvm.compile_java(pom=pom)


@pytest.fixture
def topic_name():
    """A unique topic name per test, so tests sharing a gateway stay apart."""
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def stored_batches(gateway) -> StoredBatches:
    """Read a partition's batches over the wire, bypassing any client library.

    Returns (base offset, compression codec, record count) per batch, so a
    test can check what a client really sent (e.g. that it compressed).
    Synchronous: call it outside any running event loop.
    """

    async def read(topic: str, partition: int) -> list[tuple[int, int, int]]:
        client = await leader_client(gateway.host_port, topic, partition)
        try:
            out: list[tuple[int, int, int]] = []
            offset, high_watermark = 0, 1
            while offset < high_watermark:
                response = await client.request(rq.fetch(
                topic, [(partition, offset, 64 << 20)], isolation_level=0, max_bytes=64 << 20))
                data = response.responses[0].partitions[0]
                if data.error_code is ErrorCode.offset_out_of_range and not out:
                    # Records were deleted: start at the log start offset (an
                    # answer in error carries no offsets, as Kafka's).
                    offset = await earliest(client, topic, partition)
                    continue
                assert data.error_code is ErrorCode.none, data.error_code
                high_watermark = data.high_watermark
                if not data.records:
                    break
                for header in parse_batches(bytes(data.records)):
                    base = int.from_bytes(
                        bytes(data.records)[header.start:header.start + 8], "big", signed=True)
                    out.append((base, header.compression, header.record_count))
                    offset = base + header.record_count
            return out
        finally:
            await client.close()

    return lambda topic, partition: asyncio.run(asyncio.wait_for(read(topic, partition), 30))


async def earliest(client: KafkaClient, topic: str, partition: int) -> int:
    """The log start offset of a partition (ListOffsets, earliest)."""
    response = await client.request(rq.list_offsets(topic, [(partition, -2)]))
    return response.topics[0].partitions[0].offset


def pytest_terminal_summary(terminalreporter):
    """The differential tests' total: how many fields were compared with Kafka."""
    if TALLY.checks:
        terminalreporter.write_line(TALLY.summary())


def pytest_collection_modifyitems(config, items):
    """On the PostgreSQL store (``testkit.pg_store_mode``), the runs of a
    scenario against Apache Kafka alone (a ``server`` parameter "kafka") say
    nothing about the store: they are deselected (counted as such by pytest)."""
    if not pg_store_mode.enabled():
        return
    reference = [item for item in items
                 if getattr(getattr(item, "callspec", None), "params", {}).get("server")
                 == "kafka"]
    if reference:
        config.hook.pytest_deselected(items=reference)
        items[:] = [item for item in items if item not in reference]


def pytest_sessionfinish(session, exitstatus):
    pg_store_mode.stop()  # the run's PostgreSQL, if it started one
