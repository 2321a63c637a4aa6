"""Server CPU per produced batch, from a raw socket: the least noisy measure of the
gateway's per-batch work on a shared machine.

    python -m bench.batch_cpu                      # 3 runs of 10 s, defaults below
    python -m bench.batch_cpu --runs 1 --py-spy /tmp/b.txt --py-spy-native
    python -m bench.batch_cpu --row                # the 100-partition row's requests

A gateway subprocess (this checkout's code, a fresh data dir) gets a topic of 100
partitions, then Produce v7 requests (acks=all) of 15 one-record batches of 1 KiB each,
every batch to its own partition, 5 requests in flight on one connection: the per-batch
work. ``--row`` sends what librdkafka sends in the 100-partition row of ``python -m
bench`` on this machine instead (counted in the gateway during that row: 15.0 records a
batch, one batch a request; librdkafka 2.x sends Produce v9): Produce v9 of one batch of
15 records of 1 KiB, partitions in turn, so the per-request work decides. The client is a plain
blocking socket with every frame built beforehand, so its own CPU per request is small.
The gateway's CPU (every thread: event loop, writer, RocksDB's) is read from
/proc/PID/stat before and after each measured window and divided by the batches
acknowledged in it, and so are its minor page faults (``minflt``, fresh pages the
kernel had to map: allocations glibc serves from new memory); the host's busy CPU beyond
the gateway and this client is printed as the outside load, which moves these figures
more than anything else.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import struct
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from bench.meter import host_busy_cpu_s, sample_process
from tablets.batch import build_batch, zigzag_varint
from testkit.gateway import GatewayProcess
from testkit.kafka_requests import create_topics, produce, request_frame

TOPIC = "batch-cpu"


def record_batch(values: list[bytes], timestamp_ms: int) -> bytes:
    """A v2 batch of one record (no key, no headers) per value."""
    records = []
    for delta, value in enumerate(values):
        body = (b"\x00" + zigzag_varint(0) + zigzag_varint(delta) + zigzag_varint(-1)
                + zigzag_varint(len(value)) + value + zigzag_varint(0))
        records.append(zigzag_varint(len(body)) + body)
    return build_batch(b"".join(records), record_count=len(values),
                       base_timestamp=timestamp_ms, max_timestamp=timestamp_ms)


def one_record_batch(value: bytes, timestamp_ms: int) -> bytes:
    """A v2 batch of one record (no key, no headers) of ``value``."""
    return record_batch([value], timestamp_ms)


def produce_frames(partitions: int, per_request: int, record_bytes: int,
                   count: int, records_per_batch: int = 1, version: int = 7) -> list[bytes]:
    """``count`` Produce frames of ``per_request`` batches of ``records_per_batch``
    records each, partitions in turn."""
    now = int(time.time() * 1000)
    frames = []
    next_partition = 0
    for correlation in range(count):
        batches = []
        for _ in range(per_request):
            values = [os.urandom(record_bytes) for _ in range(records_per_batch)]
            batches.append((TOPIC, next_partition, record_batch(values, now)))
            next_partition = (next_partition + 1) % partitions
        frames.append(request_frame(produce(batches, acks=-1, version=version), correlation))
    return frames


def minor_faults(pid: int) -> int:
    """The process's minor page faults so far (/proc/PID/stat field 10)."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


def _read_frame(sock: socket.socket, buf: bytearray) -> bytes:
    while len(buf) < 4 or len(buf) < 4 + struct.unpack_from(">i", buf)[0]:
        chunk = sock.recv(1 << 16)
        if not chunk:
            raise ConnectionError("the gateway closed the connection")
        buf += chunk
    size = struct.unpack_from(">i", buf)[0]
    frame = bytes(buf[4:4 + size])
    del buf[:4 + size]
    return frame


def _uvarint(frame: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = frame[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _check_answer(frame: bytes, version: int) -> None:
    """Every partition of a v7 or v9 answer acknowledged (error code 0)."""
    if version < 9:
        _check_v7(frame)
        return
    pos = 5  # correlation id, no tagged fields
    topics, pos = _uvarint(frame, pos)
    for _ in range(topics - 1):
        name_len, pos = _uvarint(frame, pos)
        pos += name_len - 1
        parts, pos = _uvarint(frame, pos)
        for _ in range(parts - 1):
            index, code = struct.unpack_from(">ih", frame, pos)
            if code != 0:
                raise AssertionError(f"partition {index} answered error {code}")
            pos += 4 + 2 + 8 + 8 + 8  # index, error, base offset, append time, log start
            record_errors, pos = _uvarint(frame, pos)
            message, pos = _uvarint(frame, pos)
            if record_errors != 1 or message != 0:
                raise AssertionError(f"partition {index} answered record errors or a message")
            pos += 1  # its tagged fields (none)
        pos += 1  # the topic's tagged fields (none)


def _check_v7(frame: bytes) -> None:
    pos = 4  # correlation id
    (topics,) = struct.unpack_from(">i", frame, pos)
    pos += 4
    for _ in range(topics):
        (name_len,) = struct.unpack_from(">h", frame, pos)
        pos += 2 + name_len
        (parts,) = struct.unpack_from(">i", frame, pos)
        pos += 4
        for _ in range(parts):
            index, code = struct.unpack_from(">ih", frame, pos)
            if code != 0:
                raise AssertionError(f"partition {index} answered error {code}")
            pos += 4 + 2 + 8 + 8 + 8  # index, error, base offset, append time, log start


def run_window(sock: socket.socket, frames: list[bytes], in_flight: int, seconds: float,
               pid: int, version: int) -> dict[str, float]:
    """Keep ``in_flight`` requests outstanding for ``seconds``; what the server spent."""
    buf = bytearray()
    sent = answered = 0
    for _ in range(in_flight):
        sock.sendall(frames[sent % len(frames)])
        sent += 1
    start_cpu = sample_process(pid).cpu_s
    start_faults = minor_faults(pid)
    start_host = host_busy_cpu_s()
    start_self = time.process_time()
    start = time.monotonic()
    counted = 0
    while time.monotonic() - start < seconds:
        _check_answer(_read_frame(sock, buf), version)
        answered += 1
        counted += 1
        sock.sendall(frames[sent % len(frames)])
        sent += 1
    wall = time.monotonic() - start
    server_cpu = sample_process(pid).cpu_s - start_cpu
    faults = minor_faults(pid) - start_faults
    host = host_busy_cpu_s() - start_host
    client_cpu = time.process_time() - start_self
    while answered < sent:  # drain, not counted
        _read_frame(sock, buf)
        answered += 1
    return {"requests": counted, "wall_s": wall, "server_cpu_s": server_cpu,
            "client_cpu_s": client_cpu, "minor_faults": faults,
            "outside_cores": max(0.0, host - server_cpu - client_cpu) / wall}


@contextlib.contextmanager
def py_spy(pid: int, output: Path | None, native: bool) -> Iterator[None]:
    if output is None:
        yield
        return
    command = ["py-spy", "record", "--pid", str(pid), "--output", str(output),
               "--rate", "200"]
    if output.suffix != ".svg":
        command += ["--format", "raw"]
    if native:
        command.append("--native")
    spy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    time.sleep(1.0)
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)
        spy.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--partitions", type=int, default=100)
    parser.add_argument("--batches-per-request", type=int, default=15)
    parser.add_argument("--records-per-batch", type=int, default=1)
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--version", type=int, choices=(7, 9), default=7,
                        help="Produce version (librdkafka 2.x sends v9, flexible)")
    parser.add_argument("--row", action="store_true",
                        help="the 100-partition row's requests: one batch of 15 records "
                             "a request, Produce v9 (sets --batches-per-request 1 "
                             "--records-per-batch 15 --version 9)")
    parser.add_argument("--in-flight", type=int, default=5)
    parser.add_argument("--py-spy", type=Path, metavar="FILE")
    parser.add_argument("--py-spy-native", action="store_true")
    args = parser.parse_args()
    if args.row:
        args.batches_per_request, args.records_per_batch, args.version = 1, 15, 9
    frames = produce_frames(args.partitions, args.batches_per_request, args.record_bytes,
                            count=64 if args.batches_per_request > 1 else 2 * args.partitions,
                            records_per_batch=args.records_per_batch, version=args.version)
    with tempfile.TemporaryDirectory(prefix="batch-cpu-") as tmp, \
            GatewayProcess(Path(tmp) / "data") as gateway:
        assert gateway.process is not None
        pid = gateway.process.pid
        sock = socket.create_connection(gateway.host_port)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(request_frame(create_topics([(TOPIC, args.partitions, 1, None)]), 1 << 30))
        _read_frame(sock, bytearray())
        time.sleep(1.0)
        run_window(sock, frames, args.in_flight, args.warmup, pid, args.version)
        with py_spy(pid, args.py_spy, args.py_spy_native):
            for run in range(args.runs):
                r = run_window(sock, frames, args.in_flight, args.seconds, pid, args.version)
                batches = r["requests"] * args.batches_per_request
                print(f"run {run + 1}: {r['server_cpu_s'] / batches * 1e6:.1f} us server CPU "
                      f"per batch, {r['requests'] / r['wall_s']:.0f} requests/s, "
                      f"client {r['client_cpu_s'] / batches * 1e6:.1f} us per batch, "
                      f"outside load {r['outside_cores']:.2f} cores, "
                      f"{r['minor_faults'] / r['requests']:.2f} page faults per request",
                      flush=True)
        sock.close()


if __name__ == "__main__":
    main()
