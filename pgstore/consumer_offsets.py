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

from collections.abc import Callable, Iterable, Mapping

import asyncpg

from tablets.seam import CommittedOffset, OffsetCommit, TopicPartition

from .migrate import quoted
from .offset_statements import OffsetStatements
from .schema import DEFAULT_SCHEMA
from .writer import PgChange, PgWriter

VERSION_COUNTER = "consumer.offsets.version"
# released_offsets' row for a whole group.
WHOLE_GROUP = ("", -1)

# (group, topic or None for the whole group, partition): a release in memory.
_Release = tuple[str, str | None, int]


class PgConsumerOffsets:
    def __init__(self, writer: PgWriter, schema: str = DEFAULT_SCHEMA) -> None:
        self.writer = writer
        self.schema = schema
        self._sql = OffsetStatements(quoted(schema))
        # Visible (durable) offsets: group -> (topic, partition) -> offset.
        self._groups: dict[str, dict[TopicPartition, CommittedOffset]] = {}
        self._last_version = 0
        # Commits staged but not yet durable: the newest wins in ``latest``.
        self._in_flight: dict[tuple[str, TopicPartition], CommittedOffset] = {}
        # Groups (and partitions of groups) whose offsets were deleted: they
        # hold no retention until they commit again.
        self._released_groups: set[str] = set()
        self._released_partitions: set[tuple[str, str, int]] = set()
        # Releases written but not yet durable; a commit staged meanwhile
        # cancels its own (it lands after the release, so it wins).
        self._releasing: set[_Release] = set()
        # Whether a group is an important consumer of a topic (None: of any;
        # set by the engine from the topics' configs).
        self.is_important: Callable[[str, str | None], bool] = lambda group, topic: False

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
        self._groups.clear()
        self._released_groups.clear()
        self._released_partitions.clear()
        self._last_version = max(self._last_version, int(counter or 0))
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
        self._groups.pop(group, None)
        self._released_groups.discard(group)
        self._released_partitions -= {r for r in self._released_partitions if r[0] == group}
        self._take_rows(rows, released)

    def _take_rows(self, rows: list[asyncpg.Record],
                   released: list[asyncpg.Record]) -> None:
        for row in rows:
            record = CommittedOffset(row["committed_offset"], row["leader_epoch"],
                                     row["metadata"], row["commit_timestamp"], row["version"],
                                     row["committer"])
            self._groups.setdefault(row["group_id"], {})[(row["topic"], row["partition"])] = record
            self._last_version = max(self._last_version, record.version)
        for row in released:
            if (row["topic"], row["partition"]) == WHOLE_GROUP:
                self._released_groups.add(row["group_id"])
            else:
                self._released_partitions.add((row["group_id"], row["topic"], row["partition"]))

    # ------------------------------------------------------------ reading
    def groups(self) -> list[str]:
        """Groups with at least one committed offset."""
        return list(self._groups)

    def has_offsets(self, group: str) -> bool:
        return bool(self._groups.get(group))

    def committed(self, group: str, topic: str, partition: int) -> CommittedOffset | None:
        return self._groups.get(group, {}).get((topic, partition))

    def group_offsets(self, group: str) -> dict[TopicPartition, CommittedOffset]:
        """A copy of every committed offset of a group."""
        return dict(self._groups.get(group, {}))

    def is_released(self, group: str, topic: str, partition: int) -> bool:
        """The group's offsets (all, or this partition's) were deleted and it has
        not committed this partition since: it holds no retention there."""
        return (group in self._released_groups
                or (group, topic, partition) in self._released_partitions)

    def latest(self, group: str, topic: str, partition: int) -> CommittedOffset | None:
        """The newest commit of a partition, counting one staged but not yet
        durable: what a conflict check must compare with."""
        in_flight = self._in_flight.get((group, (topic, partition)))
        return in_flight or self.committed(group, topic, partition)

    def _latest_version(self, group: str, tp: TopicPartition) -> int:
        latest = self.latest(group, *tp)
        return 0 if latest is None else latest.version

    @property
    def last_version(self) -> int:
        """The newest version any commit took: versions after it are newer commits."""
        return self._last_version

    def version(self, group: str, topic: str, partition: int) -> int:
        """The version of a partition's committed offset; 0 when there is none."""
        committed = self.committed(group, topic, partition)
        return committed.version if committed else 0

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
        staged: dict[TopicPartition, CommittedOffset] = {}
        expected = [self._latest_version(group, tp) for tp in commits]
        if refused is not None and commits:
            change.fence(self._sql.expect, group, [t for t, _ in commits],
                         [p for _, p in commits], expected, refused=refused)
        unreleased: list[tuple[str, int]] = []
        # A commit makes a deleted group whole again: it holds retention anew.
        if group in self._released_groups or (group, None, 0) in self._releasing:
            self._released_groups.discard(group)
            self._releasing.discard((group, None, 0))
            unreleased.append(WHOLE_GROUP)
        for (topic, partition), commit in commits.items():
            if ((group, topic, partition) in self._released_partitions
                    or (group, topic, partition) in self._releasing):
                self._released_partitions.discard((group, topic, partition))
                self._releasing.discard((group, topic, partition))
                unreleased.append((topic, partition))
            self._last_version += 1
            record = CommittedOffset(commit.offset, commit.leader_epoch, commit.metadata, now_ms,
                                     self._last_version, committer,
                                     (members or {}).get((topic, partition), ""))
            staged[(topic, partition)] = record
            self._in_flight[(group, (topic, partition))] = record
        if unreleased:
            change.execute(self._sql.unrelease, group, [t for t, _ in unreleased],
                           [p for _, p in unreleased])
        if staged:
            records = list(staged.values())
            columns = (group, [t for t, _ in staged], [p for _, p in staged],
                       [r.offset for r in records], [r.leader_epoch for r in records],
                       [r.metadata for r in records], [r.commit_timestamp for r in records],
                       [r.version for r in records], [r.committer for r in records])
            if refused is None:
                change.execute(self._sql.upsert, *columns)
            else:
                change.fence(self._sql.upsert_expected, *columns, expected, len(records),
                             refused=refused)
        return staged

    def publish(self, group: str, staged: Mapping[TopicPartition, CommittedOffset]) -> None:
        """Make durable commits visible. A staged record older than what is
        visible (a later commit landed first) is dropped, so the newest wins."""
        offsets = self._groups.setdefault(group, {})
        for tp, record in staged.items():
            if self._in_flight.get((group, tp)) is record:
                del self._in_flight[(group, tp)]
            current = offsets.get(tp)
            if current is None or current.version < record.version:
                offsets[tp] = record
        if not offsets:
            del self._groups[group]

    def forget(self, group: str, staged: Mapping[TopicPartition, CommittedOffset]) -> None:
        """A staged commit that failed: ``latest`` stops counting it. (A release
        it cleared stays cleared in memory: the group then holds from its log
        start or its other offsets until a restart reads the marker again,
        which retains more, never less.)"""
        for tp, record in staged.items():
            if self._in_flight.get((group, tp)) is record:
                del self._in_flight[(group, tp)]

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
        offsets = self._groups.get(group, {})
        doomed = list(offsets) if partitions is None else [tp for tp in partitions
                                                            if tp in offsets]
        # Only an important consumer leaves a marker (other groups hold nothing).
        release = release and self.is_important(group, None)
        if not doomed and not (partitions is None and release):
            return 0  # (a whole group without offsets may still hold: released below)
        newest_deleted = self._last_version
        change = self.writer.begin()
        change.execute(self._sql.counter, VERSION_COUNTER, newest_deleted)
        releases: list[_Release] = []
        if partitions is None:
            change.execute(self._sql.delete_group, group, newest_deleted)
            if release:
                releases = [(group, None, 0)]
        else:
            change.execute(self._sql.delete_some, group, newest_deleted,
                           [t for t, _ in doomed], [p for _, p in doomed])
            if release:
                releases = [(group, *tp) for tp in doomed if self.is_important(group, tp[0])]
        if releases:
            where = [WHOLE_GROUP if topic is None else (topic, p) for _, topic, p in releases]
            change.execute(self._sql.release, group, [t for t, _ in where],
                           [p for _, p in where])
        self._releasing.update(releases)

        def durable() -> None:
            for item in releases:
                if item in self._releasing:  # no commit was staged since
                    self._releasing.discard(item)
                    if item[1] is None:
                        self._released_groups.add(group)
                    else:
                        self._released_partitions.add((group, item[1], item[2]))
            remaining = self._groups.get(group, {})
            gone = list(remaining) if partitions is None else doomed
            for tp in gone:
                record = remaining.get(tp)
                if record is not None and record.version <= newest_deleted:
                    del remaining[tp]
            if not remaining:
                self._groups.pop(group, None)

        change.on_durable(durable)
        try:
            await self.writer.commit(change)
        except Exception:
            self._releasing.difference_update(releases)
            raise
        return len(doomed)

    def drop_topic(self, topic: str, change: PgChange) -> None:
        """Add the deletion of every group's offsets of a deleted topic to
        ``change`` (a topic re-created under the same name starts without them,
        as in Kafka); they leave memory now, as with the embedded engine."""
        s = quoted(self.schema)
        change.execute(self._sql.counter, VERSION_COUNTER, self._last_version)
        change.execute(f"DELETE FROM {s}.consumer_offsets WHERE topic = $1", topic)
        change.execute(f"DELETE FROM {s}.released_offsets WHERE topic = $1", topic)
        for group, offsets in list(self._groups.items()):
            for tp in [tp for tp in offsets if tp[0] == topic]:
                del offsets[tp]
            if not offsets:
                del self._groups[group]
        self._released_partitions -= {r for r in self._released_partitions if r[1] == topic}


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
