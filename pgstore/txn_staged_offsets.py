"""Offsets staged by a group's coordinator for a transaction another gateway
coordinates (issue 22; docs/cluster-design.md, "Transactional offsets staged
by another gateway").

    staged = StagedOffsets(writer, offsets, schema)
    await staged.stage(txn_id, producer_id, epoch, group, commits)   # the group's coordinator
    staged.take(change, txn_id, producer_id, epoch, now_ms)          # the id's: EndTxn(commit)
    staged.discard(change, txn_id)                                   # the id's: an abort
    gone = await staged.settle(pool, group, txn_ids)                 # before an OffsetFetch
    offsets.loaded_hook = staged.read_staged                         # what loads see staged

A Kafka client sends TxnOffsetCommit to the group's coordinator, EndTxn to
the transactional id's; in a cluster they may be two gateways. The group's
coordinator (``stage``) writes the offsets into ``txn_staged_offsets`` in
one PostgreSQL transaction that

1. checks that it still holds the group's slot (the coordinator's fence);
2. reads the id's ``txn_states`` row ``FOR SHARE`` and checks on it that the
   transaction is open (``Ongoing``) with that producer id and epoch and
   that AddOffsetsToTxn added the group (``TxnStateMismatch`` with the row
   read, which the coordinator turns into Kafka's codes);
3. refuses an offset below the committed one (``OffsetBehind``: the range
   was processed already);
4. runs the rest of the offset-range check against the transaction's begin
   point (``OffsetBehind`` too; docs/cluster-design.md, "A transaction's
   begin point across gateways"): a row stamped at or above the
   transaction's instance was committed after it began, and conflicts
   unless at the version for which the caller found the one-gateway
   exceptions (``exempt``: its ``exempt_version``); an unchanged offset
   another committer wrote conflicts unless the commit is member-fenced;
5. stages each partition with the version its ``consumer_offsets`` row has
   now (0: no row) as the ``expected_version``, kept when the transaction
   stages the partition again, and the commit's member.

The id's coordinator takes them into its commit (``take``, in the commit's
PostgreSQL transaction): it first locks the id's state row, so a staging
that read the row before is committed (and seen by the next statement) and
one after it waits and then finds the transaction ended; then it moves its
rows into ``consumer_offsets``, each only where the row is still at its
``expected_version`` (a compare-and-set under the rows' locks: of two
transactions staging one partition from one view exactly one lands) and is
stamped below the transaction's instance or at its ``exempt_version`` (the
final word on the begin point: steps 4 and 5 are two statements, and a
commit between them is caught here), and deletes them. One row not so
refuses the whole commit (``StagedOffsetsMoved``), and nothing of it
lands. An abort (``discard``) locks the state row as well and deletes the
id's rows. The version a moved
row gets is above its previous one and above this gateway's counter, so a
version is never taken twice by one row.

The group's coordinator holds the offsets staged for the group as pending
(OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT), and reads
the group again once they are gone (``settle``). So does a gateway that
starts, or gains the group's slot, with offsets staged by another: every
load of the offsets reads the staged ones in the same snapshot
(``read_staged``), so that a commit after the load is always of a
transaction whose offsets are held.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from tablets.errors import CommitRefused, OffsetBehind, TxnStateMismatch
from tablets.seam import OffsetCommit, TopicPartition

from .consumer_offsets import PgConsumerOffsets
from .migrate import Connection, quoted
from .offset_statements import stamp_sql, to_text
from .schema import DEFAULT_SCHEMA
from .writer import PgChange, PgWriter

# (group, transactional id -> the partitions it staged)
StagedHook = Callable[[str, dict[str, list[TopicPartition]]], None]


class StagedOffsetsMoved(CommitRefused):
    """A commit's offsets staged by another gateway: a row moved since they
    were staged, or was committed after the transaction began (another
    commit claimed the range); nothing was written."""


class _Statements:
    def __init__(self, s: str) -> None:
        self.read_state = (
            f"SELECT state FROM {s}.txn_states WHERE transactional_id = $1 FOR SHARE")
        # The state is the coordinator's JSON (txn/state.py's encode).
        self.state_open = (
            "SELECT 1 FROM (SELECT convert_from(state, 'UTF8')::jsonb AS j "
            f"FROM {s}.txn_states WHERE transactional_id = $1) t "
            "WHERE (j->>'pid')::bigint = $2 AND (j->>'epoch')::int = $3 "
            "AND j->>'state' = 'Ongoing' AND j->'groups' ? $4")
        self.not_behind = (
            "SELECT 1 WHERE NOT EXISTS (SELECT 1 FROM unnest($2::text[], $3::int[], "
            f"$4::bigint[]) AS e(topic, partition, o) JOIN {s}.consumer_offsets c "
            "ON c.group_id = $1 AND c.topic = e.topic AND c.partition = e.partition "
            "WHERE c.committed_offset > e.o)")
        # The transaction's begin point: its instance, as its state row has it.
        begin = (f"(SELECT (convert_from(state, 'UTF8')::jsonb->>'instance')::bigint "
                 f"FROM {s}.txn_states WHERE transactional_id = $1)")
        # The offset-range check as one gateway runs it (txn/conflicts.py),
        # on the rows as they are: a row committed since the transaction
        # began (stamped at or above its instance) conflicts, unless the
        # group's coordinator found an exception for that very version; an
        # unchanged offset another committer wrote conflicts unless the
        # commit is member-fenced. $1 the transactional id, $2 the group.
        self.not_moved = (
            "SELECT 1 WHERE NOT EXISTS (SELECT 1 FROM unnest($3::text[], $4::int[], "
            "$5::bigint[], $6::bool[], $7::bigint[]) AS e(topic, partition, o, fenced, exempt) "
            f"JOIN {s}.consumer_offsets c ON c.group_id = $2 AND c.topic = e.topic "
            f"AND c.partition = e.partition WHERE (c.stamp >= {begin} "
            "AND c.version <> e.exempt) "
            "OR (c.committed_offset = e.o AND c.committer <> $1 AND NOT e.fenced))")
        self.stage = (
            f"INSERT INTO {s}.txn_staged_offsets (transactional_id, group_id, topic, partition, "
            "producer_id, producer_epoch, committed_offset, leader_epoch, metadata, "
            "expected_version, exempt_version, member) "
            "SELECT $1, $4, e.topic, e.partition, $2, $3, e.o, e.le, e.md, "
            "coalesce(c.version, 0), e.exempt, e.mb FROM unnest($5::text[], $6::int[], "
            "$7::bigint[], $8::int[], $9::text[], $10::bigint[], $11::text[]) "
            "AS e(topic, partition, o, le, md, exempt, mb) "
            f"LEFT JOIN {s}.consumer_offsets c ON c.group_id = $4 AND c.topic = e.topic "
            "AND c.partition = e.partition "
            "ON CONFLICT (transactional_id, group_id, topic, partition) DO UPDATE SET "
            "producer_id = excluded.producer_id, producer_epoch = excluded.producer_epoch, "
            "committed_offset = excluded.committed_offset, "
            "leader_epoch = excluded.leader_epoch, metadata = excluded.metadata, "
            "exempt_version = excluded.exempt_version, member = excluded.member")
        # The id's coordinator, at its commit or abort: first the state row,
        # locked (see the module's docstring), in its own statement so that
        # the next one, under READ COMMITTED, sees what a staging committed
        # while this one waited.
        self.lock_state = (
            f"SELECT 1 FROM {s}.txn_states WHERE transactional_id = $1 FOR UPDATE")
        # Rows of an earlier session of the id (another producer id or
        # epoch) are deleted, never moved.
        self.take = (
            f"WITH gone AS (DELETE FROM {s}.txn_staged_offsets WHERE transactional_id = $1 "
            "RETURNING *), "
            "mine AS (SELECT * FROM gone WHERE producer_id = $2 AND producer_epoch = $3), "
            f"up AS (INSERT INTO {s}.consumer_offsets AS c (group_id, topic, partition, "
            "committed_offset, leader_epoch, metadata, commit_timestamp, version, committer, "
            "member, stamp) SELECT group_id, topic, partition, committed_offset, leader_epoch, "
            f"metadata, $4, $5, $1, member, {stamp_sql(s)} FROM mine WHERE expected_version = 0 "
            "OR EXISTS "
            f"(SELECT 1 FROM {s}.consumer_offsets o WHERE o.group_id = mine.group_id "
            "AND o.topic = mine.topic AND o.partition = mine.partition) "
            "ON CONFLICT (group_id, topic, partition) DO UPDATE SET "
            "committed_offset = excluded.committed_offset, leader_epoch = excluded.leader_epoch, "
            "metadata = excluded.metadata, commit_timestamp = excluded.commit_timestamp, "
            "version = greatest(c.version + 1, excluded.version), "
            "committer = excluded.committer, member = excluded.member, stamp = excluded.stamp "
            "WHERE EXISTS (SELECT 1 FROM mine m WHERE m.group_id = excluded.group_id "
            "AND m.topic = excluded.topic AND m.partition = excluded.partition "
            "AND c.version = m.expected_version "
            f"AND (c.stamp < {begin} OR c.version = m.exempt_version)) RETURNING 1) "
            "SELECT 1 WHERE (SELECT count(*) FROM up) = (SELECT count(*) FROM mine)")
        self.discard = f"DELETE FROM {s}.txn_staged_offsets WHERE transactional_id = $1"
        self.staged_all = (
            f"SELECT group_id, transactional_id, topic, partition FROM {s}.txn_staged_offsets")
        self.staged_of = self.staged_all + " WHERE group_id = $1"
        self.still_staged = (
            f"SELECT DISTINCT transactional_id FROM {s}.txn_staged_offsets "
            "WHERE group_id = $1 AND transactional_id = ANY($2::text[])")


class StagedOffsets:
    """``txn_staged_offsets``, as both coordinators use it."""

    def __init__(self, writer: PgWriter, offsets: PgConsumerOffsets,
                 schema: str = DEFAULT_SCHEMA) -> None:
        self.writer = writer
        self.offsets = offsets
        self._sql = _Statements(quoted(schema))
        # What was staged when every offset was loaded, and who hears what is
        # staged when a group is read again (the group's new coordinator).
        self.at_load: dict[str, dict[str, list[TopicPartition]]] = {}
        self.hook: StagedHook | None = None

    async def read_staged(self, conn: Connection, group: str | None) -> None:
        """``PgConsumerOffsets.loaded_hook``: the offsets staged for ``group``
        (None: every group), in the snapshot its offsets were read in, so
        that each commit made after it is of a transaction seen here."""
        rows = (await conn.fetch(self._sql.staged_all) if group is None
                else await conn.fetch(self._sql.staged_of, group))
        found: dict[str, dict[str, list[TopicPartition]]] = {}
        for row in rows:
            found.setdefault(row["group_id"], {}).setdefault(
                row["transactional_id"], []).append((row["topic"], row["partition"]))
        if group is None:
            self.at_load = found
        if self.hook is not None:
            for each, staged in found.items():
                self.hook(each, staged)

    async def stage(self, transactional_id: str, producer_id: int, epoch: int, group: str,
                    commits: Mapping[TopicPartition, OffsetCommit],
                    members: Mapping[TopicPartition, str] | None = None,
                    exempt: Collection[TopicPartition] = ()) -> None:
        """The group's coordinator: stage ``commits`` for the transaction (see
        the module's docstring); raises ``CoordinatorMoved``,
        ``TxnStateMismatch`` or ``OffsetBehind`` and stages nothing.
        ``members``: the member of each partition whose commit is
        member-fenced (KIP-447);
        ``exempt``: those for which the offset-range check's exceptions
        apply to the row as this gateway knows it (``txn/conflicts.py``,
        ``moved_but_exempt``), which holds for that row's version only."""
        change = self.writer.begin()
        self.offsets.fence_coordinator(group, change)
        seen: list[bytes] = []
        change.fetch(self._sql.read_state, transactional_id,
                     into=lambda rows: seen.extend(bytes(row["state"]) for row in rows))
        change.fence(self._sql.state_open, transactional_id, producer_id, epoch, group,
                     refused=lambda: TxnStateMismatch(
                         f"{transactional_id}: not an open transaction of producer "
                         f"{producer_id} epoch {epoch} with group {group} added",
                         seen[0] if seen else None))
        topics, partitions = [t for t, _ in commits], [p for _, p in commits]
        offsets = [c.offset for c in commits.values()]
        change.fence(self._sql.not_behind, group, topics, partitions, offsets,
                     refused=lambda: OffsetBehind(
                         f"group {group}: an offset staged by {transactional_id} is below the "
                         "committed one: that range was already processed"))
        members = members or {}
        exempt_versions = [self.offsets.database_version(group, tp) if tp in exempt else -1
                           for tp in commits]
        change.fence(self._sql.not_moved, transactional_id, group, topics, partitions, offsets,
                     [bool(members.get(tp)) for tp in commits], exempt_versions,
                     refused=lambda: OffsetBehind(
                         f"group {group}: an offset staged by {transactional_id} was committed "
                         "since its transaction began, or by another committer at the same "
                         "offset: that range was claimed already"))
        change.execute(self._sql.stage, transactional_id, producer_id, epoch, group,
                       topics, partitions, offsets,
                       [c.leader_epoch for c in commits.values()],
                       [to_text(c.metadata) for c in commits.values()], exempt_versions,
                       [to_text(members.get(tp, "")) for tp in commits])
        await self.writer.commit(change)

    def take(self, change: PgChange, transactional_id: str, producer_id: int, epoch: int,
             now_ms: int) -> None:
        """The id's coordinator: add the move of the transaction's staged
        offsets into ``consumer_offsets`` to its commit ``change``."""
        change.execute(self._sql.lock_state, transactional_id)
        version = self.offsets.next_version()
        change.fence(self._sql.take, transactional_id, producer_id, epoch, now_ms, version,
                     refused=lambda: StagedOffsetsMoved(
                         f"offsets staged for {transactional_id} by a group's coordinator: a "
                         "partition's offset was committed since they were staged or since "
                         "the transaction began; the transaction was not committed"))

    def discard(self, change: PgChange, transactional_id: str) -> None:
        """The id's coordinator: add the deletion of the id's staged offsets
        to its abort ``change``."""
        change.execute(self._sql.lock_state, transactional_id)
        change.execute(self._sql.discard, transactional_id)

    async def settle(self, conn: Connection, group: str,
                     transactional_ids: Collection[str]) -> set[str]:
        """The group's coordinator: of ``transactional_ids``, which staged
        offsets of ``group``, those whose transaction ended (their rows are
        gone); when any did, the group's offsets are read again, so what a
        commit moved is in this gateway's memory before it is told."""
        rows = await conn.fetch(self._sql.still_staged, group, list(transactional_ids))
        gone = set(transactional_ids) - {row["transactional_id"] for row in rows}
        if gone:
            await self.offsets.load_group(conn, group)
        return gone
