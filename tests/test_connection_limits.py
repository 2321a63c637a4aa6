"""Memory per connection and per node is bounded; idle and stalled connections close;
bad input is logged at a bounded rate. Against a live gateway, over raw sockets.

Every wait has a generous deadline; nothing asserts how fast the gateway is.
"""

from __future__ import annotations

import asyncio
import datetime
import re
import selectors
import socket
import struct
import time
import urllib.request

from confluent_kafka import Consumer, Producer
from kio.schema.fetch.v12 import request as fetch
from kio.static.primitive import i32Timedelta

from kafka_gateway.bad_input import BAD_INPUT_LINES_PER_WINDOW
from kafka_gateway.client import KafkaClient
from kafka_gateway.codec import ChunkWriter, entity_writer_for
from testkit.batches import make_batch
from testkit.gateway import GatewayProcess

TIMEOUT = 30
MiB = 1 << 20
UNKNOWN_TOPIC_OR_PARTITION = 3


# ------------------------------------------------------------------ helpers
def frame(api_key: int, version: int, correlation: int, body: bytes) -> bytes:
    request = struct.pack(">hhih", api_key, version, correlation, 4) + b"test" + body
    return struct.pack(">i", len(request)) + request


def api_versions_frame(correlation: int = 1) -> bytes:
    return frame(18, 0, correlation, b"")


def produce_frame(topic: bytes, records: bytes, correlation: int) -> bytes:
    """Produce v3, acks=1, one partition."""
    body = struct.pack(">hhi", -1, 1, 10_000) + struct.pack(">ih", 1, len(topic)) + topic
    body += struct.pack(">iii", 1, 0, len(records)) + records
    return frame(0, 3, correlation, body)


def read_exactly(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        assert chunk, "connection closed"
        out += chunk
    return bytes(out)


def read_frame(sock: socket.socket) -> bytes:
    (size,) = struct.unpack(">i", read_exactly(sock, 4))
    return read_exactly(sock, size)


def answered(gateway: GatewayProcess, correlation: int = 5) -> bool:
    """A new connection gets its ApiVersions answered."""
    with socket.create_connection(gateway.host_port, timeout=TIMEOUT) as sock:
        sock.sendall(api_versions_frame(correlation))
        response = read_frame(sock)
    return struct.unpack_from(">ih", response) == (correlation, 0)


def closed_by_peer(sock: socket.socket, within: float = TIMEOUT) -> bool:
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False




def metrics(gateway: GatewayProcess) -> dict[str, float]:
    admin = re.search(r"admin http ([\d.]+:\d+)", gateway.output()).group(1)
    with urllib.request.urlopen(f"http://{admin}/metrics", timeout=TIMEOUT) as response:
        text = response.read().decode()
    return {name: float(value) for name, value in
            (line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))}


def wait_for(predicate, what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def canary(gateway: GatewayProcess, topic: str) -> None:
    """A stock producer and consumer still work."""
    producer = Producer({"bootstrap.servers": gateway.bootstrap, "acks": "all"})
    errors = []
    for i in range(10):
        producer.produce(topic, b"v%d" % i, on_delivery=lambda err, _msg: errors.append(err))
    assert producer.flush(TIMEOUT) == 0 and errors == [None] * 10
    consumer = Consumer({"bootstrap.servers": gateway.bootstrap, "group.id": f"{topic}-g",
                         "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([topic])
        values: list[bytes] = []
        deadline = time.monotonic() + TIMEOUT
        while len(values) < 10 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value())
        assert values == [b"v%d" % i for i in range(10)]
    finally:
        consumer.close()


# -------------------------------------------------------------- per connection
def test_a_length_prefix_alone_reserves_no_memory(tmp_path):
    """20 connections declaring 100 MiB frames and sending 1 byte: RSS stays flat.

    Before, each one made the gateway allocate the declared 100 MiB (2 GB in all).
    """
    with GatewayProcess(tmp_path / "data", "--admin-listen", "127.0.0.1:0") as gateway:
        assert answered(gateway)
        before = gateway.memory_kib("VmRSS")
        attackers = []
        for _ in range(20):
            sock = socket.create_connection(gateway.host_port, timeout=TIMEOUT)
            sock.sendall(bytes.fromhex("06400000") + b"\x00")
            attackers.append(sock)
        # Once every connection's byte is read, each holds its first small buffer.
        sent = 20 * 5 + len(api_versions_frame())
        wait_for(lambda: metrics(gateway)["kafka_gateway_bytes_in_total"] >= sent,
                 "the attackers' bytes to be read")
        assert answered(gateway)
        canary(gateway, "after-prefix")
        grown = gateway.memory_kib("VmRSS") - before
        assert grown < 32 * 1024, f"RSS grew by {grown} KiB"
        assert metrics(gateway)["kafka_gateway_request_memory_bytes"] <= 20 * 16 * 1024
        for sock in attackers:
            sock.close()


def test_an_idle_connection_holds_no_read_buffer(tmp_path):
    """300 connections that sent a request and went quiet: a few KiB each, not 256 KiB."""
    with GatewayProcess(tmp_path / "data", "--admin-listen", "127.0.0.1:0") as gateway:
        assert answered(gateway)
        before = gateway.memory_kib("VmRSS")
        clients = []
        for i in range(300):
            sock = socket.create_connection(gateway.host_port, timeout=TIMEOUT)
            sock.sendall(api_versions_frame(i))
            clients.append(sock)
        for i, sock in enumerate(clients):
            assert struct.unpack_from(">i", read_frame(sock))[0] == i
        grown = gateway.memory_kib("VmRSS") - before
        assert grown < 24 * 1024, f"RSS grew by {grown} KiB"
        assert metrics(gateway)["kafka_gateway_request_memory_bytes"] == 0
        for sock in clients:
            sock.close()


# -------------------------------------------------------------------- per node
def _send_until_stuck(pending: dict[socket.socket, memoryview], quiet: float) -> None:
    """Send what the sockets take, until none has taken anything for ``quiet`` s."""
    selector = selectors.DefaultSelector()
    for sock in pending:
        selector.register(sock, selectors.EVENT_WRITE)
    try:
        last_progress = time.monotonic()
        while any(pending.values()) and time.monotonic() - last_progress < quiet:
            for key, _events in selector.select(timeout=0.05):
                data = pending[key.fileobj]
                if data:
                    try:
                        sent = key.fileobj.send(data)
                    except BlockingIOError:
                        continue
                    pending[key.fileobj] = data[sent:]
                    last_progress = time.monotonic()
    finally:
        selector.close()


def test_the_node_budget_bounds_frames_in_flight_and_serves_larger_ones(tmp_path):
    """30 connections push 3 MiB frames through a 2 MiB queued.max.request.bytes.

    Each frame is larger than the whole budget, and each connection first holds
    its frame but for the last byte: what is charged stays within the budget
    plus one frame, the peak RSS grows by far less than the 90 MiB sent, and
    once the last bytes go out every frame is answered - no half-received frames
    waiting on each other forever.
    """
    budget, connections = 2 * MiB, 30
    records = make_batch([b"x" * (3 * MiB)])
    with GatewayProcess(tmp_path / "data", "--admin-listen", "127.0.0.1:0",
                        "--auto-create-topics-enable", "false",
                        "--queued-max-request-bytes", str(budget)) as gateway:
        assert answered(gateway)
        peak_before = gateway.memory_kib("VmHWM")
        socks = [socket.create_connection(gateway.host_port, timeout=TIMEOUT)
                 for _ in range(connections)]
        frames = {sock: produce_frame(b"absent", records, i) for i, sock in enumerate(socks)}
        for sock in socks:
            sock.setblocking(False)
        # Everything but each frame's last byte.
        pending = {sock: memoryview(data)[:-1] for sock, data in frames.items()}
        _send_until_stuck(pending, quiet=1.0)
        charged = metrics(gateway)["kafka_gateway_request_memory_bytes"]
        one_frame = len(next(iter(frames.values())))
        assert charged <= budget + one_frame + connections * 16 * 1024, charged
        # Now the rest, last bytes included: the gateway must take it all.
        pending = {sock: memoryview(data)[len(data) - 1 - len(pending[sock]):]
                   for sock, data in frames.items()}
        _send_until_stuck(pending, quiet=TIMEOUT)
        assert not any(pending.values()), "the gateway stopped reading"
        for i, sock in enumerate(socks):
            sock.setblocking(True)
            sock.settimeout(TIMEOUT)
            response = read_frame(sock)
            assert struct.unpack_from(">i", response)[0] == i
            # v3: correlation, topics[1], name, partitions[1], index, error code
            code = struct.unpack_from(">h", response, 4 + 4 + 2 + 6 + 4 + 4)[0]
            assert code == UNKNOWN_TOPIC_OR_PARTITION
            sock.close()
        peak_growth = gateway.memory_kib("VmHWM") - peak_before
        assert peak_growth < 48 * 1024, f"peak RSS grew by {peak_growth} KiB for 90 MiB sent"
        # What is still charged is garbage of the error path awaiting the collector;
        # it is charged until then, and bounded like everything else.
        charged = metrics(gateway)["kafka_gateway_request_memory_bytes"]
        assert charged <= budget + one_frame + connections * 16 * 1024, charged
        assert answered(gateway)


# --------------------------------------------------------------------- timeouts
def _long_poll(topic: str, offset: int, wait_ms: int,
               max_bytes: int = 1 << 20) -> fetch.FetchRequest:
    return fetch.FetchRequest(
        cluster_id=None, replica_id=-1,
        max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=wait_ms)),
        min_bytes=1, max_bytes=max_bytes, isolation_level=0, session_id=0, session_epoch=-1,
        topics=(fetch.FetchTopic(topic=topic, partitions=(fetch.FetchPartition(
            partition=0, current_leader_epoch=-1, fetch_offset=offset, last_fetched_epoch=-1,
            log_start_offset=-1, partition_max_bytes=max_bytes),)),),
        forgotten_topics_data=(), rack_id="")


def kio_frame(body: fetch.FetchRequest, correlation: int) -> bytes:
    """A request frame for a kio request entity (flexible header: client id, no tags)."""
    cls = type(body)
    out = ChunkWriter()
    out.write(struct.pack(">hhih", cls.__api_key__, cls.__version__, correlation, 4) + b"test")
    out.write(b"\x00")
    entity_writer_for(cls)(out, body)
    return struct.pack(">i", out.size) + b"".join(out.chunks)


def test_idle_connections_close_but_a_parked_fetch_is_not_idle(tmp_path):
    with GatewayProcess(tmp_path / "data", "--admin-listen", "127.0.0.1:0",
                        "--connections-max-idle-ms", "1000") as gateway:
        silent = socket.create_connection(gateway.host_port)
        assert closed_by_peer(silent)
        silent.close()

        # Requests every 0.2 s keep a connection open well past the idle time.
        with socket.create_connection(gateway.host_port, timeout=TIMEOUT) as busy:
            for i in range(15):
                busy.sendall(api_versions_frame(i))
                assert struct.unpack_from(">i", read_frame(busy))[0] == i
                time.sleep(0.2)

        producer = Producer({"bootstrap.servers": gateway.bootstrap})
        producer.produce("polled", b"one")
        assert producer.flush(TIMEOUT) == 0

        async def parked_fetch() -> float:
            client = await KafkaClient.connect(*gateway.host_port)
            try:
                started = time.monotonic()
                # Waits 4 s for data that never comes: 4x the idle time.
                response = await asyncio.wait_for(
                    client.request(_long_poll("polled", 1, 4000)), TIMEOUT)
                waited = time.monotonic() - started
                [topic] = response.responses
                [partition] = topic.partitions
                assert partition.error_code == 0 and partition.high_watermark == 1
                # Answered, then idle: closed (the client's stream reads its end).
                assert await asyncio.wait_for(client._reader.read(1), TIMEOUT) == b""
                return waited
            finally:
                await client.close()

        waited = asyncio.run(parked_fetch())
        assert waited >= 3.5  # the fetch waited its max wait, the connection stayed
        assert metrics(gateway)["kafka_gateway_connections_expired_total"] >= 2


def test_a_client_that_stops_reading_its_answers_is_idle(tmp_path):
    """Fetches wait behind answers the client never reads: not answered, and idle."""
    with GatewayProcess(tmp_path / "data", "--admin-listen", "127.0.0.1:0",
                        "--connections-max-idle-ms", "2000") as gateway:
        batch = make_batch([b"x" * 1024] * 900)  # under max.message.bytes
        with socket.create_connection(gateway.host_port, timeout=TIMEOUT) as setup:
            setup.sendall(frame(3, 1, 0, struct.pack(">ih", 1, 6) + b"unread"))  # creates it
            read_frame(setup)
            for i in range(5):
                setup.sendall(produce_frame(b"unread", batch, i))
                assert struct.unpack_from(">h", read_frame(setup), 24)[0] == 0
        expired = metrics(gateway)["kafka_gateway_connections_expired_total"]
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        sock.settimeout(TIMEOUT)
        sock.connect(gateway.host_port)
        fetches = 30  # 4 MiB answers each: far more than the socket buffers hold
        sock.sendall(b"".join(kio_frame(_long_poll("unread", 0, 0, 4 << 20), i)
                              for i in range(fetches)))
        wait_for(lambda: metrics(gateway)["kafka_gateway_connections_expired_total"] > expired,
                 "the connection to expire")
        # One Fetch at a time, each once the client read the last answer: what
        # the kernel took and one more answer were written, not 30.
        written = metrics(gateway)["kafka_gateway_bytes_out_total"]
        assert written < 4 * (4 << 20), written
        received = 0
        try:
            while chunk := sock.recv(1 << 20):
                received += len(chunk)
        except ConnectionResetError:
            pass
        sock.close()
        assert received < fetches * (4 << 20), received


def test_a_half_received_frame_times_out_but_a_slow_one_does_not(tmp_path):
    with GatewayProcess(tmp_path / "data", "--admin-listen", "127.0.0.1:0",
                        "--partial-request-timeout-ms", "2000") as gateway:
        stalled = socket.create_connection(gateway.host_port)
        stalled.sendall(api_versions_frame()[:7])
        assert closed_by_peer(stalled)
        stalled.close()
        # The line is read from the gateway's output by a thread: give it a moment.
        deadline = time.monotonic() + TIMEOUT
        while ("no byte of a partial request for 2 s" not in gateway.output()
               and time.monotonic() < deadline):
            time.sleep(0.05)
        assert "no byte of a partial request for 2 s" in gateway.output()

        # A connection that sends nothing is idle, not stalled.
        with socket.create_connection(gateway.host_port, timeout=TIMEOUT) as quiet:
            time.sleep(3)
            quiet.sendall(api_versions_frame(9))
            assert struct.unpack_from(">i", read_frame(quiet))[0] == 9

        # One byte every 0.2 s: slow, but never 2 s without progress.
        with socket.create_connection(gateway.host_port, timeout=TIMEOUT) as slow:
            request = api_versions_frame(11)
            for i in range(len(request)):
                slow.sendall(request[i : i + 1])
                time.sleep(0.2)
            assert struct.unpack_from(">i", read_frame(slow))[0] == 11

        values = metrics(gateway)
        assert values["kafka_gateway_connections_expired_total"] == 1
        assert values["kafka_gateway_request_memory_bytes"] == 0


# ---------------------------------------------------------------------- logging
def test_bad_input_logging_is_rate_limited_per_address(tmp_path):
    """200 bad frames from one address: a few warning lines, the rest counted."""
    sent = 200
    with GatewayProcess(tmp_path / "data", "--admin-listen", "127.0.0.1:0") as gateway:
        for i in range(sent):
            with socket.create_connection(gateway.host_port, timeout=TIMEOUT) as sock:
                sock.sendall(frame(9999, 0, i, b""))  # no such API: closed
                assert closed_by_peer(sock)
        values = metrics(gateway)
        assert answered(gateway)
    logged = sum("closing connection from 127.0.0.1" in line
                 for line in gateway.output().splitlines())
    suppressed = values["kafka_gateway_log_lines_suppressed_total"]
    assert values["kafka_gateway_bad_frames_total"] == sent
    assert logged + suppressed == sent
    # One window, or two if the run straddled a window's end.
    assert BAD_INPUT_LINES_PER_WINDOW <= logged <= 2 * BAD_INPUT_LINES_PER_WINDOW
