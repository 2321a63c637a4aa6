"""Run a gateway as a subprocess on a free port: for tests and benchmarks.

    with GatewayProcess(tmp_path) as gw:
        producer = Producer({"bootstrap.servers": gw.bootstrap})
        gw.kill()       # kill -9
        gw.start()      # same data dir, same port

The port is chosen by the OS at the first start (``--listen 127.0.0.1:0``)
and kept across restarts so clients can reconnect.

With ``KAFKA_GATEWAY_TEST_STORE=postgresql-cluster`` (``testkit.pg_store_mode``)
a gateway is the first of three on one PostgreSQL database: ``siblings``
are started, stopped, killed and restarted with it, and a start is over when
all three list the three in Metadata.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from testkit import pg_store_mode, prom

_READY = re.compile(r"kafka-gateway ready: listening on ([\d.]+):(\d+)")
_LISTENER = re.compile(r"(\w+)://[^,\s]*:(\d+) \(")
_ADMIN = re.compile(r"admin http ([\d.]+:\d+)")


class GatewayProcess:
    def __init__(self, data_dir: str | os.PathLike[str], *extra_args: str,
                 port: int = 0, startup_timeout: float = 30.0,
                 store_dir: str | os.PathLike[str] | None = None) -> None:
        self.data_dir = Path(data_dir)
        # The data directory whose database it uses (a cluster sibling: the first's).
        self.store_dir = Path(store_dir) if store_dir is not None else self.data_dir
        self.extra_args = list(extra_args)
        self.port = port
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen[str] | None = None
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}.log"
        self._log_lines: list[str] = []
        self.listener_ports: dict[str, int] = {}  # listener name -> bound port
        self.siblings: list[GatewayProcess] = []
        if pg_store_mode.forms_cluster(self.extra_args) and store_dir is None:
            first = pg_store_mode.node_id(self.extra_args)
            self.siblings = [
                GatewayProcess(self.data_dir.parent / f"{self.data_dir.name}-node{node}",
                               *pg_store_mode.sibling_args(self.extra_args, node),
                               startup_timeout=startup_timeout, store_dir=self.data_dir)
                for node in range(first + 1, first + pg_store_mode.CLUSTER_SIZE)]

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def host_port(self) -> tuple[str, int]:
        return "127.0.0.1", self.port

    def bootstrap_of(self, listener: str) -> str:
        """host:port of one listener (``--listeners``, ports chosen at start-up)."""
        return f"127.0.0.1:{self.listener_ports[listener]}"

    def start(self) -> GatewayProcess:
        """Start it (and its cluster siblings, all at once); return when all
        are ready (and, in a cluster, all list the three in Metadata)."""
        members = [self, *self.siblings]
        for member in members:
            member._spawn()
        try:
            for member in members:
                member._wait_ready()
            if self.siblings:
                pg_store_mode.check_cluster(
                    [member.host_port for member in members],
                    {pg_store_mode.node_id(member.extra_args) for member in members},
                    self.startup_timeout)
        except BaseException:
            for member in members:
                member._kill_one()
            raise
        return self

    def _spawn(self) -> None:
        assert self.process is None or self.process.poll() is not None, "already running"
        command = [
            sys.executable, "-m", "kafka_gateway", "serve",
            "--listen", f"127.0.0.1:{self.port}",
            "--data-dir", str(self.data_dir),
            *self.extra_args,
            # KAFKA_GATEWAY_TEST_STORE=postgresql: on the PostgreSQL store.
            *pg_store_mode.store_args(self.store_dir, self.extra_args),
        ]
        # The log sits beside the data directory, whose parent the gateway makes
        # only once its settings are read: its first lines (the allocator's) come
        # before that.
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )

    def _wait_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.startup_timeout
        assert self.process.stdout is not None
        while True:
            line = self.process.stdout.readline()
            if line:
                self._log(line)
                match = _READY.search(line)
                if match:
                    self.port = int(match.group(2))
                    self.listener_ports = {name: int(port)
                                           for name, port in _LISTENER.findall(line)}
                    break
            elif self.process.poll() is not None:
                raise RuntimeError(f"gateway exited at start-up:\n{self.output()}")
            if time.monotonic() > deadline:
                self._kill_one()
                raise TimeoutError(
                    f"gateway not ready in {self.startup_timeout}s:\n{self.output()}"
                )
        threading.Thread(target=self._drain, args=(self.process,), daemon=True).start()
        pg_store_mode.check_started(self.output(), self.extra_args)

    def _drain(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            self._log(line)

    def _log(self, line: str) -> None:
        self._log_lines.append(line)
        with open(self.log_path, "a") as log:
            log.write(line)

    def output(self) -> str:
        return "".join(self._log_lines)

    def outputs(self) -> list[str]:
        """Its output and its cluster siblings': what a gateway does for a
        key (a transaction's timeout, a group's rebalance) is logged by the
        one that coordinates the key, which in a cluster may be a sibling."""
        return [member.output() for member in (self, *self.siblings)]

    def nodes(self) -> dict[int, GatewayProcess]:
        """The brokers a client of it sees, by node id: itself (``--node-id``,
        default 0) and, in a cluster, its siblings. What a test expects to
        find in Metadata, as leader or as coordinator."""
        return {pg_store_mode.node_id(member.extra_args): member
                for member in (self, *self.siblings)}

    def node_of(self, port: int) -> GatewayProcess:
        """The member (itself or a sibling) listening on ``port``."""
        [found] = [member for member in (self, *self.siblings) if member.port == port]
        return found

    def admin_address(self) -> str:
        """host:port of the admin HTTP endpoint of the latest start."""
        found = _ADMIN.findall(self.output())
        assert found, "the gateway runs without --admin-listen"
        return found[-1]

    def memory_kib(self, key: str = "VmRSS") -> int:
        """VmRSS (now) or VmHWM (peak) of the running gateway, in KiB; fails
        loudly when the process is gone or the line cannot be read."""
        assert self.process is not None and self.process.poll() is None, "gateway is gone"
        with open(f"/proc/{self.process.pid}/status") as status:
            for line in status:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
        raise AssertionError(f"no {key} in /proc/{self.process.pid}/status")

    def metrics(self) -> dict[prom.Sample, float]:
        """Its /metrics now, parsed as Prometheus does (read with ``prom.value``)."""
        return prom.samples(prom.scrape(self.admin_address()))

    def kill(self) -> None:
        """kill -9 (with its cluster siblings): no clean shutdown, no flush."""
        for member in (self, *self.siblings):
            member._kill_one()

    @property
    def members(self) -> list[GatewayProcess]:
        """It and its cluster siblings (alone: itself)."""
        return [self, *self.siblings]

    def kill_alone(self) -> None:
        """kill -9 of this process only: a cluster's other members carry on."""
        self._kill_one()

    def start_alone(self) -> GatewayProcess:
        """Start this process only, on its port and store (a member killed
        alone); return when it is ready, without waiting for the cluster."""
        self._spawn()
        try:
            self._wait_ready()
        except BaseException:
            self._kill_one()
            raise
        return self

    def _kill_one(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait: the gateway answers in-flight requests and closes
        the store. Its cluster siblings are stopped at the same time; the
        answer is its own exit status."""
        for sibling in self.siblings:
            sibling._signal(signal.SIGTERM)
        try:
            return self._stop_one(timeout)
        finally:
            for sibling in self.siblings:
                sibling._stop_one(timeout)

    def _signal(self, sig: signal.Signals) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)

    def _stop_one(self, timeout: float) -> int:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._kill_one()
            raise

    def restart(self, hard: bool = True) -> GatewayProcess:
        self.kill() if hard else self.stop()
        return self.start()

    def __enter__(self) -> GatewayProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            self.kill()

