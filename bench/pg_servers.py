"""Servers over a throwaway PostgreSQL: the gateway (one process or a cluster of
several) and, in bench.tansu_servers, Tansu on its PostgreSQL engine.

Both sides get the same PostgreSQL (testkit/postgres.py) with the settings a
deployment keeps for durability, its defaults: fsync on, synchronous_commit on,
full_page_writes on. An acknowledged record is then on disk through PostgreSQL's
WAL, whoever wrote it.

sample(): CPU is every broker process's plus every PostgreSQL process's (the
postmaster and its children, the children that exited included:
bench.meter.sample_tree). Memory is every broker's RSS plus PostgreSQL's PSS
(shared buffers counted once); its peak is each broker's VmHWM plus the largest PSS
of PostgreSQL seen by any sample so far (the kernel keeps no peak of a PSS; the
runner samples at the start and end of every measured run).
"""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from bench.meter import ProcSample, command_line, sample_process, sample_tree, thread_cpu_s
from bench.server_base import (
    GATEWAY,
    GATEWAY_PG,
    GATEWAY_PG_CLUSTER,
    KAFKA,
    TANSU,
    Server,
    ServerMissingError,
    gateway_version,
)
from testkit.gateway import GatewayProcess

if TYPE_CHECKING:
    from testkit.postgres import PostgresServer

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


class OverPostgres(Server):
    """A server whose brokers store everything in one throwaway PostgreSQL: starts
    and stops that PostgreSQL, and measures it with the brokers (the module's
    docstring). Subclasses start their brokers in start() after start_postgres()
    and name their pids in broker_pids()."""

    def __init__(self, name: str) -> None:
        super().__init__(name=name)
        self.postgres: PostgresServer | None = None
        self.postgres_major = 0
        self._pg_peak_pss = 0

    def start_postgres(self) -> PostgresServer:
        # Imported here: testkit.postgres needs pytest and Debian's postgresql, which
        # the other servers do not.
        from testkit import postgres

        try:
            self.postgres = postgres.PostgresServer()
            self.postgres_major = postgres.version()
        except RuntimeError as error:  # no PostgreSQL binaries here
            self.postgres = None
            raise ServerMissingError(f"{error}; or leave {self.name} out: --servers "
                                     f"{GATEWAY},{KAFKA},{TANSU}") from error
        return self.postgres.start()

    def broker_pids(self) -> list[int]:
        raise NotImplementedError

    def stop_brokers(self) -> None:
        raise NotImplementedError

    def _postmaster(self) -> int:
        pid = self.postgres.pid if self.postgres is not None else None
        if pid is None:
            raise ProcessLookupError("PostgreSQL is not running")
        return pid

    def sample(self) -> ProcSample:
        postmaster = self._postmaster()
        pg = sample_tree(postmaster)
        self._pg_peak_pss = max(self._pg_peak_pss, pg.pss_bytes)
        brokers = [sample_process(pid) for pid in self.broker_pids()]
        return ProcSample(cpu_s=pg.cpu_s + sum(b.cpu_s for b in brokers),
                          rss_bytes=pg.pss_bytes + sum(b.rss_bytes for b in brokers),
                          peak_rss_bytes=self._pg_peak_pss
                          + sum(b.peak_rss_bytes for b in brokers))

    def threads(self) -> Counter[str]:
        """Every broker's threads (summed by name across brokers) and PostgreSQL's
        processes by role (postgres_role)."""
        out: Counter[str] = Counter()
        for pid in self.broker_pids():
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
            self.stop_brokers()
        finally:
            if self.postgres is not None:
                self.postgres.stop()


class GatewayPgServer(OverPostgres):
    """The gateway over PostgreSQL: `gateways` gateway processes with `--store`
    pointing at the throwaway PostgreSQL. Several gateways form a cluster
    (docs/cluster.md: node ids 1 to N, partitions and coordinators balanced over
    them); start() returns once the first one's Metadata lists them all. The
    bootstrap names them all, and sample()/threads() add up every one of them."""

    def __init__(self, work_dir: Path, extra_args: list[str], gateways: int = 1) -> None:
        super().__init__(name=GATEWAY_PG_CLUSTER.get(gateways, GATEWAY_PG))
        if gateways != 1 and gateways not in GATEWAY_PG_CLUSTER:
            raise ValueError(f"{gateways} gateways: the bench runs 1, "
                             f"{', '.join(map(str, GATEWAY_PG_CLUSTER))}")
        self._work_dir = work_dir
        self._extra_args = extra_args
        self._gateway_count = gateways
        self.gateways: list[GatewayProcess] = []

    def start(self) -> GatewayPgServer:
        postgres = self.start_postgres()
        self.version = (f"{gateway_version()} over PostgreSQL {self.postgres_major} "
                        f"(fsync=on, synchronous_commit=on)")
        if self._gateway_count > 1:
            self.version += f", {self._gateway_count} gateways"
        for index in range(self._gateway_count):
            node = [] if self._gateway_count == 1 else ["--node-id", str(index + 1)]
            gateway = GatewayProcess(self._work_dir / f"{self.name}-{index}-data",
                                     "--store", postgres.dsn, *node, *self._extra_args)
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

    def broker_pids(self) -> list[int]:
        return [g.process.pid for g in self.gateways if g.process is not None]

    def stop_brokers(self) -> None:
        for gateway in self.gateways:
            try:
                gateway.stop()
            finally:
                gateway.kill()
