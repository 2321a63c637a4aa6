"""Committed consumer offsets on PostgreSQL: the ``ConsumerOffsetStore`` of
the PostgreSQL engine (the embedded one: ``tablets/consumer_offsets.py``).

One ``consumer_offsets`` row per (group, topic, partition) with the offset,
its leader epoch, the client's metadata, the commit timestamp, the version
and the committer (a transactional id, or ''); ``released_offsets`` rows mark
an important group whose offsets an operator deleted (topic '' and partition
-1: the whole group).

Every offset is loaded into memory at start-up (``load``); reads never touch
the database. A commit is one ``PgChange`` through the group-commit writer,
published (visible to reads) by its ``on_durable`` callback: once PostgreSQL
committed it, and in submission order. A commit that fails (the connection
lost, the change refused) publishes nothing, and ``latest`` forgets it.

Versions are taken in memory when a commit is staged, in call order, from
one counter, as in the embedded engine: a (group, partition)'s version grows
with every commit to it, and ``txn/conflicts.py`` compares them with the
``last_version`` a transaction began at. They are never reused: each row
carries its version, and a deletion first raises the ``counters`` row
``consumer.offsets.version`` to the newest version taken, so ``load`` (the
greater of that row and the newest row) starts above every version any
commit landed with. Commits themselves do not write the counter row, so
gateways committing offsets of different groups never wait on one row lock.

Versions follow commit order within one gateway (submission order is commit
order). Across gateways each has its own counter; a gateway taking over a
group's coordination reads that group again (``load_group``), which lifts
its counter above the group's versions. How a transaction's *begin* version
is settled across gateways is the transaction work's (docs/cluster-design.md,
"Offsets written by a commit that crosses gateways"). What it needs from here
is ``stage`` with ``refused``: a compare-and-set that lands the offsets only
if each row is, under its row lock, at the version this gateway's memory
says, so a conflict check run on that memory holds inside the transaction;
of two gateways committing one partition from one view, exactly one wins.

Important consumers (``tablets/important.py``) read ``committed`` and
``is_released``, as with the embedded engine.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping

import asyncpg

from tablets.offset_state import OffsetState
from tablets.seam import CommittedOffset, OffsetCommit, TopicPartition

from .migrate import quoted
from .offset_statements import OffsetStatements
from .schema import DEFAULT_SCHEMA
from .writer import PgChange, PgWriter

VERSION_COUNTER = "consumer.offsets.version"
# released_offsets' row for a whole group.
WHOLE_GROUP = ("", -1)



# PostgreSQL's text holds no NUL character, which a client's metadata may
# carry (confluent-kafka sends the C string's terminator with it): the
# metadata is stored escaped: a backslash doubled, NUL as a backslash and "0".
_UNESCAPE = re.compile(r"\\(\\|0)")


def to_text(value: str) -> str:
    """``value`` as PostgreSQL's text can hold it."""
    return value.replace("\\", "\\\\").replace("\x00", "\\0")


def from_text(stored: str) -> str:
    """The value ``to_text`` gave ``stored`` for."""
    return _UNESCAPE.sub(lambda m: "\\" if m.group(1) == "\\" else "\x00", stored)


class PgConsumerOffsets(OffsetState):
    def __init__(self, writer: PgWriter, schema: str = DEFAULT_SCHEMA) -> None:
        super().__init__()
        self.writer = writer
        self.schema = schema
        self._sql = OffsetStatements(quoted(schema))

    # ------------------------------------------------------------ loading
    async def load(self, conn: asyncpg.Connection) -> None:
        """Read every committed offset and release (start-up)."""
        s = quoted(self.schema)
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            counter = await conn.fetchval(
                f"SELECT value FROM {s}.counters WHERE name = $1", VERSION_COUNTER)
            rows = await conn.fetch(f"SELECT * FROM {s}.consumer_offsets")
            released = await conn.fetch(
                f"SELECT group_id, topic, partition FROM {s}.released_offsets")
        self.clear()
        self.versions_from(int(counter or 0))
        self._take_rows(rows, released)

    async def load_group(self, conn: asyncpg.Connection, group: str) -> None:
        """Read one group again (a gateway taking over its coordination: another
        may have committed since ``load``); its counter rises above the group's
        versions. Commits of the group this gateway has in flight stay in flight."""
        s = quoted(self.schema)
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            rows = await conn.fetch(
                f"SELECT * FROM {s}.consumer_offsets WHERE group_id = $1", group)
            released = await conn.fetch(
                f"SELECT group_id, topic, partition FROM {s}.released_offsets "
                "WHERE group_id = $1", group)
        self.forget_group(group)
        self._take_rows(rows, released)

    def _take_rows(self, rows: list[asyncpg.Record],
                   released: list[asyncpg.Record]) -> None:
        for row in rows:
            record = CommittedOffset(row["committed_offset"], row["leader_epoch"],
                                     from_text(row["metadata"]), row["commit_timestamp"],
                                     row["version"],
                                     row["committer"])
            self.loaded(row["group_id"], (row["topic"], row["partition"]), record)
        for row in released:
            tp = (row["topic"], row["partition"])
            self.loaded_release(row["group_id"], None if tp == WHOLE_GROUP else tp)

    def _latest_version(self, group: str, tp: TopicPartition) -> int:
        latest = self.latest(group, *tp)
        return 0 if latest is None else latest.version

    # ------------------------------------------------------------ writing
    def stage(
        self, group: str, commits: Mapping[TopicPartition, OffsetCommit], now_ms: int,
        change: PgChange, committer: str = "",
        members: Mapping[TopicPartition, str] | None = None,
        refused: Callable[[], BaseException] | None = None,
    ) -> dict[TopicPartition, CommittedOffset]:
        """Add a commit to ``change`` (which may carry other statements, e.g. a
        transaction's, whose id is the ``committer``); call ``publish`` with the
        result once ``change`` is durable, or ``forget`` when it failed.

        Versions are taken now, in call order, so two commits staged one after
        the other get increasing versions whatever order they land in.

        With ``refused``, the commit is a compare-and-set: it lands only if each
        partition's row is, under its row lock, at the version ``latest`` gives
        now (absent: 0), so a conflict check run on this gateway's memory holds
        inside the transaction: of two gateways committing the same partition
        from the same view, exactly one wins; the other's change fails with
        ``refused()`` and writes nothing.
        """
        expected = [self._latest_version(group, tp) for tp in commits]
        if refused is not None and commits:
            change.fence(self._sql.expect, group, [t for t, _ in commits],
                         [p for _, p in commits], expected, refused=refused)
        taken = self.take(group, commits, now_ms, committer, members)
        unreleased = ([WHOLE_GROUP] if taken.unrelease_group else []) + taken.unrelease
        if unreleased:
            change.execute(self._sql.unrelease, group, [t for t, _ in unreleased],
                           [p for _, p in unreleased])
        staged = taken.offsets
        if staged:
            records = list(staged.values())
            columns = (group, [t for t, _ in staged], [p for _, p in staged],
                       [r.offset for r in records], [r.leader_epoch for r in records],
                       [to_text(r.metadata) for r in records],
                       [r.commit_timestamp for r in records],
                       [r.version for r in records], [r.committer for r in records])
            if refused is None:
                change.execute(self._sql.upsert, *columns)
            else:
                change.fence(self._sql.upsert_expected, *columns, expected, len(records),
                             refused=refused)
        return staged

    async def commit(
        self, group: str, commits: Mapping[TopicPartition, OffsetCommit], now_ms: int,
        member: str = "",
    ) -> None:
        """Store offsets in one PostgreSQL transaction; visible once committed."""
        if not commits:
            return
        change = self.writer.begin()
        staged = self.stage(group, commits, now_ms, change,
                            members=dict.fromkeys(commits, member) if member else None)
        change.on_durable(lambda: self.publish(group, staged))
        try:
            await self.writer.commit(change)
        except Exception:  # (a cancelled caller: the change still lands, and publishes)
            self.forget(group, staged)
            raise

    async def delete(self, group: str, partitions: Iterable[TopicPartition] | None = None,
                     release: bool = True) -> int:
        """Delete some (or, with None, all) offsets of a group; returns how many.
        With ``release`` (an operator's deletion) the group stops holding
        retention where it was an important consumer.

        They leave memory when the deletion is durable. Changes land in
        submission order, so a commit staged before this deletion is published
        (and then removed) first, and one staged after it survives it: the
        rows deleted are those at or below the newest version taken now.
        """
        deletion = self.plan_delete(group, partitions, release)
        if deletion is None:
            return 0
        change = self.writer.begin()
        change.execute(self._sql.counter, VERSION_COUNTER, deletion.newest_deleted)
        if deletion.whole_group:
            change.execute(self._sql.delete_group, group, deletion.newest_deleted)
        else:
            change.execute(self._sql.delete_some, group, deletion.newest_deleted,
                           [t for t, _ in deletion.doomed], [p for _, p in deletion.doomed])
        if deletion.releases:
            where = [WHOLE_GROUP if topic is None else (topic, p)
                     for _, topic, p in deletion.releases]
            change.execute(self._sql.release, group, [t for t, _ in where],
                           [p for _, p in where])
        change.on_durable(lambda: self.deleted(deletion))
        try:
            await self.writer.commit(change)
        except Exception:
            self.not_deleted(deletion)
            raise
        return len(deletion.doomed)

    def drop_topic(self, topic: str, change: PgChange) -> None:
        """Add the deletion of every group's offsets of a deleted topic to
        ``change`` (a topic re-created under the same name starts without them,
        as in Kafka); they leave memory now, as with the embedded engine."""
        s = quoted(self.schema)
        change.execute(self._sql.counter, VERSION_COUNTER, self.last_version)
        change.execute(f"DELETE FROM {s}.consumer_offsets WHERE topic = $1", topic)
        change.execute(f"DELETE FROM {s}.released_offsets WHERE topic = $1", topic)
        self.drop_topic_offsets(topic)


def stage_offsets(offsets: PgConsumerOffsets, change: PgChange, group: str,
                  commits: Mapping[TopicPartition, OffsetCommit], now_ms: int,
                  committer: str, members: Mapping[TopicPartition, str] | None,
                  refused: Callable[[], BaseException] | None = None,
                  ) -> dict[TopicPartition, CommittedOffset]:
    """``TransactionStorage.stage_offsets`` on PostgreSQL: add a transaction's
    offset commit to ``change`` (the transaction's commit, one PostgreSQL
    transaction with its markers and state); publish the result
    (``offsets.publish``) once it is durable, ``offsets.forget`` it if not.
    With ``refused``: a compare-and-set against this gateway's view (``stage``),
    what the offset-range conflict check needs across gateways."""
    return offsets.stage(group, commits, now_ms, change, committer, members, refused)
