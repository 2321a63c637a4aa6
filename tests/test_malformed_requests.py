"""Frames that made kio's native reader abort the process (SIGABRT), against a live gateway.

kio reserved memory for whatever array count a client declared; a count of
2^32 in a 30-byte frame asked for 32 GiB and the process died. Each frame
below now closes only its own connection: the process stays up, a connection
opened before keeps being answered, and memory stays under ``PEAK_RSS_MIB``.
"""

from __future__ import annotations

import socket
import struct

import pytest

from testkit.fuzz import Seed, frame, seeds
from testkit.gateway import GatewayProcess

PEAK_RSS_MIB = 256  # the gateway's high-water mark (VmHWM) after every frame below
HUGE_VARINT = b"\xff\xff\xff\xff\x0f"  # 2^32 - 1: a count of 2^32 - 2
SEEDS = {(s.api_key, s.version): s for s in seeds()}

# As reported (hex of the whole frame, then of the frame after its length prefix).
METADATA_V12 = bytes.fromhex(
    "0000001e0003000c000000010006726f6275737400ffffffff0f0000000000000000")
_DELETE_TOPICS_V4 = bytes.fromhex("0014000400000007000772646b61666b6100fffffffe70320000ea6000")
DELETE_TOPICS_V4 = struct.pack(">i", len(_DELETE_TOPICS_V4)) + _DELETE_TOPICS_V4


def _huge_first_array(api_key: int, version: int) -> bytes:
    """A valid request of this version whose first array declares 2^32 - 2 items."""
    seed = SEEDS[(api_key, version)]
    span = next(s for s in seed.spans if s.kind in ("ucount", "count"))
    value = HUGE_VARINT if span.kind == "ucount" else struct.pack(">i", 0x7FFFFFFF)
    return frame(seed, 7, body=seed.body[: span.start] + value + seed.body[span.start
                                                                            + span.size:])


REPORTED = {
    "Metadata v12": METADATA_V12,
    "DeleteTopics v4": DELETE_TOPICS_V4,
    "SyncGroup v5": _huge_first_array(14, 5),
    "CreatePartitions v2": _huge_first_array(37, 2),
    "JoinGroup v9": _huge_first_array(11, 9),
    "Fetch v13": _huge_first_array(1, 13),
    "CreateTopics v7": _huge_first_array(19, 7),
}


def _every_length_huge(seed: Seed) -> list[bytes]:
    out = []
    for span in seed.spans:
        if span.kind in ("ucount", "ulen"):
            value = HUGE_VARINT
        elif span.kind in ("count", "len32"):
            value = struct.pack(">i", 0x7FFFFFFF)
        elif span.kind == "len16":
            value = struct.pack(">h", 0x7FFF)
        else:
            continue
        out.append(frame(seed, 7, body=seed.body[: span.start] + value
                         + seed.body[span.start + span.size:]))
    return out


class _Bystander:
    """A connection opened before the bad frames, asked ApiVersions after each."""

    def __init__(self, gateway: GatewayProcess) -> None:
        self.sock = socket.create_connection(gateway.host_port, timeout=30)
        self.correlation = 0

    def still_answered(self) -> bool:
        self.correlation += 1
        payload = struct.pack(">hhih", 18, 0, self.correlation, 1) + b"b"
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)
        (size,) = struct.unpack(">i", _read_exactly(self.sock, 4))
        answer = _read_exactly(self.sock, size)
        return struct.unpack_from(">i", answer)[0] == self.correlation


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, "connection closed"
        data += chunk
    return data


def _closed_without_answer(gateway: GatewayProcess, data: bytes) -> bool:
    with socket.create_connection(gateway.host_port, timeout=30) as sock:
        sock.sendall(data)
        return sock.recv(1 << 16) == b""


def _peak_rss_mib(gateway: GatewayProcess) -> float:
    assert gateway.process is not None
    with open(f"/proc/{gateway.process.pid}/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with GatewayProcess(tmp_path_factory.mktemp("malformed") / "data") as gw:
        yield gw


@pytest.mark.parametrize("name", REPORTED)
def test_a_reported_frame_closes_only_its_connection(gateway, name):
    bystander = _Bystander(gateway)
    assert bystander.still_answered()
    assert _closed_without_answer(gateway, REPORTED[name])
    assert gateway.process is not None and gateway.process.poll() is None
    assert bystander.still_answered()
    assert _peak_rss_mib(gateway) < PEAK_RSS_MIB


def test_every_count_and_length_of_every_version_at_two_to_the_32(gateway):
    bystander = _Bystander(gateway)
    sent = 0
    for seed in SEEDS.values():
        for data in _every_length_huge(seed):
            assert _closed_without_answer(gateway, data), seed.name
            sent += 1
    assert sent > 500
    assert gateway.process is not None and gateway.process.poll() is None
    assert bystander.still_answered()
    assert _peak_rss_mib(gateway) < PEAK_RSS_MIB
