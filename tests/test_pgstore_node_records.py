"""pgstore.node_records on a throwaway PostgreSQL (the embedded engine's:
tablets/node_records.py, tests/test_seam.py):

- a change of several records is one atomic write, visible once committed,
  and survives a restart (a new instance loading what the first wrote);
  kinds do not see each other's records;
- a change that fails (its connection killed while it runs) changes nothing,
  in memory or in the database;
- offline (the security CLI, no event loop): read, ``change_now``, and a
  running gateway's instance sees it when it loads again; online,
  ``change_now`` refuses, offline ``change`` refuses.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg
import pytest

from pgstore.node_records import PgNodeRecords, open_node_records
from pgstore.writer import PgWriter
from tablets.errors import StorageError
from testkit import postgres
from testkit.pg_schemas import connect_as, migrated_schema
from testkit.postgres import PostgresServer

pg_server = postgres.server_fixture("module")
T = TypeVar("T")
APP = "records-writer"

Body = Callable[[PgNodeRecords, PgNodeRecords, PgWriter, asyncpg.Connection], Awaitable[T]]


def run(pg: PostgresServer, schema: str, body: Body[T]) -> T:
    """Run ``body(scram, acl, writer, admin)`` on fresh loaded instances."""

    async def main() -> T:
        admin = await asyncpg.connect(pg.dsn)
        writer = PgWriter(pg.dsn, connect=connect_as(APP))
        await writer.start()
        try:
            scram = PgNodeRecords(writer, schema, "scram")
            acl = PgNodeRecords(writer, schema, "acl")
            await scram.load(admin)
            await acl.load(admin)
            return await body(scram, acl, writer, admin)
        finally:
            await writer.close()
            await admin.close()

    return asyncio.run(main())


async def stored(admin: asyncpg.Connection, schema: str) -> list[tuple[str, bytes, bytes]]:
    return [(r["kind"], bytes(r["name"]), bytes(r["value"])) for r in await admin.fetch(
        f"SELECT kind, name, value FROM {schema}.node_records ORDER BY kind, name")]


def test_changes_are_atomic_and_survive_a_restart(pg_server: PostgresServer) -> None:
    schema = migrated_schema(pg_server, "records")

    async def write(scram: PgNodeRecords, acl: PgNodeRecords, writer: PgWriter,
                    admin: asyncpg.Connection) -> None:
        changing = asyncio.ensure_future(scram.change({b"alice\x00m": b"a1", b"bob\x00m": b"b1"}))
        await asyncio.sleep(0)
        assert scram.get(b"alice\x00m") is None  # not committed yet
        await changing
        assert dict(scram.records) == {b"alice\x00m": b"a1", b"bob\x00m": b"b1"}
        # Deletions and puts in one change; a name both deleted and put ends up put.
        await scram.change({b"carol\x00m": b"c1", b"bob\x00m": b"b2"},
                           [b"alice\x00m", b"bob\x00m", b"nobody"])
        assert dict(scram.records) == {b"bob\x00m": b"b2", b"carol\x00m": b"c1"}
        await acl.change({b"\x00binary\xff": b"\x00\x01"})
        assert acl.get(b"\x00binary\xff") == b"\x00\x01"
        assert scram.get(b"\x00binary\xff") is None
        assert await stored(admin, schema) == [
            ("acl", b"\x00binary\xff", b"\x00\x01"),
            ("scram", b"bob\x00m", b"b2"), ("scram", b"carol\x00m", b"c1")]

    run(pg_server, schema, write)

    async def reread(scram: PgNodeRecords, acl: PgNodeRecords, writer: PgWriter,
                     admin: asyncpg.Connection) -> None:
        assert dict(scram.records) == {b"bob\x00m": b"b2", b"carol\x00m": b"c1"}
        assert dict(acl.records) == {b"\x00binary\xff": b"\x00\x01"}

    run(pg_server, schema, reread)


def test_a_change_whose_connection_is_killed_changes_nothing(pg_server: PostgresServer) -> None:
    schema = migrated_schema(pg_server, "records")

    async def body(scram: PgNodeRecords, acl: PgNodeRecords, writer: PgWriter,
                   admin: asyncpg.Connection) -> None:
        await scram.change({b"u\x00m": b"old"})
        blocker = await asyncpg.connect(pg_server.dsn)
        try:
            blocking = blocker.transaction()
            await blocking.start()
            await blocker.execute(f"LOCK TABLE {schema}.node_records IN EXCLUSIVE MODE")
            failing = asyncio.ensure_future(scram.change({b"u\x00m": b"new", b"v\x00m": b"x"}))
            for _ in range(200):  # until the writer waits on the lock (at most 20 s)
                waiting = await admin.fetchval(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = $1 "
                    "AND wait_event_type = 'Lock'", APP)
                if waiting is not None:
                    break
                await asyncio.sleep(0.1)
            assert waiting is not None, "the change never waited on the lock"
            assert await admin.fetchval("SELECT pg_terminate_backend($1)", waiting)
            with pytest.raises(StorageError):
                await asyncio.wait_for(failing, 30)
            await blocking.rollback()
        finally:
            await blocker.close()
        assert dict(scram.records) == {b"u\x00m": b"old"}
        assert await stored(admin, schema) == [("scram", b"u\x00m", b"old")]
        await scram.change({b"u\x00m": b"new"})  # the writer reconnected
        assert dict(scram.records) == {b"u\x00m": b"new"}

    run(pg_server, schema, body)


def test_offline_and_online(pg_server: PostgresServer) -> None:
    schema = migrated_schema(pg_server, "records")

    async def online(scram: PgNodeRecords, acl: PgNodeRecords, writer: PgWriter,
                     admin: asyncpg.Connection) -> None:
        await scram.change({b"u\x00m": b"secret", b"w\x00m": b"kept"})
        with pytest.raises(RuntimeError, match="change_now is for the offline CLI"):
            scram.change_now({b"x": b"y"})
        assert b"x" not in scram.records

    run(pg_server, schema, online)
    # The security CLI: no event loop running, a connection of its own.
    records = open_node_records(pg_server.dsn, "scram", schema)
    try:
        assert records.get(b"u\x00m") == b"secret"
        records.change_now({b"v\x00m": b"added"}, [b"u\x00m"])
        assert dict(records.records) == {b"v\x00m": b"added", b"w\x00m": b"kept"}
        with pytest.raises(RuntimeError, match="offline"):
            asyncio.run(records.change({b"z": b"z"}))
    finally:
        records.close()
    with pytest.raises(ValueError, match="kind"):
        open_node_records(pg_server.dsn, "other", schema)

    async def again(scram: PgNodeRecords, acl: PgNodeRecords, writer: PgWriter,
                    admin: asyncpg.Connection) -> None:
        assert dict(scram.records) == {b"v\x00m": b"added", b"w\x00m": b"kept"}
        assert dict(acl.records) == {}

    run(pg_server, schema, again)
