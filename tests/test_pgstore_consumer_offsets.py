"""pgstore.consumer_offsets on a throwaway PostgreSQL: the behaviours of
tests/test_consumer_offsets.py (the embedded engine), plus what a database
adds:

- commits survive a restart (a new instance loading what the first wrote)
  with every field, the committer of a transaction's commit included;
- versions grow with every commit, in submission order, and are never
  reused, not even after a deletion and a restart;
- a commit is visible once durable; concurrent commits resolve in order and
  the newest wins, also when published out of order;
- a deletion orders with the commits in flight around it; an important
  group's deletion leaves a released marker that survives a restart and its
  next commit clears;
- a deleted topic's offsets leave every group;
- a commit whose connection is killed (pg_terminate_backend) while it runs
  publishes nothing, and the next one lands.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import asyncpg
import pytest

from pgstore.consumer_offsets import PgConsumerOffsets, stage_offsets
from pgstore.writer import PgWriter
from tablets.errors import StorageError
from tablets.seam import CommittedOffset, OffsetCommit
from testkit import postgres
from testkit.pg_schemas import connect_as, migrated_schema
from testkit.postgres import PostgresServer

pg_server = postgres.server_fixture("module")
T = TypeVar("T")
APP = "offsets-writer"

Body = Callable[[PgConsumerOffsets, PgWriter, asyncpg.Connection], Awaitable[T]]


def run(pg: PostgresServer, schema: str, body: Body[T]) -> T:
    """Run ``body`` against a fresh instance that loaded ``schema``, then close it."""

    async def main() -> T:
        admin = await asyncpg.connect(pg.dsn)
        writer = PgWriter(pg.dsn, connect=connect_as(APP))
        await writer.start()
        try:
            offsets = PgConsumerOffsets(writer, schema)
            await offsets.load(admin)
            return await body(offsets, writer, admin)
        finally:
            await writer.close()
            await admin.close()

    return asyncio.run(main())


async def rows(admin: asyncpg.Connection, schema: str, table: str) -> list[tuple[Any, ...]]:
    order = "group_id, topic, partition"
    return [tuple(r) for r in await admin.fetch(f"SELECT * FROM {schema}.{table} ORDER BY {order}")]


def test_commits_survive_a_restart_with_every_field(pg_server: PostgresServer) -> None:
    schema = migrated_schema(pg_server, "offsets")

    async def write(offsets: PgConsumerOffsets, writer: PgWriter,
                    admin: asyncpg.Connection) -> dict[tuple[str, int], CommittedOffset]:
        await offsets.commit("g", {("t", 0): OffsetCommit(10, 3, "meta-é"),
                                   ("t", 1): OffsetCommit(20)}, now_ms=1234, member="m-1")
        await offsets.commit("other", {("u", 5): OffsetCommit(7)}, now_ms=99)
        # A transaction's commit: staged into a change carrying its other statements.
        change = writer.begin()
        change.execute(f"INSERT INTO {schema}.counters (name, value) VALUES ('txn', 1)")
        staged = stage_offsets(offsets, change, "txn-group", {("t", 0): OffsetCommit(4)}, 55,
                               "tid-1", {("t", 0): "m-2"})
        change.on_durable(lambda: offsets.publish("txn-group", staged))
        assert offsets.committed("txn-group", "t", 0) is None  # not durable yet
        await writer.commit(change)
        assert offsets.committed("txn-group", "t", 0) == staged[("t", 0)]
        assert staged[("t", 0)].committer == "tid-1" and staged[("t", 0)].member == "m-2"
        assert offsets.committed("g", "t", 0).member == "m-1"  # type: ignore[union-attr]
        return offsets.group_offsets("g") | offsets.group_offsets("txn-group")

    before = run(pg_server, schema, write)

    async def reread(offsets: PgConsumerOffsets, writer: PgWriter,
                     admin: asyncpg.Connection) -> None:
        # The member too (migration 5: the offset-range check's exceptions
        # need it on whichever gateway reads the row).
        assert offsets.group_offsets("g") | offsets.group_offsets("txn-group") == before
        assert {r.member for r in before.values()} == {"m-1", "m-2"}
        first = offsets.committed("g", "t", 0)
        assert first is not None
        assert (first.offset, first.leader_epoch, first.metadata, first.commit_timestamp) == (
            10, 3, "meta-é", 1234)
        assert offsets.committed("g", "t", 1).metadata == ""  # type: ignore[union-attr]
        assert offsets.committed("txn-group", "t", 0).committer == "tid-1"  # type: ignore[union-attr]
        assert sorted(offsets.groups()) == ["g", "other", "txn-group"]
        assert offsets.has_offsets("g") and not offsets.has_offsets("nobody")
        assert offsets.committed("g", "t", 2) is None
        assert offsets.version("g", "t", 2) == 0
        assert offsets.last_version == max(r.version for r in before.values())

    run(pg_server, schema, reread)


def test_versions_grow_with_every_commit_and_are_never_reused(pg_server: PostgresServer) -> None:
    schema = migrated_schema(pg_server, "offsets")

    async def first(offsets: PgConsumerOffsets, writer: PgWriter,
                    admin: asyncpg.Connection) -> int:
        seen = []
        for offset in range(3):
            await offsets.commit("g", {("t", 0): OffsetCommit(offset)}, now_ms=0)
            seen.append(offsets.version("g", "t", 0))
        assert seen == sorted(set(seen)) and seen[0] > 0
        assert offsets.last_version == seen[-1]
        await offsets.delete("g")
        assert offsets.version("g", "t", 0) == 0
        assert await rows(admin, schema, "consumer_offsets") == []
        return seen[-1]

    last = run(pg_server, schema, first)

    async def after_restart(offsets: PgConsumerOffsets, writer: PgWriter,
                            admin: asyncpg.Connection) -> None:
        assert offsets.last_version == last  # from the counter row: no offset row is left
        await offsets.commit("g", {("t", 0): OffsetCommit(0)}, now_ms=0)
        assert offsets.version("g", "t", 0) > last

    run(pg_server, schema, after_restart)


def test_a_commit_becomes_visible_once_durable_and_newest_wins(
        pg_server: PostgresServer) -> None:
    schema = migrated_schema(pg_server, "offsets")

    async def body(offsets: PgConsumerOffsets, writer: PgWriter,
                   admin: asyncpg.Connection) -> None:
        older = asyncio.ensure_future(offsets.commit("g", {("t", 0): OffsetCommit(1)}, 0))
        newer = asyncio.ensure_future(offsets.commit("g", {("t", 0): OffsetCommit(2)}, 0))
        await asyncio.sleep(0)  # both staged, neither written yet
        assert offsets.committed("g", "t", 0) is None
        assert offsets.latest("g", "t", 0).offset == 2  # type: ignore[union-attr]
        await asyncio.gather(older, newer)
        assert offsets.committed("g", "t", 0).offset == 2  # type: ignore[union-attr]
        # Published out of order (e.g. by a transaction), the later stage still wins.
        first_change, second_change = writer.begin(), writer.begin()
        first = offsets.stage("g", {("t", 0): OffsetCommit(5)}, 0, first_change)
        second = offsets.stage("g", {("t", 0): OffsetCommit(6)}, 0, second_change)
        await writer.commit(first_change)
        await writer.commit(second_change)
        offsets.publish("g", second)
        offsets.publish("g", first)
        assert offsets.committed("g", "t", 0).offset == 6  # type: ignore[union-attr]
        assert [r[3] for r in await rows(admin, schema, "consumer_offsets")] == [6]

    run(pg_server, schema, body)


def test_concurrent_commits_resolve_in_order(pg_server: PostgresServer) -> None:
    schema = migrated_schema(pg_server, "offsets")

    async def body(offsets: PgConsumerOffsets, writer: PgWriter,
                   admin: asyncpg.Connection) -> None:
        seen_at_resolution: list[tuple[int, int]] = []

        async def commit(offset: int) -> None:
            await offsets.commit("g", {("t", offset % 2): OffsetCommit(offset)}, 0)
            # Visible once acknowledged: this commit, or one submitted after it.
            visible = offsets.committed("g", "t", offset % 2)
            assert visible is not None and visible.offset >= offset
            seen_at_resolution.append((offset, visible.version))

        await asyncio.gather(*(commit(offset) for offset in range(100)))
        assert [o for o, _ in seen_at_resolution] == list(range(100))  # submission order
        assert offsets.committed("g", "t", 0).offset == 98  # type: ignore[union-attr]
        assert offsets.committed("g", "t", 1).offset == 99  # type: ignore[union-attr]
        # Versions follow submission order, the database's rows say the same.
        db = {(r[1], r[2]): (r[3], r[7]) for r in await rows(admin, schema, "consumer_offsets")}
        assert db == {("t", 0): (98, offsets.version("g", "t", 0)),
                      ("t", 1): (99, offsets.version("g", "t", 1))}
        assert offsets.version("g", "t", 1) == offsets.last_version
        assert writer.stats.writes < 100  # grouped: the premise of "concurrent"

    run(pg_server, schema, body)


def test_delete_orders_with_commits_in_flight(pg_server: PostgresServer) -> None:
    schema = migrated_schema(pg_server, "offsets")

    async def body(offsets: PgConsumerOffsets, writer: PgWriter,
                   admin: asyncpg.Connection) -> None:
        await offsets.commit("g", {("t", 0): OffsetCommit(1), ("t", 1): OffsetCommit(1)}, 0)
        before = asyncio.ensure_future(offsets.commit("g", {("t", 0): OffsetCommit(2)}, 0))
        await asyncio.sleep(0)
        deleting = asyncio.ensure_future(offsets.delete("g"))
        await asyncio.sleep(0)
        after = asyncio.ensure_future(offsets.commit("g", {("t", 1): OffsetCommit(3)}, 0))
        _, deleted, _ = await asyncio.gather(before, deleting, after)
        assert deleted == 2
        # The commit staged before the deletion is gone; the one after it stays.
        assert offsets.group_offsets("g").keys() == {("t", 1)}
        assert offsets.committed("g", "t", 1).offset == 3  # type: ignore[union-attr]
        assert await offsets.delete("g", [("t", 9)]) == 0
        assert [(r[1], r[2], r[3]) for r in await rows(admin, schema, "consumer_offsets")] == [
            ("t", 1, 3)]
        # Some partitions only.
        await offsets.commit("g", {("t", 2): OffsetCommit(8)}, 0)
        assert await offsets.delete("g", [("t", 2), ("t", 7)]) == 1
        assert offsets.group_offsets("g").keys() == {("t", 1)}

    run(pg_server, schema, body)

    async def reread(offsets: PgConsumerOffsets, writer: PgWriter,
                     admin: asyncpg.Connection) -> None:
        assert offsets.group_offsets("g").keys() == {("t", 1)}
        assert not offsets.is_released("g", "t", 1)  # not an important group

    run(pg_server, schema, reread)


def test_an_important_groups_deletion_releases_it_until_it_commits_again(
        pg_server: PostgresServer) -> None:
    schema = migrated_schema(pg_server, "offsets")

    def important(group: str, topic: str | None) -> bool:
        return group == "imp" and topic in (None, "t")

    async def body(offsets: PgConsumerOffsets, writer: PgWriter,
                   admin: asyncpg.Connection) -> None:
        offsets.is_important = important
        await offsets.commit("imp", {("t", 0): OffsetCommit(5), ("u", 0): OffsetCommit(5)}, 0)
        assert await offsets.delete("imp", [("t", 0), ("u", 0)]) == 2
        # Only the topic it is important on is released.
        assert offsets.is_released("imp", "t", 0) and not offsets.is_released("imp", "u", 0)
        assert await rows(admin, schema, "released_offsets") == [("imp", "t", 0)]
        # A whole group without offsets still leaves its marker.
        assert await offsets.delete("imp") == 0
        assert offsets.is_released("imp", "t", 3)
        assert await rows(admin, schema, "released_offsets") == [
            ("imp", "", -1), ("imp", "t", 0)]
        # Not an important group: no marker.
        await offsets.commit("plain", {("t", 0): OffsetCommit(1)}, 0)
        await offsets.delete("plain")
        assert not offsets.is_released("plain", "t", 0)

    run(pg_server, schema, body)

    async def after_restart(offsets: PgConsumerOffsets, writer: PgWriter,
                            admin: asyncpg.Connection) -> None:
        offsets.is_important = important
        assert offsets.is_released("imp", "t", 0) and offsets.is_released("imp", "t", 5)
        # A commit staged while a release is in flight lands after it, and wins.
        releasing = asyncio.ensure_future(offsets.delete("imp", None))
        await asyncio.sleep(0)
        await asyncio.gather(releasing, offsets.commit("imp", {("t", 0): OffsetCommit(9)}, 0))
        assert not offsets.is_released("imp", "t", 0)
        assert not offsets.is_released("imp", "t", 5)
        assert await rows(admin, schema, "released_offsets") == []
        assert offsets.committed("imp", "t", 0).offset == 9  # type: ignore[union-attr]

    run(pg_server, schema, after_restart)

    async def again(offsets: PgConsumerOffsets, writer: PgWriter,
                    admin: asyncpg.Connection) -> None:
        assert not offsets.is_released("imp", "t", 0)
        assert offsets.committed("imp", "t", 0).offset == 9  # type: ignore[union-attr]

    run(pg_server, schema, again)


def test_deleting_a_topic_drops_its_offsets_in_every_group(pg_server: PostgresServer) -> None:
    schema = migrated_schema(pg_server, "offsets")

    async def body(offsets: PgConsumerOffsets, writer: PgWriter,
                   admin: asyncpg.Connection) -> None:
        offsets.is_important = lambda group, topic: group == "a"
        for group in ("a", "b"):
            await offsets.commit(group, {("doomed", 0): OffsetCommit(5),
                                         ("kept", 0): OffsetCommit(6)}, 0)
        await offsets.commit("only-doomed", {("doomed", 0): OffsetCommit(1)}, 0)
        await offsets.commit("a", {("doomed", 1): OffsetCommit(1)}, 0)
        await offsets.delete("a", [("doomed", 1)])
        assert offsets.is_released("a", "doomed", 1)
        change = writer.begin()
        offsets.drop_topic("doomed", change)
        await writer.commit(change)
        assert {g: set(offsets.group_offsets(g)) for g in offsets.groups()} == {
            "a": {("kept", 0)}, "b": {("kept", 0)}}
        assert not offsets.is_released("a", "doomed", 1)

    run(pg_server, schema, body)

    async def reread(offsets: PgConsumerOffsets, writer: PgWriter,
                     admin: asyncpg.Connection) -> None:
        assert sorted(offsets.groups()) == ["a", "b"]
        assert offsets.committed("a", "doomed", 0) is None
        assert not offsets.is_released("a", "doomed", 1)

    run(pg_server, schema, reread)


def test_a_commit_whose_connection_is_killed_publishes_nothing(
        pg_server: PostgresServer) -> None:
    schema = migrated_schema(pg_server, "offsets")

    async def body(offsets: PgConsumerOffsets, writer: PgWriter,
                   admin: asyncpg.Connection) -> None:
        await offsets.commit("g", {("t", 0): OffsetCommit(1)}, 0)
        version = offsets.version("g", "t", 0)
        # Hold the table so the next commit waits inside its transaction.
        blocker = await asyncpg.connect(pg_server.dsn)
        try:
            blocking = blocker.transaction()
            await blocking.start()
            await blocker.execute(f"LOCK TABLE {schema}.consumer_offsets IN EXCLUSIVE MODE")
            failing = asyncio.ensure_future(offsets.commit("g", {("t", 0): OffsetCommit(2)}, 0))
            for _ in range(200):  # until the writer waits on the lock (at most 20 s)
                waiting = await admin.fetchval(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = $1 "
                    "AND wait_event_type = 'Lock'", APP)
                if waiting is not None:
                    break
                await asyncio.sleep(0.1)
            assert waiting is not None, "the commit never waited on the lock"
            assert offsets.latest("g", "t", 0).offset == 2  # type: ignore[union-attr]
            assert await admin.fetchval("SELECT pg_terminate_backend($1)", waiting)
            with pytest.raises(StorageError):
                await asyncio.wait_for(failing, 30)
            await blocking.rollback()
        finally:
            await blocker.close()
        # Nothing published: neither visible, nor counted by the conflict check.
        assert offsets.committed("g", "t", 0).offset == 1  # type: ignore[union-attr]
        assert offsets.latest("g", "t", 0).offset == 1  # type: ignore[union-attr]
        assert offsets.version("g", "t", 0) == version
        assert [r[3] for r in await rows(admin, schema, "consumer_offsets")] == [1]
        # The writer reconnects; the next commit lands with a newer version.
        await offsets.commit("g", {("t", 0): OffsetCommit(3)}, 0)
        assert offsets.committed("g", "t", 0).offset == 3  # type: ignore[union-attr]
        assert offsets.version("g", "t", 0) > version
        assert writer.connects == 2

    run(pg_server, schema, body)


def test_load_group_reads_another_gateways_commits(pg_server: PostgresServer) -> None:
    schema = migrated_schema(pg_server, "offsets")

    async def body(offsets: PgConsumerOffsets, writer: PgWriter,
                   admin: asyncpg.Connection) -> None:
        other = PgConsumerOffsets(writer, schema)  # another gateway's view, loaded now
        await other.load(admin)
        for offset in range(5):
            await offsets.commit("g", {("t", 0): OffsetCommit(offset)}, 0)
        assert other.committed("g", "t", 0) is None
        before = other.last_version
        await other.load_group(admin, "g")
        seen = other.committed("g", "t", 0)
        assert seen is not None
        assert (seen.offset, seen.leader_epoch, seen.metadata, seen.commit_timestamp) == (
            4, -1, "", 0)
        # Seen as committed now: a version of other's counter, above all it had.
        assert seen.version > max(before, offsets.version("g", "t", 0))
        assert other.last_version == seen.version
        await other.load_group(admin, "g")  # unchanged since: the same record
        assert other.committed("g", "t", 0) is seen
        await other.commit("g", {("t", 0): OffsetCommit(9)}, 0)
        assert other.version("g", "t", 0) > seen.version

    run(pg_server, schema, body)


class Conflict(Exception):
    pass


def test_two_gateways_racing_on_one_partition_exactly_one_wins(
        pg_server: PostgresServer) -> None:
    schema = migrated_schema(pg_server, "offsets")

    async def body(a: PgConsumerOffsets, writer_a: PgWriter, admin: asyncpg.Connection) -> None:
        writer_b = PgWriter(pg_server.dsn)
        await writer_b.start()
        try:
            b = PgConsumerOffsets(writer_b, schema)  # the other gateway, same view
            await b.load(admin)

            async def fenced(offsets: PgConsumerOffsets, writer: PgWriter, offset: int,
                             hold: float = 0.0) -> None:
                change = writer.begin()
                staged = stage_offsets(offsets, change, "g", {("t", 0): OffsetCommit(offset)},
                                       0, f"tid-{offset}", None,
                                       refused=lambda: Conflict(f"offset {offset} lost"))
                if hold:  # the rest of a transaction's commit, while the row is held
                    change.execute("SELECT pg_sleep($1)", hold)
                change.on_durable(lambda: offsets.publish("g", staged))
                try:
                    await writer.commit(change)
                except Exception:
                    offsets.forget("g", staged)
                    raise

            # 1. No row yet, both views say so: a inserts and holds its
            # transaction open; b's insert waits on a's row, then finds it.
            first = asyncio.ensure_future(fenced(a, writer_a, 10, hold=1.0))
            for _ in range(200):  # until a sleeps inside its transaction (at most 20 s)
                if await admin.fetchval("SELECT count(*) FROM pg_stat_activity "
                                        "WHERE wait_event = 'PgSleep'"):
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("a's commit never reached its sleep")
            second = asyncio.ensure_future(fenced(b, writer_b, 20))
            results = await asyncio.gather(first, second, return_exceptions=True)
            assert results[0] is None
            assert isinstance(results[1], Conflict), results
            assert [(r[3], r[8]) for r in await rows(admin, schema, "consumer_offsets")] == [
                (10, "tid-10")]
            assert b.latest("g", "t", 0) is None  # the loser published nothing
            # 2. A row both views know: a moves it, then b (stale) is refused at
            # its first step, without a rollback of anything else.
            await b.load_group(admin, "g")
            await fenced(a, writer_a, 30)
            with pytest.raises(Conflict):
                await fenced(b, writer_b, 40)
            assert [r[3] for r in await rows(admin, schema, "consumer_offsets")] == [30]
            # 3. Simultaneous, from one view: exactly one of them lands.
            await b.load_group(admin, "g")
            outcomes = await asyncio.gather(fenced(a, writer_a, 50), fenced(b, writer_b, 60),
                                            return_exceptions=True)
            assert sorted(type(o).__name__ for o in outcomes) == ["Conflict", "NoneType"]
            winner = 50 if outcomes[0] is None else 60
            assert [r[3] for r in await rows(admin, schema, "consumer_offsets")] == [winner]
            # The winner's own next commit, from its view, lands.
            await fenced(a if winner == 50 else b, writer_a if winner == 50 else writer_b, 70)
            assert [r[3] for r in await rows(admin, schema, "consumer_offsets")] == [70]
        finally:
            await writer_b.close()

    run(pg_server, schema, body)
