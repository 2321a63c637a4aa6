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

Across gateways each has its own counter: a row another gateway committed,
read again by ``load_group`` (a coordinator move, or a compare-and-set
refused), takes the next version of this gateway's counter, and its
database version is kept apart for the compare-and-set
(``pgstore.offset_loading`` owns the reads and that rule; the SQL and the
stored form of text: ``pgstore.offset_statements``). ``stage`` with
``refused`` is that compare-and-set: the offsets
land only if each row is, under its row lock, at the version this gateway
knows, so a conflict check run on this memory holds inside the transaction;
of two gateways committing one partition from one view, exactly one wins.

Important consumers (``tablets/important.py``) read ``committed`` and
``is_released``, as with the embedded engine.

In a cluster (``slot_holder``, set by ``pgstore.cluster``), every change
this store makes for a group's coordinator (an OffsetCommit, a deletion, a
new generation) begins with the coordinator's fence: the group's slot is
still this gateway's, at the epoch it gained it, checked under the slot
row's share lock; else ``CoordinatorMoved`` (NOT_COORDINATOR) and nothing
of it lands. A transaction's offsets (``stage_offsets``) are written by the
transactional id's coordinator, which need not coordinate the group: they
are guarded by their compare-and-set instead, as Kafka's commit markers
land whichever broker coordinates the group.

Generations (``group_generations``, ``pgstore.group_counters``) are loaded
with the offsets and again with ``load_group``; ``next_generation`` stores
the next one (above the stored one and the caller's) before JoinGroup
answers with it: one write per rebalance, none per heartbeat.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping

import asyncpg

from tablets.errors import CoordinatorMoved
from tablets.offset_state import Deletion, OffsetState
from tablets.seam import CommittedOffset, OffsetCommit, TopicPartition

from .group_counters import GroupCounters
from .migrate import Connection, quoted
from .offset_loading import LoadedHook, read_all, read_group, take_rows
from .offset_statements import VERSION_COUNTER, WHOLE_GROUP, OffsetStatements, to_text
from .schema import DEFAULT_SCHEMA
from .writer import PgChange, PgWriter

# A group -> (its slot, this gateway's node id, the slot's epoch here), or
# None when this gateway does not coordinate it now.
SlotHolder = Callable[[str], "tuple[int, int, int] | None"]


class PgConsumerOffsets(OffsetState):
    def __init__(self, writer: PgWriter, schema: str = DEFAULT_SCHEMA) -> None:
        super().__init__()
        self.writer = writer
        self.schema = schema
        self._sql = OffsetStatements(quoted(schema))
        # The version a row has in the database, where memory holds another:
        # a row another gateway committed, read by ``load_group``, gets a
        # version of this gateway's counter (the order it was seen in), so
        # that a commit that landed after a transaction began here looks
        # newer than its begin version; the compare-and-set expects this one.
        self._db_versions: dict[tuple[str, TopicPartition], int] = {}
        self._counters = GroupCounters(schema)
        self._generations: dict[str, int] = {}
        self.slot_holder: SlotHolder | None = None  # in a cluster (pgstore.cluster)
        # Run as the last read of ``load`` (None) and ``load_group`` (the
        # group), in their snapshot: pgstore.txn_staged_offsets reads the
        # offsets staged for transactions, which commit into these rows later.
        self.loaded_hook: LoadedHook | None = None

    persists_generations = True

    # ------------------------------------------------------------ loading
    async def load(self, conn: asyncpg.Connection) -> None:
        """Read every committed offset and release (start-up)."""
        counter, rows, released, generations = await read_all(
            conn, self._sql, self._counters, self.loaded_hook)
        self._generations = {row["group_id"]: int(row["generation"]) for row in generations}
        self.clear()
        self._db_versions.clear()
        self.versions_from(int(counter or 0))
        take_rows(self, self._db_versions, rows, released, None)

    async def load_group(self, conn: Connection, group: str) -> None:
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
        rows, released, generation = await read_group(conn, self._sql, self._counters, group,
                                                      self.loaded_hook)
        self._generations[group] = generation
        known = {tp: (self._db_versions.get((group, tp), record.version), record)
                 for tp, record in self.group_offsets(group).items()}
        self._db_versions = {key: v for key, v in self._db_versions.items() if key[0] != group}
        self.forget_group(group)
        take_rows(self, self._db_versions, rows, released, known)

    # ------------------------------------------------------------ the coordinator's fence
    def fence_coordinator(self, group: str, change: PgChange) -> None:
        """Begin ``change`` with the coordinator's fence (see the module's
        docstring); raises ``CoordinatorMoved`` at once when this gateway does
        not hold the group's slot now. Nothing without a cluster."""
        if self.slot_holder is None:
            return
        held = self.slot_holder(group)
        if held is None:
            raise CoordinatorMoved(f"group {group}: this gateway does not coordinate it")
        slot, node, epoch = held
        change.fence(self._sql.slot_held, slot, node, epoch, refused=lambda: CoordinatorMoved(
            f"group {group}: coordinator slot {slot} left node {node} (epoch {epoch}) "
            "before the write; nothing of it was stored"))

    # ------------------------------------------------------------ generations
    def generation(self, group: str) -> int:
        """The group's stored generation, as last read or written here (0: none)."""
        return self._generations.get(group, 0)

    async def next_generation(self, group: str, after: int) -> int:
        """Store and return the group's next generation: above ``after`` (the
        coordinator's current one) and above the stored one, in one change
        fenced by the group's slot."""
        change = self.writer.begin()
        self.fence_coordinator(group, change)
        numbered: list[int] = []
        change.fetch(self._counters.generation_after_sql, group, after + 1,
                     into=lambda rows: numbered.append(int(rows[0]["generation"])))
        await self.writer.commit(change)
        generation = numbered[-1]
        self._generations[group] = max(self._generations.get(group, 0), generation)
        return generation

    def database_version(self, group: str, tp: TopicPartition) -> int:
        """The version the partition's row has in the database once what this
        gateway staged lands (absent: 0)."""
        return self._expected_version(group, tp)

    def _expected_version(self, group: str, tp: TopicPartition) -> int:
        """The version the partition's row has in the database once what this
        gateway staged lands (absent: 0): what the compare-and-set expects."""
        in_flight = self.in_flight(group, tp)
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
        expected = [self._expected_version(group, tp) for tp in commits]
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
                       [r.version for r in records], [r.committer for r in records],
                       [to_text(r.member) for r in records])
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
        self.fence_coordinator(group, change)
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
        change = self.writer.begin()
        self.fence_coordinator(group, change)
        deletion = self.plan_delete(group, partitions, release)
        if deletion is None:
            return 0
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
        change.execute(self._sql.counter, VERSION_COUNTER, self.last_version)
        change.execute(self._sql.drop_topic_offsets, topic)
        change.execute(self._sql.drop_topic_released, topic)
        offsets, _ = self.drop_topic_offsets(topic)
        for group, tp in offsets:
            self._db_versions.pop((group, tp), None)

    def publish(self, group: str, staged: Mapping[TopicPartition, CommittedOffset],
                overwrote: Container[TopicPartition] = ()) -> None:
        """As ``OffsetState.publish``; a row seen committed elsewhere was
        overwritten by this commit, whose version the row has now."""
        seen_elsewhere = [tp for tp in staged if (group, tp) in self._db_versions]
        for tp in seen_elsewhere:
            del self._db_versions[(group, tp)]
        super().publish(group, staged, seen_elsewhere)

    def deleted(self, deletion: Deletion) -> None:
        super().deleted(deletion)
        remaining = self.group_offsets(deletion.group)
        for key in [key for key in self._db_versions
                    if key[0] == deletion.group and key[1] not in remaining]:
            del self._db_versions[key]


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
