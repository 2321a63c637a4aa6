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
order). Across gateways each has its own counter, so a version in memory is
this gateway's: a row another gateway committed, read again by
``load_group`` (a coordinator move, or a compare-and-set refused), takes the
next version of this gateway's counter, as if committed when seen, and its
database version is kept apart for the compare-and-set. A transaction's
*begin* version (this gateway's ``last_version`` when it began, as in the
embedded engine) is then comparable with every version in memory
(docs/cluster-design.md, "Offsets written by a commit that crosses
gateways"). ``stage`` with ``refused`` is that compare-and-set: the offsets
land only if each row is, under its row lock, at the version this gateway
knows, so a conflict check run on this memory holds inside the transaction;
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
        # The version a row has in the database, where memory holds another:
        # a row another gateway committed, read by ``load_group``, gets a
        # version of this gateway's counter (the order it was seen in), so
        # that a commit that landed after a transaction began here looks
        # newer than its begin version; the compare-and-set expects this one.
        self._db_versions: dict[tuple[str, TopicPartition], int] = {}
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
        self._db_versions.clear()
        self._released_groups.clear()
        self._released_partitions.clear()
        self._last_version = max(self._last_version, int(counter or 0))
        self._take_rows(rows, released, None)

    async def load_group(self, conn: asyncpg.Connection, group: str) -> None:
        """Read one group again (a gateway taking over its coordination: another
        may have committed since ``load``); its counter rises above the group's
        versions. Commits of the group this gateway has in flight stay in flight.

        A row that changed since this gateway last knew it (another gateway
        committed it) takes the next version of this gateway's counter, as if
        committed now: versions in memory follow the order this gateway saw
        commits in, so a transaction that began here before that commit
        landed finds the partition moved (``txn/conflicts.py``'s rule 1),
        whatever version the other gateway's counter gave it. The row's own
        version is kept for the compare-and-set."""
        s = quoted(self.schema)
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            rows = await conn.fetch(
                f"SELECT * FROM {s}.consumer_offsets WHERE group_id = $1", group)
            released = await conn.fetch(
                f"SELECT group_id, topic, partition FROM {s}.released_offsets "
                "WHERE group_id = $1", group)
        known = {tp: (self._db_versions.get((group, tp), record.version), record)
                 for tp, record in self._groups.pop(group, {}).items()}
        self._db_versions = {key: v for key, v in self._db_versions.items() if key[0] != group}
        self._released_groups.discard(group)
        self._released_partitions -= {r for r in self._released_partitions if r[0] == group}
        self._take_rows(rows, released, known)

    def _take_rows(self, rows: list[asyncpg.Record], released: list[asyncpg.Record],
                   known: dict[TopicPartition, tuple[int, CommittedOffset]] | None) -> None:
        """Take rows read; ``known``: with ``load_group``, the group's rows as
        memory had them (their database version and record): a row changed
        since takes a version of this gateway's."""
        self._last_version = max([self._last_version, *(row["version"] for row in rows)])
        for row in rows:
            tp = (row["topic"], row["partition"])
            version = int(row["version"])
            seen = None if known is None else known.get(tp)
            if seen is not None and seen[0] == version:
                self._groups.setdefault(row["group_id"], {})[tp] = seen[1]
                if seen[1].version != version:
                    self._db_versions[(row["group_id"], tp)] = version
                continue
            mine = self._in_flight.get((row["group_id"], tp))
            if known is not None and mine is not None and mine.version == version:
                # This gateway's own commit, landed and about to be published.
                self._groups.setdefault(row["group_id"], {})[tp] = mine
                continue
            if known is not None:  # (load_group) committed elsewhere since
                self._last_version += 1
                self._db_versions[(row["group_id"], tp)] = version
                version = self._last_version
            record = CommittedOffset(row["committed_offset"], row["leader_epoch"],
                                     row["metadata"], row["commit_timestamp"], version,
                                     row["committer"])
            self._groups.setdefault(row["group_id"], {})[tp] = record
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

    def _expected_version(self, group: str, tp: TopicPartition) -> int:
        """The version the partition's row has in the database once what this
        gateway staged lands (absent: 0): what the compare-and-set expects."""
        in_flight = self._in_flight.get((group, tp))
        if in_flight is not None:
            return in_flight.version
        committed = self.committed(group, *tp)
        if committed is None:
            return 0
        return self._db_versions.get((group, tp), committed.version)

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
        expected = [self._expected_version(group, tp) for tp in commits]
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
            # (A row seen committed elsewhere was overwritten by this one.)
            if (current is None or current.version < record.version
                    or (group, tp) in self._db_versions):
                offsets[tp] = record
                self._db_versions.pop((group, tp), None)  # the row has this one's version
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
                    self._db_versions.pop((group, tp), None)
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
                self._db_versions.pop((group, tp), None)
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
