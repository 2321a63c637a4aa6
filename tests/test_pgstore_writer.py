"""pgstore.writer: group commit over a throwaway PostgreSQL.

- changes queued while a write runs become one transaction; futures resolve
  in submission order, after every ``on_durable`` callback of the group;
- a change refused alone: by a fence at its first step (skipped, no
  rollback), by a fence or a statement failing later (the group rolls back
  and is written again without it); the others land;
- a serialisation failure writes the whole group again;
- a connection lost before the COMMIT: ``StoreUnavailable``, nothing written;
  lost during the COMMIT: ``OutcomeUnknown``; the next group reconnects.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import asyncpg
import pytest

from pgstore.writer import OutcomeUnknown, PgChange, PgWriter, StoreUnavailable
from tablets.errors import StorageError
from testkit import postgres
from testkit.pg_faults import FlakyConnection, flaky
from testkit.postgres import PostgresServer

pg_server = postgres.server_fixture("module")
T = TypeVar("T")
TABLE = "writer_test"


class Refused(Exception):
    pass


def run(pg: PostgresServer, body: Callable[[PgWriter, asyncpg.Connection], Awaitable[T]],
        connect: Callable[..., Any] = asyncpg.connect) -> T:
    async def main() -> T:
        admin = await asyncpg.connect(pg.dsn)
        await admin.execute(f"DROP TABLE IF EXISTS {TABLE}; CREATE TABLE {TABLE} "
                            "(k int PRIMARY KEY, v text NOT NULL)")
        writer = PgWriter(pg.dsn, connect=connect)
        await writer.start()
        try:
            return await body(writer, admin)
        finally:
            await writer.close()
            await admin.close()

    return asyncio.run(main())


def insert(writer: PgWriter, k: int, v: str = "x") -> PgChange:
    change = writer.begin()
    change.execute(f"INSERT INTO {TABLE} (k, v) VALUES ($1, $2)", k, v)
    return change


async def keys(admin: asyncpg.Connection) -> list[int]:
    return [r["k"] for r in await admin.fetch(f"SELECT k FROM {TABLE} ORDER BY k")]


def test_concurrent_changes_are_one_transaction_resolved_in_order(
        pg_server: PostgresServer) -> None:
    async def body(writer: PgWriter, admin: asyncpg.Connection) -> None:
        events: list[str] = []
        futures = []
        for k in range(200):
            change = insert(writer, k)
            change.on_durable(lambda k=k: events.append(f"durable {k}"))
            future = writer.commit(change)
            future.add_done_callback(lambda _, k=k: events.append(f"resolved {k}"))
            futures.append(future)
        await asyncio.gather(*futures)
        assert await keys(admin) == list(range(200))
        # All 200 were queued before the writer ran: one group, one transaction.
        assert writer.stats.writes == 1, writer.stats.writes
        assert writer.stats.changes == 200
        assert events[:200] == [f"durable {k}" for k in range(200)]
        assert events[200:] == [f"resolved {k}" for k in range(200)]

    run(pg_server, body)


def test_a_fence_at_the_first_step_skips_its_change_alone(pg_server: PostgresServer) -> None:
    async def body(writer: PgWriter, admin: asyncpg.Connection) -> None:
        fenced = writer.begin()
        fenced.fence("SELECT 1 WHERE false", refused=lambda: Refused("moved"))
        fenced.execute(f"INSERT INTO {TABLE} (k, v) VALUES (2, 'never')")
        durable: list[int] = []
        fenced.on_durable(lambda: durable.append(2))
        results = await asyncio.gather(writer.commit(insert(writer, 1)), writer.commit(fenced),
                                       writer.commit(insert(writer, 3)),
                                       return_exceptions=True)
        assert results[0] is None and results[2] is None
        assert isinstance(results[1], Refused)
        assert await keys(admin) == [1, 3]
        assert durable == []
        assert writer.stats.writes == 1  # skipped without a rollback

    run(pg_server, body)


def test_a_later_fence_or_a_failing_statement_rolls_back_only_its_change(
        pg_server: PostgresServer) -> None:
    async def body(writer: PgWriter, admin: asyncpg.Connection) -> None:
        late = writer.begin()
        late.execute(f"INSERT INTO {TABLE} (k, v) VALUES (10, 'half')")
        late.fence("SELECT 1 WHERE false", refused=lambda: Refused("moved"))
        duplicate = insert(writer, 1)  # the primary key already taken by the first change
        rows_seen: list[int] = []
        fetching = writer.begin()
        fetching.fetch("SELECT 7 AS n", into=lambda rows: rows_seen.append(rows[0]["n"]))
        fetching.execute(f"INSERT INTO {TABLE} (k, v) VALUES (4, 'y')")
        results = await asyncio.gather(
            writer.commit(fetching), writer.commit(insert(writer, 1)), writer.commit(late),
            writer.commit(duplicate), return_exceptions=True)
        assert results[0] is None and results[1] is None
        assert isinstance(results[2], Refused)
        assert isinstance(results[3], StorageError)
        assert "duplicate key" in str(results[3])
        assert await keys(admin) == [1, 4]  # nothing of the refused changes, not even k=10
        # Run three times: with all four, without `late`, without `duplicate`.
        assert rows_seen == [7, 7, 7]
        assert writer.stats.writes == 1

    run(pg_server, body)


def test_a_serialisation_failure_writes_the_group_again(pg_server: PostgresServer) -> None:
    opened: list[FlakyConnection] = []

    async def body(writer: PgWriter, admin: asyncpg.Connection) -> None:
        opened[0].fail_statement = asyncpg.exceptions.SerializationError("could not serialize")
        await asyncio.gather(writer.commit(insert(writer, 1)), writer.commit(insert(writer, 2)))
        assert opened[0].fail_statement is None  # the fault landed
        assert await keys(admin) == [1, 2]

    run(pg_server, body, connect=flaky(opened))


def test_a_connection_lost_before_the_commit_writes_nothing_then_reconnects(
        pg_server: PostgresServer) -> None:
    opened: list[FlakyConnection] = []

    async def body(writer: PgWriter, admin: asyncpg.Connection) -> None:
        await writer.commit(insert(writer, 1))
        opened[0].fail_statement = ConnectionResetError("connection reset by peer")
        with pytest.raises(StoreUnavailable):
            await writer.commit(insert(writer, 2))
        assert opened[0].fail_statement is None  # the fault landed
        assert await keys(admin) == [1]
        await writer.commit(insert(writer, 3))  # a new connection
        assert len(opened) == 2
        assert await keys(admin) == [1, 3]

    run(pg_server, body, connect=flaky(opened))


def test_a_terminated_backend_is_replaced_and_no_answer_lies(pg_server: PostgresServer) -> None:
    async def body(writer: PgWriter, admin: asyncpg.Connection) -> None:
        await writer.commit(insert(writer, 1))
        # Kill the writer's backend from outside, as a restarted server would.
        killed = await admin.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE pid <> pg_backend_pid() AND datname = current_database() "
            "AND backend_type = 'client backend'")
        assert killed == 1
        # Either the writer saw the connection close first and reconnected,
        # or its statement met the dead backend: never a success not written.
        try:
            await writer.commit(insert(writer, 2))
            expected = [1, 2]
        except StoreUnavailable:
            expected = [1]
        assert await keys(admin) == expected
        await writer.commit(insert(writer, 3))
        assert writer.connects == 2
        assert await keys(admin) == [*expected, 3]

    run(pg_server, body)


def test_a_connection_lost_during_the_commit_is_in_doubt(pg_server: PostgresServer) -> None:
    opened: list[FlakyConnection] = []

    async def body(writer: PgWriter, admin: asyncpg.Connection) -> None:
        opened[0].fail_commit = ConnectionResetError("connection reset by peer")
        with pytest.raises(OutcomeUnknown):
            await writer.commit(insert(writer, 1))
        assert opened[0].fail_commit is None  # the fault landed
        assert await keys(admin) == [1]  # it did land: only the answer was lost
        await writer.commit(insert(writer, 2))
        assert len(opened) == 2
        assert await keys(admin) == [1, 2]

    run(pg_server, body, connect=flaky(opened))


def test_close_writes_what_is_queued_then_refuses(pg_server: PostgresServer) -> None:
    async def body(writer: PgWriter, admin: asyncpg.Connection) -> None:
        futures = [writer.commit(insert(writer, k)) for k in range(5)]
        await writer.close()
        assert all(f.done() and f.exception() is None for f in futures)
        assert await keys(admin) == list(range(5))
        with pytest.raises(StoreUnavailable):
            await writer.commit(insert(writer, 9))

    run(pg_server, body)


def test_a_wrong_url_fails_at_start(pg_server: PostgresServer) -> None:
    async def main() -> None:
        writer = PgWriter(pg_server.dsn.replace(str(pg_server.port), "1"))
        with pytest.raises(OSError):
            await writer.start()

    asyncio.run(main())
