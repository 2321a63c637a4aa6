"""Fetch answers whose record bytes are regions of the engine's files (issue 21,
section 3): sent with ``os.sendfile`` on plaintext listeners, read on TLS ones,
byte for byte the answer the same batches give as bytes.

Until the engine keeps record bytes in files nothing in it hands out a
``FileRegion``, so a fake log stands in for the partition's reads: each Fetch
gets the next slice of a file of random bytes, as a segment-file engine hands
it out (a batch's 61-byte header as bytes, then regions of the rest), or the
same slice as bytes, for the answer to compare with. The gateway does not look
inside the batches it serves, so they need not be valid ones. Every test runs
under the stdlib loop and under uvloop (deployed).
"""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import ssl
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import uvloop

from kafka_gateway.client import KafkaClient
from kafka_gateway.server import GatewayServer
from tablets.seam import FileRegion, ReadResult
from testkit import kafka_requests as kr
from testkit.certs import make_pki
from testkit.inprocess import port_of, running

TOPIC = "regions"
HEADER = 61  # a record batch's header: patched by the engine, so handed out as bytes
HIGH_WATERMARK = 1_000


def _run(loop: str, main: Callable[[], Awaitable[None]]) -> None:
    factory = uvloop.new_event_loop if loop == "uvloop" else asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main())


class FakeLog:
    """The partition's reads: the ``n``-th Fetch gets ``slices[n]`` of ``path``."""

    def __init__(self, path: Path, slices: list[int], regions: bool = True,
                 unlink: bool = False) -> None:
        self.path = path
        self.starts = [sum(slices[:i]) for i in range(len(slices))]
        self.slices = slices
        self.regions = regions
        self.unlink = unlink  # delete the file once the regions are handed out
        self.reads = 0

    def batches(self) -> list[bytes | FileRegion]:
        start, size = self.starts[self.reads], self.slices[self.reads]
        self.reads += 1
        half = (size - HEADER) // 2
        if not self.regions:
            data = self.path.read_bytes()[start : start + size]
            return [data[:HEADER], data[HEADER : HEADER + half], data[HEADER + half :]]
        with self.path.open("rb") as file:
            head = os.pread(file.fileno(), HEADER, start)
        file = self.path.open("rb")  # held by the regions: they keep it open
        if self.unlink:
            self.path.unlink()
        return [head, FileRegion(file, start + HEADER, half),
                FileRegion(file, start + HEADER + half, size - HEADER - half)]


class SendfileCalls:
    """``os.sendfile`` as the gateway calls it: calls, bytes, EAGAINs."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        self.sent = 0
        self.would_block = 0
        real = os.sendfile

        def counting(out_fd: int, in_fd: int, offset: int | None, count: int) -> int:
            self.calls += 1
            try:
                sent = real(out_fd, in_fd, offset, count)
            except BlockingIOError:
                self.would_block += 1
                raise
            self.sent += sent
            return sent

        monkeypatch.setattr(os, "sendfile", counting)


def _make_data(tmp_path: Path, size: int) -> Path:
    path = tmp_path / "segment.bin"
    path.write_bytes(os.urandom(size))
    return path


def _fake_reads(monkeypatch: pytest.MonkeyPatch, server: GatewayServer,
                log: FakeLog) -> None:
    topic = server.engine.find_topic(TOPIC)
    assert topic is not None
    tablet = topic.partitions[0]

    async def read(self: object, offset: int, max_bytes: int,
                   min_one: bool = True) -> ReadResult:
        return ReadResult(log.batches(), HIGH_WATERMARK, 0)

    monkeypatch.setattr(type(tablet), "read", read)


async def _create_topic(server: GatewayServer) -> None:
    client = await KafkaClient.connect("127.0.0.1", port_of(server, "PLAINTEXT"))
    try:
        answer = await client.request(kr.create_topics([(TOPIC, 1)]))
        assert answer.topics[0].error_code.value == 0, answer
    finally:
        await client.close()


async def _connect(port: int, context: ssl.SSLContext | None = None,
                   receive_buffer: int | None = None
                   ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if receive_buffer is not None:  # before connecting: it sets the window offered
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return await asyncio.open_connection(
        sock=sock, ssl=context, server_hostname="127.0.0.1" if context else None,
        limit=16 << 10)


def _fetch(correlation: int) -> bytes:
    return kr.request_frame(kr.fetch(TOPIC, [(0, 0, 1 << 30)], max_bytes=1 << 30),
                            correlation)


async def _answer(reader: asyncio.StreamReader, slow: bool = False) -> bytes:
    """One whole response frame; ``slow``: read in small pieces, with pauses."""
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    if not slow:
        return await reader.readexactly(size)
    out = bytearray()
    while len(out) < size:
        out += await reader.readexactly(min(256 << 10, size - len(out)))
        await asyncio.sleep(0.01)
    return bytes(out)


async def _answers(port: int, count: int, context: ssl.SSLContext | None = None,
                   slow: bool = False) -> list[bytes]:
    """``count`` Fetches pipelined on one connection; their answers in the order read."""
    reader, writer = await _connect(port, context, 8 << 10 if slow else None)
    try:
        writer.write(b"".join(_fetch(i + 1) for i in range(count)))
        await writer.drain()
        return [await asyncio.wait_for(_answer(reader, slow), 60) for _ in range(count)]
    finally:
        writer.close()


LOOPS = ["asyncio", "uvloop"]


@pytest.mark.parametrize("loop", LOOPS)
def test_plaintext_sends_regions_with_sendfile_byte_exact(tmp_path, monkeypatch, loop):
    slices = [300, 70_000, 5_000]
    path = _make_data(tmp_path, sum(slices))
    calls = SendfileCalls(monkeypatch)

    async def main() -> None:
        async with running(tmp_path) as server:
            await _create_topic(server)
            port = port_of(server, "PLAINTEXT")
            log = FakeLog(path, slices)
            _fake_reads(monkeypatch, server, log)
            with_regions = await _answers(port, 3)
            assert calls.calls >= 6 and calls.sent == sum(slices) - 3 * HEADER, vars(calls)
            sent_before = calls.sent
            log.regions, log.reads = False, 0  # the same slices again, as bytes
            as_bytes = await _answers(port, 3)
            assert calls.sent == sent_before  # bytes go through the transport
            assert log.reads == 3
            assert with_regions == as_bytes
            for i, frame in enumerate(with_regions):
                assert struct.unpack_from(">i", frame)[0] == i + 1
                start = sum(slices[:i])
                assert frame.endswith(path.read_bytes()[start : start + slices[i]] + b"\0\0\0")
            # Once an answer with regions is sent, its socket is uncorked again.
            log.regions, log.reads = True, 0
            reader, writer = await _connect(port)
            try:
                writer.write(_fetch(1))
                await writer.drain()
                assert await _answer(reader) == with_regions[0]
                host, client_port = writer.get_extra_info("sockname")
                [connection] = [c for c in server.connections
                                if c.peer == f"{host}:{client_port}"]
                assert connection.state.sendfile_socket is not None
                assert _corked(connection.state.sendfile_socket) == 0
            finally:
                writer.close()

    _run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_tls_reads_regions_and_answers_the_same_bytes(tmp_path, monkeypatch, loop):
    pki = make_pki(tmp_path / "pki")
    context = ssl.create_default_context(cafile=str(pki.ca))
    slices = [70_000, 300]
    path = _make_data(tmp_path, sum(slices))
    calls = SendfileCalls(monkeypatch)

    async def main() -> None:
        async with running(tmp_path, listeners="PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0",
                           ssl_keystore_location=str(pki.server)) as server:
            await _create_topic(server)
            log = FakeLog(path, slices)
            _fake_reads(monkeypatch, server, log)
            over_tls = await _answers(port_of(server, "SSL"), 2, context)
            assert calls.calls == 0  # TLS: no sendfile, the regions were read
            log.reads = 0
            plaintext = await _answers(port_of(server, "PLAINTEXT"), 2)
            assert calls.calls >= 4
            assert over_tls == plaintext

    _run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_slow_reader_large_regions_pipelined_in_order(tmp_path, monkeypatch, loop):
    """Regions far larger than the socket buffers, to a client reading slowly:
    sendfile meets EAGAIN and waits for the socket, never blocking the loop
    (another client is answered meanwhile); the answers arrive whole, in order."""
    slices = [6 << 20, 300, 5 << 20]
    path = _make_data(tmp_path, sum(slices))
    calls = SendfileCalls(monkeypatch)

    async def main() -> None:
        async with running(tmp_path) as server:
            await _create_topic(server)
            port = port_of(server, "PLAINTEXT")
            log = FakeLog(path, slices)
            _fake_reads(monkeypatch, server, log)
            slow = asyncio.create_task(_answers(port, 3, slow=True))
            while not calls.would_block and not slow.done():
                await asyncio.sleep(0.01)
            # The loop is free while a region waits for the slow client.
            other = await KafkaClient.connect("127.0.0.1", port)
            try:
                await asyncio.wait_for(other.request(kr.metadata([])), 10)
            finally:
                await other.close()
            answers = await slow
            assert calls.would_block >= 1, vars(calls)
            log.regions, log.reads = False, 0
            assert answers == await _answers(port, 3)

    _run(loop, main)


def _corked(sock: object) -> int:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CORK)  # type: ignore[attr-defined]


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("loop", LOOPS)
def test_client_gone_mid_sendfile(tmp_path, monkeypatch, loop):
    """A client that disconnects while a large region is being sent: the send
    stops quietly (no refused write counted), the connection's memory and
    descriptors are let go, and the gateway serves the next client."""
    slices = [16 << 20, 300]
    path = _make_data(tmp_path, sum(slices))
    calls = SendfileCalls(monkeypatch)

    async def main() -> None:
        async with running(tmp_path) as server:
            await _create_topic(server)
            port = port_of(server, "PLAINTEXT")
            log = FakeLog(path, slices)
            _fake_reads(monkeypatch, server, log)
            descriptors = _open_descriptors()
            failures = server.broker.metrics.response_write_failures
            reader, writer = await _connect(port, receive_buffer=8 << 10)
            writer.write(_fetch(1))
            await writer.drain()
            await reader.readexactly(64 << 10)
            for _ in range(500):  # until the region waits for the socket
                if calls.would_block:
                    break
                await asyncio.sleep(0.01)
            assert calls.would_block, vars(calls)
            assert calls.sent < slices[0] - HEADER
            # Backpressure meanwhile: no new request is taken while the region waits.
            [connection] = server.connections
            assert connection.state.sendfile_waiting and connection.state.reading_paused
            assert connection.answers.sending is not None
            assert _corked(connection.state.sendfile_socket) == 1  # until its last byte
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()  # RST: gone, unread bytes and all
            for _ in range(500):
                if not server.connections:
                    break
                await asyncio.sleep(0.01)
            assert not server.connections
            assert server.broker.metrics.response_write_failures == failures
            for _ in range(100):  # the frames' buffers are freed once collected
                gc.collect()
                if server.limits.memory.used == 0 and _open_descriptors() <= descriptors:
                    break
                await asyncio.sleep(0.01)
            assert server.limits.memory.used == 0
            assert _open_descriptors() <= descriptors  # the watched dup is closed
            log.regions = False
            log.reads = 1
            [answer] = await _answers(port, 1)
            assert answer.endswith(path.read_bytes()[slices[0]:] + b"\0\0\0")

    _run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_file_deleted_after_regions_handed_out(tmp_path, monkeypatch, loop):
    slices = [200_000]
    path = _make_data(tmp_path, sum(slices))
    expected = path.read_bytes()
    calls = SendfileCalls(monkeypatch)

    async def main() -> None:
        async with running(tmp_path) as server:
            await _create_topic(server)
            log = FakeLog(path, slices, unlink=True)
            _fake_reads(monkeypatch, server, log)
            [answer] = await _answers(port_of(server, "PLAINTEXT"), 1)
            assert not path.exists()  # the premise: deleted before it was sent
            assert calls.sent == slices[0] - HEADER
            assert answer.endswith(expected + b"\0\0\0")

    _run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_region_past_its_files_end_closes_the_connection(tmp_path, monkeypatch, loop):
    """A region the file no longer holds (an engine breaking the contract) cannot
    be answered: the frame's length is already sent. The connection closes, the
    failure is counted, and other connections go on."""
    slices = [100_000]
    path = _make_data(tmp_path, sum(slices))
    calls = SendfileCalls(monkeypatch)

    async def main() -> None:
        async with running(tmp_path) as server:
            await _create_topic(server)
            port = port_of(server, "PLAINTEXT")
            log = FakeLog(path, slices)
            _fake_reads(monkeypatch, server, log)
            os.truncate(path, slices[0] // 2)
            failures = server.broker.metrics.response_write_failures
            reader, writer = await _connect(port)
            writer.write(_fetch(1))
            await writer.drain()
            data = await asyncio.wait_for(reader.read(1 << 30), 10)
            while data:
                data = await asyncio.wait_for(reader.read(1 << 30), 10)
            writer.close()
            assert calls.calls >= 1
            assert server.broker.metrics.response_write_failures == failures + 1
            other = await KafkaClient.connect("127.0.0.1", port)
            try:
                await asyncio.wait_for(other.request(kr.metadata([])), 10)
            finally:
                await other.close()

    _run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_client_that_stops_reading_mid_sendfile_expires_idle(tmp_path, monkeypatch, loop):
    """A region waiting on a client that reads nothing more is no activity:
    ``connections.max.idle.ms`` closes the connection, as when the transport's
    own buffer is full."""
    slices = [16 << 20]
    path = _make_data(tmp_path, sum(slices))
    calls = SendfileCalls(monkeypatch)

    async def main() -> None:
        async with running(tmp_path, connections_max_idle_ms=500) as server:
            await _create_topic(server)
            log = FakeLog(path, slices)
            _fake_reads(monkeypatch, server, log)
            expired = server.broker.metrics.connections_expired
            _reader, writer = await _connect(port_of(server, "PLAINTEXT"),
                                             receive_buffer=8 << 10)
            try:
                writer.write(_fetch(1))
                await writer.drain()
                for _ in range(1000):
                    if server.broker.metrics.connections_expired > expired:
                        break
                    await asyncio.sleep(0.01)
                assert calls.would_block, vars(calls)  # it was waiting on the socket
                assert server.broker.metrics.connections_expired == expired + 1
                for _ in range(500):
                    if not server.connections:
                        break
                    await asyncio.sleep(0.01)
                assert not server.connections
            finally:
                writer.close()

    _run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_shutdown_finishes_a_region_being_sent(tmp_path, monkeypatch, loop):
    """Stopping the gateway lets an answer whose region waits for a slow client
    finish (within the shutdown grace), as it lets a buffered answer flush."""
    slices = [6 << 20]
    path = _make_data(tmp_path, sum(slices))
    calls = SendfileCalls(monkeypatch)

    async def main() -> None:
        async with running(tmp_path) as server:
            await _create_topic(server)
            log = FakeLog(path, slices)
            _fake_reads(monkeypatch, server, log)
            slow = asyncio.create_task(_answers(port_of(server, "PLAINTEXT"), 1, slow=True))
            for _ in range(500):
                if calls.would_block or slow.done():
                    break
                await asyncio.sleep(0.01)
            assert calls.would_block and not slow.done(), vars(calls)
        # Stopped: the answer was still being sent when the stop began.
        [answer] = await slow
        assert answer.endswith(path.read_bytes() + b"\0\0\0")
        assert calls.sent == slices[0] - HEADER

    _run(loop, main)
