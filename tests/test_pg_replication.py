"""testkit/postgres.py's faults and testkit/pg_replication.py's primary with a
streaming standby, on real servers:

- replication really streams: a row committed on the primary is read on the
  standby, which refuses writes; the multi-host URL with
  ``target_session_attrs=read-write`` reaches the primary;
- synchronous replication is in force: the standby is ``sync``, and with
  ``remote_apply`` a row is on the standby as soon as the commit returns;
- ``kill`` leaves no process of the primary and its port closed; ``promote``
  makes the standby writable, with what the primary had committed, and the
  same URL now reaches it; the killed server starts again after crash
  recovery;
- ``restart`` keeps the port and the data; leaving the ``with`` stops both
  servers and deletes their directories.
"""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from testkit import pg_replication
from testkit.pg_replication import ReplicatedPair
from testkit.postgres import PostgresServer, alive, port_open

pair = pg_replication.pair_fixture()
sync_pair = pg_replication.pair_fixture("remote_apply")


def wait_for(check: object, what: str, within: float = 30.0) -> None:
    assert callable(check)
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"{what}: not after {within}s"
        time.sleep(0.05)


async def port_of(dsn: str) -> tuple[int, bool]:
    """The port of the server ``dsn`` reaches, and whether it is in recovery."""
    conn = await asyncpg.connect(dsn)
    try:
        return (int(await conn.fetchval("SELECT inet_server_port()")),
                bool(await conn.fetchval("SELECT pg_is_in_recovery()")))
    finally:
        await conn.close()


def test_a_row_committed_on_the_primary_is_read_on_the_standby(pair: ReplicatedPair) -> None:
    assert pair.replication_state() == ("streaming", "async")
    assert pair.standby.in_recovery()
    assert pair.primary.psql("SHOW synchronous_standby_names") == ""
    pair.primary.psql("CREATE TABLE t (k int PRIMARY KEY, v text); "
                      "INSERT INTO t VALUES (1, 'streamed')")
    wait_for(lambda: pair.standby.psql("SELECT count(*) FROM pg_class WHERE relname = 't'")
             == "1" and pair.standby.psql("SELECT v FROM t") == "streamed",
             "the row on the standby")
    with pytest.raises(RuntimeError, match="read-only transaction"):
        pair.standby.psql("INSERT INTO t VALUES (2, 'refused')")
    # The standby listed first: the URL still picks the server that takes writes.
    assert asyncio.run(port_of(pair.dsn)) == (pair.primary.port, False)
    reversed_dsn = (f"postgresql://postgres@127.0.0.1:{pair.standby.port},"
                    f"127.0.0.1:{pair.primary.port}/postgres?target_session_attrs=read-write")
    assert asyncio.run(port_of(reversed_dsn)) == (pair.primary.port, False)


def test_with_remote_apply_a_commit_is_on_the_standby_when_it_returns(
        sync_pair: ReplicatedPair) -> None:
    assert sync_pair.replication_state() == ("streaming", "sync")
    assert sync_pair.primary.psql("SHOW synchronous_commit") == "remote_apply"
    assert sync_pair.primary.psql("SHOW synchronous_standby_names") == "FIRST 1 (standby1)"
    sync_pair.primary.psql("CREATE TABLE t (k int)")
    for k in range(20):
        sync_pair.primary.psql(f"INSERT INTO t VALUES ({k})")
        # No waiting: the commit returned only once the standby applied it.
        assert sync_pair.standby.psql("SELECT count(*) FROM t") == str(k + 1)


def test_killing_the_primary_then_promoting_the_standby(sync_pair: ReplicatedPair) -> None:
    sync_pair.primary.psql("CREATE TABLE t (k int); INSERT INTO t VALUES (1)")
    pid, port = sync_pair.primary.pid, sync_pair.primary.port
    assert pid is not None and alive(pid) and port_open(port)  # the premise
    killed = sync_pair.primary.kill()
    assert killed == pid and not alive(pid) and not port_open(port)
    assert sync_pair.primary.pid is None
    with pytest.raises(RuntimeError, match="read-only transaction"):
        sync_pair.standby.psql("INSERT INTO t VALUES (2)")
    sync_pair.standby.promote()
    assert not sync_pair.standby.in_recovery()
    # Writable, alone: it did not inherit synchronous_standby_names.
    sync_pair.standby.psql("INSERT INTO t VALUES (2)")
    assert sync_pair.standby.psql("SELECT string_agg(k::text, ',' ORDER BY k) FROM t") == "1,2"
    assert asyncio.run(port_of(sync_pair.dsn)) == (sync_pair.standby.port, False)
    # The killed server starts again (crash recovery) with what it had.
    sync_pair.primary.start_again()
    assert sync_pair.primary.psql("SELECT count(*) FROM t") == "1"


def test_restart_keeps_the_port_and_the_data() -> None:
    with PostgresServer() as pg:
        pg.psql("CREATE TABLE t (k int); INSERT INTO t VALUES (7)")
        before, port = pg.pid, pg.port
        pg.restart()
        assert pg.pid is not None and pg.pid != before and pg.port == port
        assert before is not None and not alive(before)
        assert pg.psql("SELECT k FROM t") == "7"


def test_leaving_the_with_stops_both_servers_and_deletes_their_directories() -> None:
    with ReplicatedPair() as replicated:
        servers = [(s.pid, s.port, s.root) for s in (replicated.primary, replicated.standby)]
        for pid, port, root in servers:
            assert pid is not None and root is not None
            assert alive(pid) and port_open(port) and root.exists()  # the premise
    for pid, port, root in servers:
        assert pid is not None and root is not None
        assert not alive(pid) and not port_open(port) and not root.exists()
