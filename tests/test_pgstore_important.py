"""pgstore.important on a throwaway PostgreSQL (the embedded engine's rules:
tablets/important.py, tests/test_important_retention.py):

- a named group holds retention at its committed offset, from the log start
  where it never committed, nowhere once released; other groups, and a topic
  without the delete policy, hold nothing;
- what each group holds back (bytes, age) read from ``batches``;
- the ceiling (gateway.important.consumer.max.bytes): retention passes the
  groups as far as needed to keep the ceiling, never past ``due``; each pass
  is logged and counted;
- the report: committed offset, released, live lag, held figures, passes.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg
import pytest

from pgstore.consumer_offsets import PgConsumerOffsets
from pgstore.important import PgImportantConsumers, RetentionView
from pgstore.migrate import migrate
from pgstore.writer import PgWriter
from tablets.seam import OffsetCommit
from testkit import postgres
from testkit.postgres import PostgresServer

pg_server = postgres.server_fixture("module")
SCHEMA = "important"
T = TypeVar("T")
BATCH_SIZE = 100
NOW = 10_000_000


def run(pg: PostgresServer, body: Callable[[PgConsumerOffsets, asyncpg.Connection, int],
                                           Awaitable[T]]) -> T:
    """``body(offsets, conn, log_id)`` over a partition of ten batches of ten
    records (offsets 0..99), 100 bytes each, batch b's max timestamp 1000 + b."""

    async def main() -> T:
        conn = await asyncpg.connect(pg.dsn)
        writer = PgWriter(pg.dsn)
        await writer.start()
        try:
            await conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
            await migrate(conn, SCHEMA)
            topic_id = uuid.uuid4()
            await conn.execute(f"INSERT INTO {SCHEMA}.topics (topic_id, name, created_ms) "
                               "VALUES ($1, 't', 0)", topic_id)
            log_id = int(await conn.fetchval(
                f"INSERT INTO {SCHEMA}.partitions (topic_id, partition, log_end_offset, "
                "size_bytes) VALUES ($1, 0, 100, $2) RETURNING log_id", topic_id,
                10 * BATCH_SIZE))
            for base in range(0, 100, 10):
                data_id = await conn.fetchval(
                    f"INSERT INTO {SCHEMA}.batch_data (log_id, data) VALUES ($1, $2) "
                    "RETURNING data_id", log_id, b"x" * BATCH_SIZE)
                await conn.execute(
                    f"INSERT INTO {SCHEMA}.batches (log_id, base_offset, last_offset, "
                    "max_timestamp, running_max_timestamp, size, data_id) "
                    "VALUES ($1, $2, $3, $4, $4, $5, $6)",
                    log_id, base, base + 9, 1000 + base, BATCH_SIZE, data_id)
            offsets = PgConsumerOffsets(writer, SCHEMA)
            await offsets.load(conn)
            return await body(offsets, conn, log_id)
        finally:
            await writer.close()
            await conn.close()

    return asyncio.run(main())


def view(log_id: int, groups: tuple[str, ...] = ("billing", "audit"), log_start: int = 0,
         deletes: bool = True, max_bytes: int = -1) -> RetentionView:
    return RetentionView("t", 0, log_id, log_start, 100, 10 * BATCH_SIZE, groups, deletes,
                         max_bytes)


def test_who_holds_and_what_they_hold_back(pg_server: PostgresServer) -> None:
    async def body(offsets: PgConsumerOffsets, conn: asyncpg.Connection, log_id: int) -> None:
        important = PgImportantConsumers(offsets, SCHEMA)
        offsets.is_important = lambda group, topic: group in ("billing", "audit")
        # Neither committed: both hold from the log start.
        assert important.holds(view(log_id, log_start=5)) == {"billing": 5, "audit": 5}
        await offsets.commit("billing", {("t", 0): OffsetCommit(35)}, 0)
        await offsets.commit("other", {("t", 0): OffsetCommit(1)}, 0)  # not named: no hold
        assert important.holds(view(log_id)) == {"billing": 35, "audit": 0}
        assert important.holds(view(log_id, log_start=50)) == {"billing": 50, "audit": 50}
        assert important.holds(view(log_id, deletes=False)) == {}
        # Retention is due up to offset 80: audit (never committed) holds it at 0.
        assert await important.hold_back(conn, view(log_id), 80, NOW) == 0
        report = {r.group: r for r in important.report([view(log_id)])}
        # billing holds the batches 30..79 (last offset >= 35, < 80), audit 0..79.
        assert (report["billing"].held_bytes, report["billing"].held_age_ms) == (
            5 * BATCH_SIZE, NOW - 1030)
        assert (report["audit"].held_bytes, report["audit"].held_age_ms) == (
            8 * BATCH_SIZE, NOW - 1000)
        assert (report["billing"].committed, report["billing"].lag) == (35, 65)
        assert (report["audit"].committed, report["audit"].lag) == (None, 100)
        assert not report["audit"].released and report["audit"].passed == 0
        # audit's offsets deleted (an operator's DeleteGroups): it holds nothing.
        await offsets.commit("audit", {("t", 0): OffsetCommit(60)}, 0)
        await offsets.delete("audit")
        assert important.holds(view(log_id)) == {"billing": 35}
        assert await important.hold_back(conn, view(log_id), 80, NOW) == 35
        report = {r.group: r for r in important.report([view(log_id)])}
        assert report["audit"].released and report["audit"].lag == 0
        assert report["audit"].held_bytes == 0
        # Nothing held before due: retention goes all the way, and the figures leave.
        await offsets.commit("billing", {("t", 0): OffsetCommit(90)}, 0)
        assert await important.hold_back(conn, view(log_id), 80, NOW) == 80
        assert {r.group: r.held_bytes for r in important.report([view(log_id)])} == {
            "billing": 0, "audit": 0}

    run(pg_server, body)


def test_the_ceiling_passes_groups_logs_and_counts(
        pg_server: PostgresServer, caplog: pytest.LogCaptureFixture) -> None:
    async def body(offsets: PgConsumerOffsets, conn: asyncpg.Connection, log_id: int) -> None:
        important = PgImportantConsumers(offsets, SCHEMA)
        await offsets.commit("billing", {("t", 0): OffsetCommit(35)}, 0)
        await offsets.commit("audit", {("t", 0): OffsetCommit(75)}, 0)
        # 1000 bytes over a ceiling of 300: keeping at least 300 bytes means from
        # the batch at 70 (Kafka's retention.bytes rule), before due (80).
        capped = view(log_id, max_bytes=300)
        with caplog.at_level(logging.WARNING, logger="pgstore.important"):
            assert await important.hold_back(conn, capped, 80, NOW) == 70
        assert "retention passed important consumer group billing on t-0: offsets 35..69" in (
            caplog.text)
        assert "audit" not in caplog.text
        report = {r.group: r for r in important.report([capped])}
        assert (report["billing"].passed, report["billing"].records_passed) == (1, 35)
        assert (report["audit"].passed, report["audit"].records_passed) == (0, 0)
        assert report["billing"].held_bytes == BATCH_SIZE  # the batch 70..79
        # Never past due: a ceiling of 0 still keeps from 80.
        assert await important.hold_back(conn, view(log_id, max_bytes=0), 80, NOW) == 80
        # A ceiling the partition is within holds as without one.
        assert await important.hold_back(conn, view(log_id, max_bytes=5000), 80, NOW) == 35
        important.forget("t")
        assert {r.group: r.passed for r in important.report([capped])} == {
            "billing": 0, "audit": 0}

    run(pg_server, body)
