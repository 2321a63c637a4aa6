"""A throwaway PostgreSQL server for tests: Debian's ``postgresql`` package, a
fresh cluster in a temporary directory, on a free loopback port.

    with PostgresServer() as pg:
        conn = await asyncpg.connect(pg.dsn)

    pg_server = postgres.server_fixture("module")   # in a test module: a fixture

- ``initdb`` makes the cluster in a new temporary directory (trust
  authentication, superuser ``postgres``); ``pg_ctl start -w`` starts it
  listening on 127.0.0.1 only, on a port free a moment before, with its Unix
  socket inside the directory (no system path is touched); ``stop`` runs
  ``pg_ctl stop -m fast`` and deletes the directory.
- PostgreSQL refuses to run as root: as root, every binary runs as the
  ``postgres`` user (``runuser -u postgres --``; Debian's package makes that
  user), and the directory is given to it. As anyone else, they run as you.
- The binaries are those of the newest PostgreSQL installed under
  /usr/lib/postgresql/<version>/bin (Debian's layout; ``tests/run_all.sh``
  installs the package), or of ``$KAFKA_GATEWAY_PG_BIN``.
- Nothing is left running: ``stop`` is called on leaving the ``with`` (a test
  failing included), and a watchdog process started beside the server stops
  it (``-m immediate``) and deletes its directory when this process dies
  without stopping it (``kill -9`` of the test run: the watchdog sees its pipe
  from us close).
- Faults: ``kill`` SIGKILLs the postmaster (a crash) and returns once it and
  its processes are gone and the port is closed; ``start_again`` starts it
  again (crash recovery; also after ``halt``, a ``pg_ctl stop -m fast`` that
  keeps the directory); ``restart`` is ``halt`` then start, on the same
  port; ``promote`` is ``pg_ctl promote -w``; ``freeze`` SIGSTOPs the
  server's processes (a host gone silent) until ``thaw``; ``psql`` runs SQL.
  A primary with a streaming standby: ``testkit/pg_replication.py``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import pytest

from testkit.kafka_broker import free_port

PG_ROOT = Path("/usr/lib/postgresql")
USER = "postgres"
# A fast shutdown waits for sessions to be closed by the server, never longer than this.
STOP_TIMEOUT = 60


def bin_dir() -> Path:
    """The directory of ``initdb``/``pg_ctl``/``postgres``: $KAFKA_GATEWAY_PG_BIN, or
    the newest version installed under /usr/lib/postgresql (Debian's layout)."""
    override = os.environ.get("KAFKA_GATEWAY_PG_BIN")
    if override:
        return Path(override)
    versions = sorted((int(d.name), d / "bin") for d in PG_ROOT.glob("*")
                      if d.name.isdigit() and (d / "bin" / "initdb").exists())
    if not versions:
        raise RuntimeError(f"no PostgreSQL under {PG_ROOT}/<version>/bin: install Debian's "
                           "postgresql package (tests/run_all.sh does: apt-get install "
                           "postgresql)")
    return versions[-1][1]


def version() -> int:
    """The major version of the binaries ``bin_dir`` names."""
    out = subprocess.run([str(bin_dir() / "pg_ctl"), "--version"], check=True,
                         capture_output=True, text=True).stdout
    match = re.search(r"(\d+)(?:\.\d+)?", out)
    if match is None:
        raise RuntimeError(f"pg_ctl --version said {out!r}")
    return int(match.group(1))


def _as_owner() -> list[str]:
    """The prefix that runs a command as the cluster's owner."""
    return ["runuser", "-u", USER, "--"] if os.geteuid() == 0 else []


# The watchdog: reads its stdin (a pipe from the test process) until EOF, i.e.
# until that process stops it or dies; then stops a server still running and
# deletes the directory. It ignores SIGINT (a Ctrl-C of the test run reaches
# the whole process group: the watchdog must outlive it to clean up).
_WATCHDOG = r"""
import os, shutil, signal, subprocess, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
root, pg_ctl, *as_owner = sys.argv[1:]
sys.stdin.buffer.read()
data = os.path.join(root, "data")
try:  # a frozen server (``freeze``) must be resumed to be stopped
    pid = int(open(os.path.join(data, "postmaster.pid")).readline())
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if int(entry) == pid or ppid == pid:
                os.kill(int(entry), signal.SIGCONT)
except (OSError, ValueError):
    pass
if os.path.exists(os.path.join(data, "postmaster.pid")):
    subprocess.run([*as_owner, pg_ctl, "stop", "-D", data, "-m", "immediate", "-w", "-t", "60"],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
shutil.rmtree(root, ignore_errors=True)
"""


class PostgresServer:
    """One throwaway PostgreSQL cluster (see the module's docstring)."""

    def __init__(self, settings: dict[str, str] | None = None,
                 startup_timeout: float = 60.0) -> None:
        # Server settings (postgresql.conf names) on the command line of the start.
        self.settings = dict(settings or {})
        self.startup_timeout = startup_timeout
        self.bin = bin_dir()
        self.port = 0
        self.root: Path | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._frozen: list[int] = []  # pids stopped by ``freeze``

    # ------------------------------------------------------------ where
    @property
    def data_dir(self) -> Path:
        assert self.root is not None, "not started"
        return self.root / "data"

    @property
    def log_path(self) -> Path:
        assert self.root is not None, "not started"
        return self.root / "server.log"

    @property
    def dsn(self) -> str:
        """A libpq URL of the ``postgres`` database as the superuser."""
        return self.dsn_of("postgres")

    def dsn_of(self, database: str) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    @property
    def pid(self) -> int | None:
        """The postmaster's pid, from its pid file (None when it is not running:
        no file, or the file left by a killed server, whose pid may since name
        another process)."""
        try:
            first = (self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0]
            pid = int(first)
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (FileNotFoundError, ProcessLookupError, AssertionError, ValueError):
            return None
        return pid if alive(pid) and str(self.data_dir).encode() in command else None

    # ------------------------------------------------------------ lifecycle
    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*_as_owner(), *args], capture_output=True, text=True,
                              timeout=timeout, check=False)

    def start(self) -> PostgresServer:
        assert self.root is None, "already started"
        # A directory of our own in the system temporary directory, not pytest's
        # tmp_path: that one lies under a 0700 directory of root's that the
        # postgres user cannot traverse.
        self.root = Path(tempfile.mkdtemp(prefix="kgw-pg-"))
        try:
            if os.geteuid() == 0:
                shutil.chown(self.root, USER, USER)
            self._watchdog = subprocess.Popen(
                [sys.executable, "-c", _WATCHDOG, str(self.root), str(self.bin / "pg_ctl"),
                 *_as_owner()],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self._create_data()
            self.port = free_port()
            self._launch()
        except BaseException:
            self.stop()
            raise
        return self

    def _create_data(self) -> None:
        """Make the data directory (here ``initdb``; a standby copies its primary's)."""
        init = self._run(str(self.bin / "initdb"), "-D", str(self.data_dir), "-U", USER,
                         "--auth=trust", "--encoding=UTF8", "--locale=C.UTF-8", "--no-sync")
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed ({init.returncode}):\n{init.stdout}"
                               f"{init.stderr}")

    def _launch(self) -> None:
        """``pg_ctl start -w`` on the existing data directory, at ``self.port``."""
        options = {
            "port": str(self.port),
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": str(self.root),
            **self.settings,
        }
        line = " ".join(f"-c {name}={value}" for name, value in options.items())
        started = self._run(str(self.bin / "pg_ctl"), "start", "-D", str(self.data_dir),
                            "-l", str(self.log_path), "-o", line, "-w",
                            "-t", str(int(self.startup_timeout)),
                            timeout=self.startup_timeout + 60)
        if started.returncode != 0:
            raise RuntimeError(f"pg_ctl start failed ({started.returncode}):\n"
                               f"{started.stdout}{started.stderr}\n--- server log:\n"
                               f"{self._log_tail()}")

    # ------------------------------------------------------------ faults and HA
    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run ``sql`` with psql over TCP (unaligned, tuples only); its output.
        Raises when psql fails."""
        done = self._run(str(self.bin / "psql"), "-X", "-h", "127.0.0.1", "-p",
                         str(self.port), "-U", USER, "-d", database, "-v", "ON_ERROR_STOP=1",
                         "-At", "-c", sql,
                         timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"psql on port {self.port} failed ({done.returncode}): "
                               f"{done.stderr.strip()}")
        return done.stdout.strip()

    def halt(self, mode: str = "fast") -> None:
        """Stop the server (``pg_ctl stop -m mode``: sessions are ended, nothing
        committed is lost) and keep its directory, for ``start_again``."""
        stopped = self._run(str(self.bin / "pg_ctl"), "stop", "-D", str(self.data_dir),
                            "-m", mode, "-w", "-t", str(STOP_TIMEOUT),
                            timeout=STOP_TIMEOUT + 30)
        if stopped.returncode != 0:
            raise RuntimeError(f"pg_ctl stop -m {mode} failed: {stopped.stderr}")

    def restart(self, mode: str = "fast") -> None:
        """``halt`` then start again, on the same port."""
        self.halt(mode)
        self._launch()

    def kill(self, wait: float = 30.0) -> int:
        """SIGKILL the postmaster (a crash: no shutdown checkpoint, no goodbye to
        clients or standbys); return its pid once it and every process it had
        started are gone and its port is closed. The backends notice their
        postmaster's death and exit on their own; one still there after
        ``wait`` seconds is SIGKILLed too (shared memory must be free for a
        later ``start_again``)."""
        pid = self.pid
        assert pid is not None and alive(pid), "kill: the server is not running"
        children = _children(pid)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + wait
        while alive(pid) or any(alive(child) for child in children):
            if time.monotonic() > deadline:
                for child in children:
                    if alive(child):
                        os.kill(child, signal.SIGKILL)
                deadline = time.monotonic() + wait
            time.sleep(0.02)
        assert not alive(pid), f"the postmaster {pid} survived SIGKILL"
        deadline = time.monotonic() + wait
        while port_open(self.port):
            assert time.monotonic() < deadline, f"port {self.port} still open after the kill"
            time.sleep(0.02)
        return pid

    def freeze(self) -> list[int]:
        """SIGSTOP the postmaster and every process it started: a server that
        hangs (a machine gone silent, a network that drops its packets). The
        kernel still completes TCP handshakes on its port, and nothing ever
        answers. Returns the pids stopped; ``thaw`` resumes them."""
        pid = self.pid
        assert pid is not None, "freeze: the server is not running"
        self._frozen = [pid, *_children(pid)]
        for each in self._frozen:
            os.kill(each, signal.SIGSTOP)
        for each in self._frozen:
            _wait_state(each, "T")
        return list(self._frozen)

    def thaw(self) -> None:
        for each in self._frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(each, signal.SIGCONT)
        self._frozen = []

    def start_again(self) -> None:
        """Start a server that was killed or stopped (crash recovery after a
        kill), on the same port."""
        assert self.pid is None, "start_again: the server is running"
        # A killed postmaster's pid file names a process that is gone, or a
        # zombie nobody reaped yet (this machine's init is slow to), which the
        # new postmaster would take for a running server: ``kill`` waited for
        # every process of the old one, so the file is stale.
        # The same holds for its Unix socket's lock file.
        assert self.root is not None
        (self.data_dir / "postmaster.pid").unlink(missing_ok=True)
        (self.root / f".s.PGSQL.{self.port}.lock").unlink(missing_ok=True)
        self._launch()

    def promote(self) -> None:
        """``pg_ctl promote -w``: a standby becomes a primary (returns once it
        accepts writes)."""
        done = self._run(str(self.bin / "pg_ctl"), "promote", "-D", str(self.data_dir),
                         "-w", "-t", str(int(self.startup_timeout)),
                         timeout=self.startup_timeout + 30)
        if done.returncode != 0:
            raise RuntimeError(f"pg_ctl promote failed ({done.returncode}): "
                               f"{done.stdout}{done.stderr}\n--- server log:\n"
                               f"{self._log_tail()}")

    def _log_tail(self, limit: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-limit:]
        except (FileNotFoundError, AssertionError):
            return "(no log)"

    def stop(self) -> None:
        """Stop the server (fast shutdown; immediate, then SIGKILL, if that fails)
        and delete its directory. Safe to call twice, or after a failed start."""
        if self.root is None:
            return
        self.thaw()  # a frozen server could not stop
        pid = self.pid
        try:
            if pid is not None:
                done = self._run(str(self.bin / "pg_ctl"), "stop", "-D", str(self.data_dir),
                                 "-m", "fast", "-w", "-t", str(STOP_TIMEOUT),
                                 timeout=STOP_TIMEOUT + 30)
                if done.returncode != 0:
                    self._run(str(self.bin / "pg_ctl"), "stop", "-D", str(self.data_dir),
                              "-m", "immediate", "-w", "-t", "30", timeout=60)
                _kill_if_alive(pid)
        finally:
            if self._watchdog is not None:
                assert self._watchdog.stdin is not None
                self._watchdog.stdin.close()  # EOF: it finds nothing running, deletes root
                self._watchdog.wait(timeout=120)
                self._watchdog = None
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _kill_if_alive(pid: int, wait: float = 10.0) -> None:
    """The postmaster is gone after this: waited for, then SIGKILLed."""
    deadline = time.monotonic() + wait
    while alive(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + wait
        time.sleep(0.05)


def _children(pid: int) -> list[int]:
    """The pids of the processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue
        if ppid == pid:
            found.append(int(entry.name))
    return found


def _wait_state(pid: int, state: str, within: float = 10.0) -> None:
    """Until ``pid``'s state in /proc is ``state`` (T: stopped), or it is gone."""
    deadline = time.monotonic() + within
    while True:
        try:
            now = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return
        if now == state:
            return
        assert time.monotonic() < deadline, f"pid {pid} in state {now}, not {state}"
        time.sleep(0.01)


def alive(pid: int) -> bool:
    """Whether a process with ``pid`` exists (a zombie counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    with socket.socket() as sock:
        sock.settimeout(2)
        return sock.connect_ex((host, port)) == 0


Scope = Literal["session", "package", "module", "class", "function"]


def server_fixture(scope: Scope = "module",
                   settings: dict[str, str] | None = None) -> Callable[..., Any]:
    """A pytest fixture yielding a started ``PostgresServer``, stopped when its
    scope ends, whatever the tests did:

        pg_server = postgres.server_fixture("module")
    """

    def fixture() -> Iterator[PostgresServer]:
        with PostgresServer(settings) as server:
            yield server

    decorated: Callable[..., Any] = pytest.fixture(scope=scope)(fixture)
    return decorated
