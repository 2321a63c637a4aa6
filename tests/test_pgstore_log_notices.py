"""pgstore.log_notices: log ends announced by committed changes reach every
listener, in commit order; a rolled-back change announces nothing; a lost
listening connection is reopened and followed by a resync."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import asyncpg
import pytest

from pgstore.log_notices import LogEnd, LogNotices, announce_log_end, channel
from pgstore.writer import PgWriter
from testkit import postgres
from testkit.postgres import PostgresServer

pg_server = postgres.server_fixture("module")
SCHEMA = "notices"


async def until(predicate: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


class Heard:
    def __init__(self) -> None:
        self.ends: list[tuple[int, int]] = []
        self.resyncs = 0

    def log_end(self, notice: LogEnd) -> None:
        self.ends.append((notice.log_id, notice.end))

    async def resync(self) -> None:
        self.resyncs += 1


def test_committed_changes_are_heard_in_commit_order_by_every_listener(
        pg_server: PostgresServer) -> None:
    async def main() -> None:
        heard = [Heard(), Heard()]
        listeners = [LogNotices(pg_server.dsn, SCHEMA, h.log_end, h.resync) for h in heard]
        for listener in listeners:
            await listener.start()
        writer = PgWriter(pg_server.dsn)
        await writer.start()
        try:
            assert [h.resyncs for h in heard] == [1, 1]  # the first LISTEN resyncs too
            for end in range(1, 51):
                change = writer.begin()
                announce_log_end(change, SCHEMA, LogEnd(7, end - 1, end))
                await writer.commit(change)
            # One group of several changes: one transaction, notices in order.
            changes = []
            for end in range(51, 61):
                change = writer.begin()
                announce_log_end(change, SCHEMA, LogEnd(8, end - 1, end))
                changes.append(writer.commit(change))
            await asyncio.gather(*changes)
            for h in heard:
                await until(lambda h=h: len(h.ends) == 60)
                assert h.ends == [(7, e) for e in range(1, 51)] + [(8, e) for e in range(51, 61)]
        finally:
            await writer.close()
            for listener in listeners:
                await listener.close()

    asyncio.run(main())


def test_a_refused_change_announces_nothing(pg_server: PostgresServer) -> None:
    async def main() -> None:
        heard = Heard()
        listener = LogNotices(pg_server.dsn, SCHEMA, heard.log_end, heard.resync)
        await listener.start()
        writer = PgWriter(pg_server.dsn)
        await writer.start()
        try:
            refused = writer.begin()
            announce_log_end(refused, SCHEMA, LogEnd(1, 98, 99))
            refused.fence("SELECT 1 WHERE false", refused=lambda: RuntimeError("moved"))
            kept = writer.begin()
            announce_log_end(kept, SCHEMA, LogEnd(1, 4, 5))
            results = await asyncio.gather(writer.commit(refused), writer.commit(kept),
                                           return_exceptions=True)
            assert isinstance(results[0], RuntimeError) and results[1] is None
            await until(lambda: heard.ends == [(1, 5)])
            await asyncio.sleep(0.2)  # nothing more arrives
            assert heard.ends == [(1, 5)]
        finally:
            await writer.close()
            await listener.close()

    asyncio.run(main())


def test_a_lost_connection_is_reopened_and_resynced(pg_server: PostgresServer) -> None:
    async def main() -> None:
        heard = Heard()
        listener = LogNotices(pg_server.dsn, SCHEMA, heard.log_end, heard.resync)
        await listener.start()
        admin = await asyncpg.connect(pg_server.dsn)
        try:
            killed = await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE pid <> pg_backend_pid() AND query LIKE 'LISTEN%'")
            assert killed == 1  # the fault landed: the listening backend is gone
            await until(lambda: listener.connects == 2 and heard.resyncs == 2)
            await admin.execute("SELECT pg_notify($1, '3:29:30:0:-1')", channel(SCHEMA))
            await until(lambda: heard.ends == [(3, 30)])
            await admin.execute("SELECT pg_notify($1, 'garbage')", channel(SCHEMA))
            await admin.execute("SELECT pg_notify($1, '3:30:31:0:-1')", channel(SCHEMA))
            await until(lambda: heard.ends == [(3, 30), (3, 31)])
            assert listener.malformed == 1
        finally:
            await admin.close()
            await listener.close()

    asyncio.run(main())


def test_a_wrong_url_fails_at_start(pg_server: PostgresServer) -> None:
    async def main() -> None:
        heard = Heard()
        listener = LogNotices(pg_server.dsn.replace(str(pg_server.port), "1"), SCHEMA,
                              heard.log_end, heard.resync)
        with pytest.raises(OSError):
            await listener.start()

    asyncio.run(main())
