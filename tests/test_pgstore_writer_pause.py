"""A gateway of a cluster paused inside its writer's transaction does not hold
up the takeover of the rows that transaction locked (issue 22; found when
``compat_tests/test_pg_cluster_faults.py``'s SIGSTOP landed between a fenced
append's statements and their COMMIT: one partition stayed without a leader
for the whole 60 s the test waited).

The node's own writer (``PgNodeStorage(...).writer``, as the gateway builds
it) runs a change of two statements. The first locks a row (as a fenced
append locks its partition's row); the second waits for a lock the test
holds. The test then blocks this process's event loop, so the writer can no
more send its COMMIT than a SIGSTOPped process could, and releases its lock:
the writer's session is now idle inside its transaction, holding the first
row. Another session, as a successor taking the partition, updates that row.
In a cluster the server ends the paused session after a quarter of the lease,
so the successor's update goes through; the paused change fails when the
writer wakes (``StoreUnavailable``, or ``OutcomeUnknown`` if it had sent its
COMMIT by then) and nothing of it lands. Alone (no cluster) nothing
ends the session: the successor's update would wait (checked too, so the
test's own premise is proven).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import psycopg
import pytest

from pgstore.cluster import ClusterSettings
from pgstore.node import PgNodeSettings, PgNodeStorage
from pgstore.writer import OutcomeUnknown, StoreUnavailable
from tablets.errors import StorageError
from testkit import postgres
from testkit.postgres import PostgresServer

pg_server = postgres.server_fixture("module")
LEASE = 1.0  # the session ends after 250 ms idle in a transaction
TABLE = "writer_pause"
WAIT = 3.0  # the successor's lock_timeout: far above a quarter lease


def _paused_writer_blocks_row(pg: PostgresServer, settings: PgNodeSettings) -> tuple[bool, float]:
    """Pause the node's writer inside its transaction; whether a successor's
    update of the locked row then went through (within ``WAIT``), and how long
    it waited."""

    async def body() -> tuple[bool, float]:
        with psycopg.connect(pg.dsn, autocommit=True) as admin:
            admin.execute(f"DROP TABLE IF EXISTS {TABLE}; CREATE TABLE {TABLE} "
                          "(k int PRIMARY KEY, v int NOT NULL); "
                          f"INSERT INTO {TABLE} VALUES (1, 0), (2, 0)")
        storage = PgNodeStorage(pg.dsn, settings)
        writer = storage.writer
        await writer.start()
        try:
            with psycopg.connect(pg.dsn) as holder, psycopg.connect(pg.dsn) as watcher:
                watcher.autocommit = True
                holder.execute(f"SELECT 1 FROM {TABLE} WHERE k = 2 FOR UPDATE")
                change = writer.begin()
                change.execute(f"UPDATE {TABLE} SET v = v + 1 WHERE k = 1")
                change.execute(f"UPDATE {TABLE} SET v = v + 1 WHERE k = 2")
                done = writer.commit(change)
                deadline = time.monotonic() + 10
                while not _writer_sessions(watcher, "wait_event_type", "Lock"):
                    assert time.monotonic() < deadline, "the writer never waited on the lock"
                    await asyncio.sleep(0.01)
                # From here the event loop is blocked: the writer is paused.
                holder.commit()
                deadline = time.monotonic() + 5
                while not _writer_sessions(watcher, "state", "idle in transaction"):
                    assert time.monotonic() < deadline, (
                        "the writer's session never sat idle in its transaction")
                    time.sleep(0.005)
                with psycopg.connect(pg.dsn) as successor:
                    successor.execute(f"SET lock_timeout = '{int(WAIT * 1000)}ms'")
                    started = time.monotonic()
                    try:
                        successor.execute(f"UPDATE {TABLE} SET v = 100 WHERE k = 1")
                        successor.commit()
                        went_through = True
                    except psycopg.errors.LockNotAvailable:
                        went_through = False
                    waited = time.monotonic() - started
            # The loop runs again: the paused change is answered.
            if went_through:
                # Unanswered: the server ended the session, before or at the
                # COMMIT the writer sent when it woke (in doubt to it).
                with pytest.raises((StoreUnavailable, OutcomeUnknown)):
                    await asyncio.wait_for(done, 30)
                with psycopg.connect(pg.dsn) as check:
                    rows = dict(check.execute(f"SELECT k, v FROM {TABLE}").fetchall())
                assert rows == {1: 100, 2: 0}, "something of the paused change landed"
            else:  # nothing ended it; its COMMIT or its overdue watchdog comes now
                with contextlib.suppress(StorageError):
                    await asyncio.wait_for(done, 30)
            return went_through, waited
        finally:
            await writer.close()
            storage.validators.shutdown()

    return asyncio.run(body())


def _writer_sessions(conn: psycopg.Connection, column: str, value: str) -> list[int]:
    """Backends running the change's second statement whose ``column`` of
    ``pg_stat_activity`` is ``value`` (waiting on a lock; idle in a transaction)."""
    rows = conn.execute(
        f"SELECT pid FROM pg_stat_activity WHERE {column} = %s "
        f"AND query LIKE 'UPDATE {TABLE} SET v = v + 1 WHERE k = 2%%'", (value,)).fetchall()
    return [int(pid) for (pid,) in rows]


def test_a_paused_cluster_writer_releases_its_rows_within_a_quarter_lease(
        pg_server: PostgresServer) -> None:
    settings = PgNodeSettings(cluster=ClusterSettings(node_id=1, lease_seconds=LEASE))
    went_through, waited = _paused_writer_blocks_row(pg_server, settings)
    assert went_through, f"the successor waited {waited:.2f} s for the paused writer's row"
    assert waited < LEASE, waited


def test_alone_nothing_ends_the_paused_session(pg_server: PostgresServer) -> None:
    """The premise: without the cluster's session settings the row stays
    locked for as long as the writer is paused."""
    went_through, waited = _paused_writer_blocks_row(pg_server, PgNodeSettings())
    assert not went_through
    assert waited >= WAIT * 0.9, waited
