"""Faults of a PostgreSQL connection, for tests of pgstore's writer and engine.

    opened: list[FlakyConnection] = []
    writer = PgWriter(dsn, connect=flaky(opened))
    ...
    opened[0].fail_commit = ConnectionResetError("lost")   # after PostgreSQL committed
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import asyncpg


class FlakyConnection:
    """A real connection whose next statement (or next COMMIT) raises once."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.fail_statement: BaseException | None = None
        self.fail_commit: BaseException | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)

    def _statement(self) -> None:
        if self.fail_statement is not None:
            error, self.fail_statement = self.fail_statement, None
            raise error

    async def execute(self, *args: Any) -> str:
        self._statement()
        return await self.conn.execute(*args)

    async def executemany(self, *args: Any) -> None:
        self._statement()
        await self.conn.executemany(*args)

    async def fetch(self, *args: Any) -> list[asyncpg.Record]:
        self._statement()
        return await self.conn.fetch(*args)

    async def fetchrow(self, *args: Any) -> asyncpg.Record | None:
        self._statement()
        return await self.conn.fetchrow(*args)

    def transaction(self) -> Any:
        outer = self

        class Transaction:
            async def __aenter__(self) -> None:
                self.inner = outer.conn.transaction()
                await self.inner.__aenter__()

            async def __aexit__(self, *exc: Any) -> bool | None:
                result = await self.inner.__aexit__(*exc)
                if exc[0] is None and outer.fail_commit is not None:
                    error, outer.fail_commit = outer.fail_commit, None
                    raise error  # after PostgreSQL committed: the answer was "lost"
                return result

        return Transaction()


def flaky(opened: list[FlakyConnection]) -> Callable[..., Any]:
    async def connect(dsn: str) -> FlakyConnection:
        conn = FlakyConnection(await asyncpg.connect(dsn))
        opened.append(conn)
        return conn

    return connect
