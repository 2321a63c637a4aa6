"""Produce v0-2: advertised (as by Kafka 3.4) and answered, with the right layouts.

librdkafka before 2.11.1 compresses with gzip, snappy or lz4 only for a broker
that advertises Produce v0; kio has no schemas for v0-2, so the gateway reads
them as v3 and encodes their answers itself.
"""

from __future__ import annotations

import socket
import struct

import pytest

from testkit.batches import make_batch
from testkit.gateway import GatewayProcess

TOPIC = b"legacy"


def _request(sock: socket.socket, api_key: int, version: int, body: bytes) -> bytes:
    header = struct.pack(">hhih", api_key, version, 7, 4) + b"test"
    frame = header + body
    sock.sendall(struct.pack(">i", len(frame)) + frame)
    (size,) = struct.unpack(">i", _read(sock, 4))
    response = _read(sock, size)
    assert struct.unpack_from(">i", response)[0] == 7  # correlation id
    return response[4:]


def _read(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        assert chunk, "connection closed"
        out += chunk
    return out


def _produce(sock: socket.socket, version: int, records: bytes) -> tuple[int, int, bytes]:
    """One partition's (error code, base offset) and the rest of the body."""
    body = struct.pack(">hii", -1, 10_000, 1) + struct.pack(">h", len(TOPIC)) + TOPIC
    body += struct.pack(">iii", 1, 0, len(records)) + records
    response = _request(sock, 0, version, body)
    topics, name_len = struct.unpack_from(">ih", response)
    assert topics == 1 and response[6:6 + name_len] == TOPIC
    pos = 6 + name_len
    partitions, index, code, base = struct.unpack_from(">iihq", response, pos)
    assert (partitions, index) == (1, 0)
    return code, base, response[pos + 18:]


@pytest.fixture(scope="module")
def sock(tmp_path_factory):
    with GatewayProcess(tmp_path_factory.mktemp("gw") / "data") as gw, \
            socket.create_connection(gw.host_port, timeout=30) as conn:
        # Metadata v1 names the topic, which auto-creates it.
        _request(conn, 3, 1, struct.pack(">ih", 1, len(TOPIC)) + TOPIC)
        yield conn


def test_api_versions_advertise_produce_from_v0(sock):
    body = _request(sock, 18, 0, b"")
    code, count = struct.unpack_from(">hi", body)
    assert code == 0
    ranges = {struct.unpack_from(">h", body, 6 + 6 * i)[0]:
              struct.unpack_from(">hh", body, 8 + 6 * i) for i in range(count)}
    assert ranges[0] == (0, 9)


def test_v0_v1_v2_append_and_answer_in_their_own_layout(sock):
    code, base0, rest = _produce(sock, 0, make_batch([b"a", b"b"]))
    assert code == 0 and rest == b""  # v0: no throttle time
    code, base1, rest = _produce(sock, 1, make_batch([b"c"]))
    assert code == 0 and base1 == base0 + 2
    assert rest == struct.pack(">i", 0)  # v1: throttle time
    code, base2, rest = _produce(sock, 2, make_batch([b"d"]))
    assert code == 0 and base2 == base1 + 1
    assert rest == struct.pack(">qi", -1, 0)  # v2: log append time, throttle time


def test_old_message_format_is_refused_per_partition(sock):
    # A magic-1 message (offset, size, crc, magic 1, attributes, timestamp, key, value).
    message = struct.pack(">bbqii", 1, 0, 0, -1, 1) + b"x"
    message_set = struct.pack(">qiI", 0, len(message) + 4, 0) + message
    code, base, _ = _produce(sock, 1, message_set)
    assert code == 43  # UNSUPPORTED_FOR_MESSAGE_FORMAT
    assert base == -1


@pytest.mark.parametrize("version", [2, 7])
def test_invalid_acks_are_refused_per_partition_and_nothing_is_stored(sock, version):
    def produce(acks: int) -> tuple[int, int]:
        body = struct.pack(">hii", acks, 10_000, 1) if version < 3 else struct.pack(
            ">hhii", -1, acks, 10_000, 1)
        records = make_batch([b"acks"])
        body += struct.pack(">h", len(TOPIC)) + TOPIC + struct.pack(">iii", 1, 0, len(records))
        response = _request(sock, 0, version, body + records)
        pos = 6 + len(TOPIC)
        _partitions, _index, code, base = struct.unpack_from(">iihq", response, pos)
        return code, base

    _, before = produce(-1)
    assert produce(2) == (21, -1)  # INVALID_REQUIRED_ACKS
    _, after = produce(1)
    assert after == before + 1  # the refused batch took no offset


def test_error_codes_of_answers_are_counted_in_metrics(tmp_path):
    """The answer is encoded by hand, so the handler counts its error codes
    (kafka_gateway_response_errors_total), once per refused partition."""
    from testkit import prom

    with GatewayProcess(tmp_path / "data", "--admin-listen", "127.0.0.1:0") as gw, \
            socket.create_connection(gw.host_port, timeout=30) as conn:
        _request(conn, 3, 1, struct.pack(">ih", 1, len(TOPIC)) + TOPIC)  # auto-creates it
        records = make_batch([b"x"])
        body = struct.pack(">hhii", -1, -1, 10_000, 1) + struct.pack(">h", len(TOPIC)) + TOPIC
        body += struct.pack(">i", 3)
        for index in (0, 99, 98):  # one partition that exists, two that do not
            body += struct.pack(">ii", index, len(records)) + records
        response = _request(conn, 0, 7, body)
        pos = 6 + len(TOPIC) + 4
        codes = [struct.unpack_from(">ih", response, pos + i * 30)[1] for i in range(3)]
        assert codes == [0, 3, 3]  # UNKNOWN_TOPIC_OR_PARTITION
        samples = gw.metrics()
        assert prom.value(samples, "kafka_gateway_response_errors_total", api="produce",
                          error="UNKNOWN_TOPIC_OR_PARTITION") == 2
