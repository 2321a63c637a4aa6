"""No request stalls the other clients, whatever the size of its arrays (issue 19).

Each API whose cost grows with its arrays is sent at its largest legal size
(``gateway.request.max.array.items`` items, the default) while a canary on
another connection sends ApiVersions in a loop: every canary answer comes
within ``CANARY_BOUND`` seconds, and the gateway's memory grows by a bounded
amount. One item more closes the connection, as a frame over
``socket.request.max.bytes`` does, with a log line.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import threading
import time

from kio.schema.errors import ErrorCode

from kafka_gateway.codec import entity_reader_for, response_schema, skip_tagged_fields
from kafka_gateway.settings import GatewayConfig
from testkit import kafka_requests as kr
from testkit.gateway import GatewayProcess
from testkit.kafka_requests import request_frame

CAP = int(os.environ.get("PROBE_CAP", 0)) or GatewayConfig().request_max_array_items
CANARY_BOUND = 0.25  # seconds, for one ApiVersions round trip
RSS_GROWTH_BOUND_MIB = 250  # peak over the RSS before; measured about 120
TIMEOUT = 120.0
API_VERSIONS_V0 = struct.pack(">ihhih", 14, 18, 0, 7, 4) + b"test"  # correlation 7




def read_frame(sock: socket.socket) -> bytes:
    def exactly(n: int) -> bytes:
        parts, left = [], n
        while left:
            part = sock.recv(min(left, 1 << 20))
            if not part:
                raise ConnectionError("closed")
            parts.append(part)
            left -= len(part)
        return b"".join(parts)
    (size,) = struct.unpack(">i", exactly(4))
    return exactly(size)


class Canary(threading.Thread):
    """ApiVersions in a loop on its own connection; (sent at, latency) of each."""

    def __init__(self, address: tuple[str, int]) -> None:
        super().__init__(daemon=True)
        self.sock = socket.create_connection(address, timeout=TIMEOUT)
        self.samples: list[tuple[float, float]] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                start = time.monotonic()
                self.sock.sendall(API_VERSIONS_V0)
                answer = read_frame(self.sock)
                assert answer[:6] == b"\x00\x00\x00\x07\x00\x00", answer[:6]
                self.samples.append((start, time.monotonic() - start))
                time.sleep(0.005)
        except BaseException as exc:
            self.error = exc

    def worst(self, since: float, until: float) -> tuple[float, int]:
        window = [lat for at, lat in self.samples if since <= at <= until]
        return max(window, default=float("inf")), len(window)


def decode(body: object, frame: bytes) -> object:
    cls = type(body)
    schema = response_schema(cls.__api_key__, cls.__version__)  # type: ignore[attr-defined]
    name = cls.__name__.replace("Request", "Response")
    response_cls = getattr(schema, name)
    pos = 4
    if response_cls.__flexible__:
        pos = skip_tagged_fields(frame, pos)
    return entity_reader_for(response_cls)(frame, pos)[0]


def big_requests() -> list[tuple[str, object, object]]:
    """(name, request with CAP array items, check of its answer)."""
    n = CAP - 1  # one topic and n partitions, or n resources and one spare
    parts = range(1000, 1000 + n)  # partitions topic "t" does not have

    def all_partitions(code: ErrorCode, topics: str, partitions: str, field: str = "error_code"):
        def check(answer: object) -> None:
            got = [getattr(p, field) for t in getattr(answer, topics)
                   for p in getattr(t, partitions)]
            assert len(got) == n and set(got) == {code}, (len(got), set(got))
        return check

    def per_item(items: str, code: ErrorCode, count: int, field: str = "error_code"):
        def check(answer: object) -> None:
            got = [getattr(x, field) for x in getattr(answer, items)]
            assert len(got) == count and set(got) == {code}, (len(got), set(got))
        return check

    unknown = ErrorCode.unknown_topic_or_partition
    return [
        ("AddPartitionsToTxn", kr.add_partitions_to_txn("tid", 0, 0, [("nope", range(n))]),
         all_partitions(unknown, "results_by_topic_v3_and_below", "results_by_partition",
                        "partition_error_code")),
        ("TxnOffsetCommit", kr.txn_offset_commit("tid", 0, 0, "g", "t",
                                                 [(p, 1, "") for p in parts]),
         all_partitions(unknown, "topics", "partitions")),
        ("OffsetCommit", kr.offset_commit("g", -1, "", "t", [(p, 1) for p in parts]),
         all_partitions(unknown, "topics", "partitions")),
        ("Fetch", kr.fetch("t", [(p, 0, 1024) for p in parts], version=12),
         all_partitions(unknown, "responses", "partitions")),
        ("ListOffsets", kr.list_offsets("t", [(p, -1) for p in parts]),
         all_partitions(unknown, "topics", "partitions")),
        ("DeleteRecords", kr.delete_records("t", [(p, 0) for p in parts]),
         all_partitions(unknown, "topics", "partitions")),
        ("CreateTopics", kr.create_topics([(f"new-{i}", 1) for i in range(CAP)],
                                          validate_only=True),
         per_item("topics", ErrorCode.none, CAP)),
        ("CreatePartitions", kr.create_partitions([(f"none-{i}", 2) for i in range(CAP)]),
         per_item("results", unknown, CAP)),
        ("DescribeConfigs", kr.describe_configs([(kr.TOPIC, f"none-{i}", None)
                                                 for i in range(CAP)]),
         per_item("results", unknown, CAP)),
        ("CreateAcls", kr.create_acls([(f"acl-{i}", "User:big") for i in range(CAP)]),
         per_item("results", ErrorCode.none, CAP)),
        ("DescribeAcls", kr.describe_acls(), lambda answer: (
            (answer.error_code is ErrorCode.none and len(answer.resources) >= CAP)
            or _fail(f"{answer.error_code} {len(answer.resources)}"))),
        ("DeleteAcls", kr.delete_acls([(f"acl-{i}", "User:big") for i in range(CAP)]),
         per_item("filter_results", ErrorCode.none, CAP)),
        # The other APIs with arrays, at the same size.
        ("Produce", kr.produce([("t", p, None) for p in parts]),
         all_partitions(unknown, "responses", "partition_responses")),
        ("OffsetFetch", kr.offset_fetch("g", "t", range(1000, 1000 + n - 1)),
         lambda answer: _offset_fetch_check(answer, n - 1)),
        ("DeleteTopics", kr.delete_topics([f"none-{i}" for i in range(CAP)]),
         per_item("responses", unknown, CAP)),
        ("Metadata", kr.metadata([f"none-{i}" for i in range(CAP)]),
         per_item("topics", unknown, CAP)),
        ("OffsetForLeaderEpoch", kr.offset_for_leader_epoch("t", [(p, -1, 0) for p in parts]),
         all_partitions(unknown, "topics", "partitions")),
        ("IncrementalAlterConfigs", kr.incremental_alter_configs(
            [(kr.TOPIC, f"none-{i}", []) for i in range(CAP)]),
         per_item("responses", unknown, CAP)),
        ("AlterConfigs", kr.alter_configs([(kr.TOPIC, f"none-{i}", {}) for i in range(CAP)]),
         per_item("responses", unknown, CAP)),
        ("DescribeGroups", kr.describe_groups([f"g-{i}" for i in range(CAP)]),
         per_item("groups", ErrorCode.none, CAP)),
    ]


def _offset_fetch_check(answer: object, count: int) -> None:
    [group] = answer.groups  # type: ignore[attr-defined]
    got = [(p.error_code, p.committed_offset) for t in group.topics for p in t.partitions]
    assert len(got) == count and set(got) == {(ErrorCode.none, -1)}, (len(got), set(got))


def _fail(message: str) -> None:
    raise AssertionError(message)


def test_largest_requests_do_not_stall_other_clients(tmp_path):
    with GatewayProcess(tmp_path / "data", "--authorizer-class-name", "acl",
                        "--allow-everyone-if-no-acl-found", "true") as gateway:
        address = gateway.host_port
        with socket.create_connection(address, timeout=TIMEOUT) as setup:
            setup.sendall(request_frame(kr.create_topics([("t", 4)]), 1))
            assert decode(kr.create_topics([]), read_frame(setup)).topics[0].error_code is (
                ErrorCode.none)
        requests = big_requests()
        frames = [request_frame(body, 100 + i) for i, (_n, body, _c) in enumerate(requests)]
        rss_before = gateway.memory_kib("VmRSS")
        canary = Canary(address)
        canary.start()
        # name -> (worst canary, canaries, request seconds) of each attempt. A
        # request is sent again (all of them are idempotent) only if a canary was
        # late: a stall of ours happens again, the other tenants' of this shared
        # machine do not; the second attempt must meet the bound.
        attempts: dict[str, list[tuple[float, int, float]]] = {}
        try:
            with socket.create_connection(address, timeout=TIMEOUT) as sock:
                for i, ((name, body, check), frame) in enumerate(
                        zip(requests, frames, strict=True)):
                    runs = attempts[name] = []
                    while len(runs) < 2 and (not runs or runs[-1][0] > CANARY_BOUND):
                        time.sleep(0.05)
                        start = time.monotonic()
                        sock.sendall(frame)
                        answer = read_frame(sock)
                        took = time.monotonic() - start
                        time.sleep(0.05)
                        latency, samples = canary.worst(start, time.monotonic())
                        runs.append((latency, samples, took))
                        assert struct.unpack_from(">i", answer)[0] == 100 + i, name
                        check(decode(body, answer))
        finally:
            canary.stop.set()
            canary.join(TIMEOUT)
        assert canary.error is None, canary.error
        report = ", ".join(
            f"{name}: " + " then ".join(f"worst {lat * 1000:.0f} ms of {count} canaries "
                                        f"(request {took:.2f} s)" for lat, count, took in runs)
            for name, runs in attempts.items())
        print(report)
        assert all(runs[-1][1] >= 3 and runs[-1][0] <= CANARY_BOUND
                   for runs in attempts.values()), report
        rss_after = gateway.memory_kib("VmRSS")
        peak = gateway.memory_kib("VmHWM")
        growth_mib, peak_mib = (rss_after - rss_before) / 1024, (peak - rss_before) / 1024
        print(f"RSS before {rss_before / 1024:.0f} MiB, after {rss_after / 1024:.0f} MiB, "
              f"peak {peak / 1024:.0f} MiB")
        assert peak_mib <= RSS_GROWTH_BOUND_MIB, (growth_mib, peak_mib)


def test_one_item_past_the_cap_closes_the_connection_with_a_log_line(tmp_path):
    with GatewayProcess(tmp_path / "data") as gateway:
        body = kr.add_partitions_to_txn("tid", 0, 0, [("nope", range(CAP))])  # CAP + 1 items
        with socket.create_connection(gateway.host_port, timeout=TIMEOUT) as sock:
            sock.sendall(request_frame(body, 1))
            assert sock.recv(1) == b""
        deadline = time.monotonic() + TIMEOUT
        while "gateway.request.max.array.items" not in gateway.output():
            assert time.monotonic() < deadline, gateway.output()[-2000:]
            time.sleep(0.05)
        # The node still serves.
        with socket.create_connection(gateway.host_port, timeout=TIMEOUT) as sock:
            sock.sendall(API_VERSIONS_V0)
            assert read_frame(sock)[:4] == b"\x00\x00\x00\x07"


def test_a_produce_appending_in_slices_keeps_its_connections_order(tmp_path):
    """A Produce of CAP - 2 partitions appends in slices; the small Produce sent
    right after it on the same connection still appends after it."""
    from testkit.batches import make_batch
    from testkit.inprocess import running

    async def main() -> None:
        async with running(tmp_path) as server:
            host, port = server.config.listen
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(request_frame(kr.create_topics([("t", 1)]), 1))
            await read_async(reader)
            first, second = make_batch([b"first"]), make_batch([b"second"])
            big = kr.produce([*(("t", p, None) for p in range(1, CAP - 2)), ("t", 0, first)])
            writer.write(request_frame(big, 2) + request_frame(kr.produce([("t", 0, second)]), 3))
            answers = [decode(kr.produce([]), await read_async(reader)) for _ in range(2)]
            [[*_unknown, big_part]] = [t.partition_responses for t in answers[0].responses]
            [[small_part]] = [t.partition_responses for t in answers[1].responses]
            assert (big_part.index, big_part.error_code) == (0, ErrorCode.none)
            assert small_part.error_code is ErrorCode.none
            assert big_part.base_offset < small_part.base_offset, (big_part, small_part)
            writer.close()

    asyncio.run(main())


async def read_async(reader: asyncio.StreamReader) -> bytes:
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    return await reader.readexactly(size)
