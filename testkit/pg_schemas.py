"""Per-test namespaces on a throwaway PostgreSQL (``testkit.postgres``): a fresh
schema migrated to this code's version, and connections a test can find (and
kill) by their application name."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable

import asyncpg

from pgstore.migrate import migrate
from testkit.postgres import PostgresServer

_numbers = itertools.count()


def migrated_schema(pg: PostgresServer, prefix: str) -> str:
    """A schema no other test uses, migrated (``prefix`` + a number)."""
    schema = f"{prefix}{next(_numbers)}"

    async def main() -> None:
        conn = await asyncpg.connect(pg.dsn)
        try:
            await migrate(conn, schema)
        finally:
            await conn.close()

    asyncio.run(main())
    return schema


def connect_as(application: str) -> Callable[[str], Awaitable[asyncpg.Connection]]:
    """A connect function (for ``PgWriter``) whose sessions carry
    ``application`` as their application_name in ``pg_stat_activity``."""

    async def connect(dsn: str) -> asyncpg.Connection:
        return await asyncpg.connect(dsn, server_settings={"application_name": application})

    return connect
