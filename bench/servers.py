"""Start and stop the servers under test.

Every server listens on free loopback ports only. The gateway runs embedded
(`gateway`: RocksDB in a data dir, here) and over PostgreSQL (`gateway-pg`: `--store
postgresql://...` on a throwaway PostgreSQL with its default, durable settings; and
`gateway-pg2`, `gateway-pg3`: a cluster of two and three gateway processes over one:
bench.pg_servers). The peers are Apache Kafka 3.4.1 (what users would run instead: its
defaults, one node, its log dirs beside the gateway's data, here) and Tansu, with its
in-memory storage engine (`tansu`) and with its PostgreSQL one (`tansu-pg`):
bench.tansu_servers. ServerSet starts any of them by name.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

from bench.pg_servers import POSTGRES_PREFIX, GatewayPgServer
from bench.server_base import (
    ALL_SERVERS,
    GATEWAY,
    GATEWAY_PG,
    GATEWAY_PG_CLUSTER,
    KAFKA,
    PEERS,
    SERVERS,
    TANSU,
    TANSU_PG,
    Server,
    ServerMissingError,
    free_port,
    gateway_version,
)
from bench.tansu_servers import TansuPgServer, TansuServer, tansu_version
from testkit import jvm
from testkit.gateway import GatewayProcess
from testkit.kafka_broker import KafkaBroker

__all__ = [  # what the runner, the report and the tests import from here
    "ALL_SERVERS", "GATEWAY", "GATEWAY_PG", "GATEWAY_PG_CLUSTER", "KAFKA", "PEERS",
    "POSTGRES_PREFIX", "SERVERS", "TANSU", "TANSU_PG", "GatewayPgServer", "Server",
    "ServerMissingError", "ServerSet", "free_port", "kafka_version", "tansu_version",
]


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
        self.version = gateway_version()
        return self

    def stop(self) -> None:
        try:
            self._process.stop()
        finally:
            self._process.kill()



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
    if name == TANSU_PG:
        return TansuPgServer(work_dir)
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
