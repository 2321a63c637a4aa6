"""A PostgreSQL primary with a streaming-replication standby, for failover
tests: throwaway servers as ``testkit/postgres.py`` makes them.

    with ReplicatedPair(synchronous_commit="on") as pair:
        url = pair.dsn_of("postgres")     # both hosts, target_session_attrs=read-write
        ...
        pair.primary.kill()               # SIGKILL of the postmaster
        pair.standby.promote()            # pg_ctl promote -w: it accepts writes

    pair = pg_replication.pair_fixture("on")   # in a test module: a fixture

- The standby is a ``pg_basebackup`` of the primary (as the ``postgres`` user,
  WAL streamed during the copy), made with a physical replication slot of its
  own (``-C -S standby1``: the primary keeps the WAL the standby has not
  received), then ``standby.signal`` and, in ``postgresql.auto.conf``,
  ``primary_conninfo`` (with ``application_name=standby1``) and
  ``primary_slot_name``. ``start`` returns once the primary's
  ``pg_stat_replication`` shows it streaming.
- Synchronous replication (``synchronous_commit`` "on" or "remote_apply"):
  once the standby streams, the primary gets ``synchronous_standby_names =
  'FIRST 1 (standby1)'`` and that ``synchronous_commit`` by ``ALTER SYSTEM``
  and a reload, and ``start`` waits until the standby is ``sync``. A commit on
  the primary then returns only once the standby has flushed its WAL ("on")
  or also applied it ("remote_apply", so a read on the standby right after
  sees it). Set after the copy, so the standby does not inherit it: once
  promoted, it commits alone.
- Without it (``None``), replication is asynchronous: a commit returns once
  the primary's own WAL is flushed.
- ``stop`` stops both; each server's watchdog covers a killed test process.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from typing import Any, Literal

import pytest

from testkit.postgres import USER, PostgresServer

SyncLevel = Literal["on", "remote_apply"]
STANDBY_NAME = "standby1"
STREAMING_TIMEOUT = 60.0


class StandbyServer(PostgresServer):
    """A hot standby of ``primary``, streaming through a replication slot."""

    def __init__(self, primary: PostgresServer, name: str = STANDBY_NAME,
                 settings: dict[str, str] | None = None,
                 startup_timeout: float = 60.0) -> None:
        super().__init__(settings, startup_timeout)
        self.primary = primary
        self.name = name

    def _create_data(self) -> None:
        source = f"host=127.0.0.1 port={self.primary.port} user={USER}"
        copied = self._run(str(self.bin / "pg_basebackup"), "-D", str(self.data_dir),
                           "-d", source, "-X", "stream", "-C", "-S", self.name,
                           "-c", "fast", "--no-sync", timeout=300)
        if copied.returncode != 0:
            raise RuntimeError(f"pg_basebackup failed ({copied.returncode}):\n"
                               f"{copied.stdout}{copied.stderr}")
        signal_file = self.data_dir / "standby.signal"
        signal_file.touch()
        with (self.data_dir / "postgresql.auto.conf").open("a") as conf:
            conf.write(f"primary_conninfo = '{source} application_name={self.name}'\n"
                       f"primary_slot_name = '{self.name}'\n")
        if os.geteuid() == 0:
            shutil.chown(signal_file, USER, USER)

    def in_recovery(self) -> bool:
        return self.psql("SELECT pg_is_in_recovery()") == "t"


class ReplicatedPair:
    """A primary and one standby (see the module's docstring)."""

    def __init__(self, synchronous_commit: SyncLevel | None = None) -> None:
        self.synchronous_commit = synchronous_commit
        self.primary = PostgresServer()
        self.standby = StandbyServer(self.primary)

    def start(self) -> ReplicatedPair:
        try:
            self.primary.start()
            self.standby.start()
            self.wait_replication("async")
            if self.synchronous_commit is not None:
                self.primary.psql(f"ALTER SYSTEM SET synchronous_standby_names = "
                                  f"'FIRST 1 ({self.standby.name})'")
                self.primary.psql(f"ALTER SYSTEM SET synchronous_commit = "
                                  f"'{self.synchronous_commit}'")
                self.primary.psql("SELECT pg_reload_conf()")
                self.wait_replication("sync")
        except BaseException:
            self.stop()
            raise
        return self

    def replication_state(self) -> tuple[str, str] | None:
        """The standby's (state, sync_state) in the primary's pg_stat_replication."""
        out = self.primary.psql(
            "SELECT state || ' ' || sync_state FROM pg_stat_replication "
            f"WHERE application_name = '{self.standby.name}'")
        if not out:
            return None
        state, sync_state = out.split()
        return state, sync_state

    def wait_replication(self, sync_state: str) -> None:
        """Until the standby streams, in ``sync_state`` ("async" or "sync")."""
        deadline = time.monotonic() + STREAMING_TIMEOUT
        while (seen := self.replication_state()) != ("streaming", sync_state):
            assert time.monotonic() < deadline, (
                f"the standby is not streaming {sync_state} after {STREAMING_TIMEOUT}s: "
                f"{seen}")
            time.sleep(0.05)

    def dsn_of(self, database: str) -> str:
        """Both servers in one URL, as asyncpg (and libpq) take it: the first
        that accepts writes is used, whichever that is now."""
        return (f"postgresql://{USER}@127.0.0.1:{self.primary.port},"
                f"127.0.0.1:{self.standby.port}/{database}?target_session_attrs=read-write")

    @property
    def dsn(self) -> str:
        return self.dsn_of("postgres")

    def stop(self) -> None:
        try:
            self.standby.stop()
        finally:
            self.primary.stop()

    def __enter__(self) -> ReplicatedPair:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def pair_fixture(synchronous_commit: SyncLevel | None = None) -> Callable[..., Any]:
    """A function-scoped pytest fixture yielding a started ``ReplicatedPair``
    (a failover test spends it), stopped after the test whatever it did."""

    def fixture() -> Iterator[ReplicatedPair]:
        with ReplicatedPair(synchronous_commit) as pair:
            yield pair

    decorated: Callable[..., Any] = pytest.fixture(scope="function")(fixture)
    return decorated
