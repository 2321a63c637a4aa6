"""Transactional batches stored by a partition's leader for a transaction
another gateway coordinates (issue 22; docs/cluster-design.md, "A
transactional Produce to a leader that does not coordinate its id").

    remote = PgRemoteTxns(pool, txn_partition, schema)
    found = await remote.read_txn(txn_id)                # the leader, before the append
    sink = remote.pending_sink(txn_id, pid, epoch, instance, (topic, partition), topic_id)
    log.append(records, now, sink)                       # -> RemotePendingSink.stage
    remote.lock_txn(change, txn_id)                      # the coordinator, first in its end
    remote.stage_remote_commit(change, log, instance, txn_id)  # ... before each partition's own

A client sends AddPartitionsToTxn and EndTxn to the transactional id's
coordinator (gateway A), Produce to each partition's leader (gateway B).
B does not hold the transaction in memory: it reads the id's ``txn_states``
row and the open transaction's ``txn_partitions`` (``read_txn``; the
coordinator's checks, with Kafka's answers, are ``txn.remote_produce``'s),
then stores the batch as a pending row of that transaction, in the one
PostgreSQL transaction of its append, which

1. locks the partition's row ``FOR SHARE`` at B's leader epoch (as every
   pending append does) and the id's state row ``FOR SHARE``, and checks
   on that row that the transaction is still ``Ongoing`` with the producer
   id, epoch and instance read, not abort-only, and that the partition
   (with its topic id) is in it: else nothing is stored and the append
   fails with ``RemoteTxnMoved`` (retriable: the retry reads the row again
   and gets the precise answer);
2. stores the bytes once and the pending row, with an ordinal at or above
   ``REMOTE_ORDINALS`` (after the coordinator's own, which count from 0,
   and after every earlier one of the transaction on that partition).

The coordinator's end of the transaction (commit or abort) locks the same
state row ``FOR UPDATE`` first (``lock_txn``), so an append of B that
checked the row before is committed, and seen by the statements after the
lock (READ COMMITTED), and one after waits and then finds the transaction
ended. A commit publishes, per partition, B's rows before its own when
nothing moved since its own first (``stage_remote_commit``: offsets taken
from the partition row, under its lock, each batch at its place in the
producer's sequence order), else every row of the transaction there, its
own with B's, in that order, in SQL; an abort deletes every pending
row of the transaction by instance (as it always did). So a batch B
acknowledged is committed or aborted with its transaction, exactly once,
and one that arrives after the end began is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from uuid import UUID

import asyncpg

from tablets import batch as batch_header
from tablets.errors import StorageError
from tablets.seam import AtomicChange, PartitionLog, TopicPartition

from .migrate import quoted
from .schema import DEFAULT_SCHEMA
from .txn_publication import (
    PENDING_REF,
    TxnPartition,
    as_txn_change,
    log_id_of,
    parse_pending_ref,
    pending_bytes,
)
from .writer import PgChange

# The first ordinal of a pending row stored by a gateway other than the
# transaction's coordinator (the coordinator's count from 0).
REMOTE_ORDINALS = 1 << 30

# A batch header's fields, as SQL over the pending row's header: the record
# count (bytes 57-60), the last offset delta (23-26), the max timestamp (35-42).
_RECORDS = "('x' || encode(substring(r.header from 58 for 4), 'hex'))::bit(32)::int"
_LAST_DELTA = "('x' || encode(substring(r.header from 24 for 4), 'hex'))::bit(32)::int"
_MAX_TS = "('x' || encode(substring(r.header from 36 for 8), 'hex'))::bit(64)::bigint"
# ... and the base sequence (bytes 53-56).
_BASE_SEQ = "('x' || encode(substring(r.header from 54 for 4), 'hex'))::bit(32)::int"
# Sequences wrap from 2^31-1 to 0 (``tablets.producer_rules.next_seq``).
_SEQUENCES = 1 << 31


# (log id, instance, the partition's leader epoch now, transactional id) ->
# whether the coordinator's own pending rows there are all of that tenure.
OwnUnmoved = Callable[[int, int, int, str], bool]


class RemoteTxnMoved(StorageError):
    """The transaction's stored state moved between the leader's read and its
    append (its end began, a new epoch, or the partition is not in it):
    nothing was stored. Retriable: the retry reads the state again."""


class _Statements:
    def __init__(self, s: str) -> None:
        # The id's state (the coordinator's JSON, txn/state.py) and the
        # partitions of the transaction it names (its instance).
        self.read = (
            "SELECT t.state, q.topic_id, q.partition, q.topic "
            f"FROM {s}.txn_states t LEFT JOIN {s}.txn_partitions q "
            "ON q.transactional_id = t.transactional_id "
            "AND q.instance = (convert_from(t.state, 'UTF8')::jsonb->>'instance')::bigint "
            "WHERE t.transactional_id = $1")
        # The append's fence: the partition at the appender's epoch and the
        # transaction as read, both rows share-locked to the end of the
        # PostgreSQL transaction (the coordinator's end waits for it).
        self.fence = (
            f"SELECT 1 FROM {s}.partitions p, {s}.txn_states t "
            "WHERE p.log_id = $1 AND p.leader_epoch = $2 AND t.transactional_id = $3 "
            "AND convert_from(t.state, 'UTF8')::jsonb @> jsonb_build_object("
            "'pid', $4::bigint, 'epoch', $5::int, 'state', 'Ongoing', 'instance', $6::bigint, "
            "'abort_only', null) "
            f"AND EXISTS (SELECT 1 FROM {s}.txn_partitions q WHERE q.transactional_id = $3 "
            "AND q.instance = $6 AND q.topic_id = $7 AND q.partition = $8) "
            "FOR SHARE OF p, t")
        self.put = (
            f"WITH d AS (INSERT INTO {s}.batch_data (log_id, data) VALUES ($1, $2) "
            "RETURNING data_id) "
            f"INSERT INTO {s}.pending_batches (log_id, instance, ordinal, header, size, data_id) "
            "SELECT $1, $3, (SELECT greatest(coalesce(max(ordinal) + 1, 0), $4::int) "
            f"FROM {s}.pending_batches WHERE log_id = $1 AND instance = $3), $5, $6, d.data_id "
            "FROM d")
        self.lock = f"SELECT 1 FROM {s}.txn_states WHERE transactional_id = $1 FOR UPDATE"
        # The coordinator's commit: the rows other gateways stored for the
        # transaction on one partition (with its own, when they may be
        # interleaved: ``stage_remote_commit``) become index rows at the log
        # end, in the producer's order (below), naming the same bytes (shifted, as every published
        # pending batch); the partition row takes the offsets and bytes. No
        # row: nothing is written (not even the partition row).
        #
        # First, in a statement of its own, the partition row is locked when
        # there is anything to publish: the publication's statement then
        # starts after every change that held the row before it, so its read
        # of the log's newest batch (``prior``, the running max timestamp)
        # sees them. In one statement, READ COMMITTED would re-read only the
        # locked row after the wait, not the batches, and a commit that
        # waited behind another writer's would store running maxima below
        # that writer's: the time index out of offset order, which retention
        # by time would read as "everything up to here expired".
        self.lock_log = (
            f"SELECT 1 FROM {s}.partitions p WHERE p.log_id = $1 AND EXISTS ("
            f"SELECT 1 FROM {s}.pending_batches r WHERE r.log_id = $1 AND r.instance = $2 "
            "AND r.ordinal >= $3) FOR UPDATE OF p")
        #
        # The rows are published in the producer's order: by base sequence,
        # read from each stored header, whoever stored them (the coordinator
        # or a leader, before or after any number of moves). Sequences wrap
        # at 2^31-1 to 0 and a long-lived producer's may wrap inside a
        # transaction, so they are ordered around the circle from the first
        # batch: the one after the widest free stretch of sequences (from
        # one batch's end, base + records, to the next base, mod 2^31). A
        # transaction's batches on a partition are consecutive (each leader
        # takes only the next sequence), so every stretch between them is
        # empty and the one from the last batch's end back to the first is
        # 2^31 minus their records: exact below 2^31 records, wrapped or not.
        # The ordinal breaks ties (a batch without a sequence, -1).
        self.publish = (
            "WITH r AS (SELECT r.ordinal, r.size, r.data_id, "
            f"{_RECORDS} AS rc, {_LAST_DELTA} AS ld, {_MAX_TS} AS mt, {_BASE_SEQ} AS sq "
            f"FROM {s}.pending_batches r WHERE r.log_id = $1 AND r.instance = $2 "
            "AND r.ordinal >= $3), "
            "o AS (SELECT r.*, row_number() OVER (ORDER BY sq, ordinal) AS pos FROM r), "
            "gap AS (SELECT o.pos, o.sq, (((o.sq - coalesce(lag(o.sq::bigint + o.rc) "
            "OVER (ORDER BY o.pos), (SELECT l.sq::bigint + l.rc FROM o l "
            f"ORDER BY l.pos DESC LIMIT 1))) % {_SEQUENCES}) + {_SEQUENCES}) "
            f"% {_SEQUENCES} AS space FROM o), "
            "origin AS (SELECT sq AS seq0 FROM gap ORDER BY space DESC, pos LIMIT 1), "
            f"q AS (SELECT r.*, (((r.sq::bigint - origin.seq0) % {_SEQUENCES}) + {_SEQUENCES}) "
            f"% {_SEQUENCES} AS place FROM r, origin), "
            "w AS (SELECT q.*, sum(rc) OVER (ORDER BY place, ordinal) - rc AS delta, "
            "max(mt) OVER (ORDER BY place, ordinal) AS running FROM q), "
            "tot AS (SELECT count(*) AS k, coalesce(sum(rc), 0) AS n, "
            "coalesce(sum(size), 0) AS b FROM r), "
            f"up AS (UPDATE {s}.partitions SET log_end_offset = log_end_offset + tot.n, "
            "size_bytes = size_bytes + tot.b FROM tot WHERE log_id = $1 AND tot.k > 0 "
            "RETURNING log_end_offset - tot.n AS base), "
            f"gone AS (DELETE FROM {s}.pending_batches p USING r WHERE p.log_id = $1 "
            "AND p.instance = $2 AND p.ordinal = r.ordinal), "
            f"prior AS (SELECT coalesce((SELECT running_max_timestamp FROM {s}.batches "
            "WHERE log_id = $1 ORDER BY base_offset DESC LIMIT 1), -1) AS ts) "
            f"INSERT INTO {s}.batches (log_id, base_offset, last_offset, max_timestamp, "
            "running_max_timestamp, size, data_id, shifted) "
            "SELECT $1, up.base + w.delta, up.base + w.delta + w.ld, w.mt, "
            "greatest(prior.ts, w.running), w.size, w.data_id, true FROM w, up, prior")


class RemotePendingSink:
    """A ``BlobSink`` for one partition's batches of a transaction another
    gateway coordinates: nothing in memory, every check in the append's
    PostgreSQL transaction (``stage``). The coordinator's pending-bytes
    limits count only the batches it stores itself."""

    __slots__ = (
        "_remote",
        "epoch",
        "instance",
        "producer_id",
        "topic_id",
        "tp",
        "transactional_id",
    )

    def __init__(self, remote: PgRemoteTxns, transactional_id: str, producer_id: int,
                 epoch: int, instance: int, tp: TopicPartition, topic_id: UUID) -> None:
        self._remote = remote
        self.transactional_id = transactional_id
        self.producer_id = producer_id
        self.epoch = epoch
        self.instance = instance
        self.tp = tp
        self.topic_id = topic_id

    def expect(self) -> None:
        """The coordinator's end waits for this append through the state
        row's lock, not in memory."""

    def admit(self, nbytes: int) -> None:
        """No limit here (docs/cluster.md)."""

    def settled(self) -> None:
        pass

    def pending_records(self, partition_prefix: bytes) -> int:
        return 0  # the batches already stored are not known here: the bound is the log end

    def next_key(self, partition_prefix: bytes) -> bytes:
        # The ordinal is the database's (``stage``); the reference names the
        # transaction's instance (a retry's check reads it).
        return PENDING_REF.pack(log_id_of(partition_prefix), self.instance, REMOTE_ORDINALS)

    def added(self, key: bytes, batch: bytes) -> None:
        pass

    def stage(self, change: PgChange, log: TxnPartition, ref: bytes,
              batch: bytes | memoryview) -> bytes:
        """Add the batch to ``change`` (the leader's append), fenced by the
        partition's epoch and the transaction's stored state; returns the
        bytes stored."""
        return self._remote.stage(change, log, self, ref, batch)


class PgRemoteTxns:
    """The leader's and the coordinator's sides of transactional batches
    stored across gateways."""

    def __init__(self, pool: asyncpg.Pool, txn_partition: Callable[[PartitionLog], TxnPartition],
                 schema: str = DEFAULT_SCHEMA,
                 own_published: Callable[[int, int], None] | None = None,
                 own_unmoved: OwnUnmoved | None = None) -> None:
        self._pool = pool
        self._txn_partition = txn_partition
        # Told (log id, instance) once a commit published the coordinator's
        # own rows here (``stage_remote_commit``): what its storage recovered
        # of them is not needed any more.
        self._own_published = own_published
        # Whether the coordinator's own rows of a transaction on a log were
        # all stored by it while it held the partition at the given leader
        # epoch and the id's slot as now (``PendingBatches.unmoved``); None:
        # never assumed (every commit with own rows publishes in SQL).
        self._own_unmoved = own_unmoved
        self._sql = _Statements(quoted(schema))

    async def read_txn(self, transactional_id: str,
                       ) -> tuple[bytes, dict[TopicPartition, UUID]] | None:
        """The id's stored state and the partitions of the transaction it
        names (None: no such id)."""
        try:
            async with self._pool.acquire() as conn:
                rows = await conn.fetch(self._sql.read, transactional_id)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            # Retriable for the client, as a failed append's.
            raise StorageError(f"reading the state of transactional id {transactional_id!r}: "
                               f"{exc}") from exc
        if not rows:
            return None
        partitions = {(row["topic"], int(row["partition"])): row["topic_id"] for row in rows
                      if row["topic"] is not None}
        return bytes(rows[0]["state"]), partitions

    def pending_sink(self, transactional_id: str, producer_id: int, epoch: int, instance: int,
                     tp: TopicPartition, topic_id: UUID) -> RemotePendingSink:
        return RemotePendingSink(self, transactional_id, producer_id, epoch, instance, tp,
                                 topic_id)

    def stage(self, change: PgChange, log: TxnPartition, sink: RemotePendingSink, ref: bytes,
              batch: bytes | memoryview) -> bytes:
        log_id, instance, _ = parse_pending_ref(ref)
        if log_id != log.log_id or instance != sink.instance:
            raise ValueError(f"pending reference {ref.hex()} is not of log {log.log_id}, "
                             f"instance {sink.instance}")
        data = pending_bytes(batch, log.batch_epoch)
        epoch = log.leader_epoch
        topic, partition = sink.tp
        change.fence(self._sql.fence, log_id, epoch, sink.transactional_id, sink.producer_id,
                     sink.epoch, instance, sink.topic_id, partition,
                     refused=lambda: RemoteTxnMoved(
                         f"{topic}-{partition}: the transaction of {sink.transactional_id} "
                         f"(producer {sink.producer_id} epoch {sink.epoch}) is not open with "
                         f"this partition any more, or log {log_id} is not at leader epoch "
                         f"{epoch}: transactional batch not stored"))
        change.execute(self._sql.put, log_id, data, instance, REMOTE_ORDINALS,
                       data[:batch_header.HEADER_SIZE], len(data))
        change.nbytes += len(data)
        return data

    def lock_txn(self, change: AtomicChange, transactional_id: str) -> None:
        """First in the coordinator's end of a transaction: see the module's
        docstring."""
        as_txn_change(change).execute(self._sql.lock, transactional_id)

    def stage_remote_commit(self, change: AtomicChange, log: PartitionLog, instance: int,
                            transactional_id: str, own: bool = False) -> bool:
        """Before the partition's own publication in the commit ``change``:
        publish the batches other gateways stored for ``instance`` on it.

        ``own``: the coordinator has batches of its own there too. If it
        leads the partition now and stored every one of them itself at its
        current leader epoch while holding ``transactional_id``'s slot as
        now (``own_unmoved``: nothing moved since its first), the leader's
        were all stored before them (the partition moved to it, or the slot
        came to its leader, before its first), so only the leader's are
        published here and the caller's in-memory plan publishes its own
        after them (False). Otherwise (it does not lead the partition, or
        the partition or the slot moved since it stored one: the two kinds
        may be interleaved, whatever the number of moves), every pending
        row of the transaction there is published here, own (ordinals from
        0) and the leaders' (from ``REMOTE_ORDINALS``) together in the
        producer's sequence order, and True is returned: the caller
        publishes no own batch of it (its marker only)."""
        part = self._txn_partition(log)
        epoch = part.publish_epoch
        log_id = part.log_id
        everything = own and (epoch is None or self._own_unmoved is None
                              or not self._own_unmoved(log_id, instance, epoch,
                                                       transactional_id))
        pg = as_txn_change(change)
        first = 0 if everything else REMOTE_ORDINALS
        pg.execute(self._sql.lock_log, log_id, instance, first)
        pg.execute(self._sql.publish, log_id, instance, first)
        if everything and self._own_published is not None:
            told = self._own_published
            pg.on_durable(lambda: told(log_id, instance))
        return everything
