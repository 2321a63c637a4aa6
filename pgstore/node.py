"""One gateway's storage on PostgreSQL: the seam's ``NodeStorage``.

    node = PgNodeStorage("postgresql://...", PgNodeSettings(...))
    await node.start()      # migrate, connect, claim every partition, load
    ...
    await node.close()

``start`` brings the schema to this code's version (``migrate``), starts
the group-commit writer (every change goes through it: one PostgreSQL
transaction per group), opens a small pool for reads, then loads the topics
and claims their partitions (``topics``: every leader epoch bumped, so the
gateway started last on a database is the one that writes; an earlier one's
appends are fenced and answered NOT_LEADER_OR_FOLLOWER).

What it keeps, and what is not on this store yet:

- topics, configs, partitions, appends, reads, retention (retention.ms,
  retention.bytes), DeleteRecords, idempotent producers and their expiry:
  here and in the modules it holds;
- the cluster id: the ``cluster`` row, made once by the first migration;
- consumer offsets and node records (ACLs, SCRAM): ``pgstore.consumer_offsets``
  and ``pgstore.node_records``, made by the factories given to the
  constructor and loaded at start;
- statistics: the writer's ``WriteStats``; ``store_failure`` is always None
  (a failed write fails alone, and the writer reconnects: it never stays
  failed);
- the transaction coordinator's storage (``txn_storage.PgTransactionStorage``:
  producer ids and transaction instances from ``counters``, the
  coordinator's state, pending batches), loaded at start, so open
  transactions are recovered; every partition log stages its transactional
  batches there (``LogContext.pending``);
- the cluster (``settings.cluster`` set): ``start`` then claims nothing
  (every log starts closed), and ``join_cluster`` (once the listeners are
  bound, so their addresses can be advertised) registers the gateway and
  leads its share (``pgstore.cluster``); ``cluster()`` is the routing view.
  Without it, the gateway claims every partition at start (one gateway per
  database; tests of the engine alone);
- compacted topics: the log cleaner (``pgstore.cleaner``, log.cleaner.*
  in ``settings.cleaner``) compacts the ones this gateway leads; ``compact``
  runs it on one partition now.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import asyncpg

from common.clock import now_ms
from tablets.compaction_config import CleanerSettings
from tablets.errors import StorageError, TopicAlreadyExists
from tablets.seam import (
    CleanerStats,
    ConsumerOffsetStore,
    ImportantGroup,
    NodeRecordKind,
    NodeRecordStore,
    PartitionCompaction,
    PartitionLog,
    RunStats,
    TopicView,
    WriteStats,
)

from .cleaner import PgCleaner
from .cluster import ClusterSettings, PgCluster
from .connect import connect as connect_any
from .consumer_offsets import PgConsumerOffsets
from .important import PgImportantConsumers
from .log_sql import LogSql
from .log_state import LogContext
from .membership import Listener, session_settings
from .migrate import migrate, quoted
from .partition_log import PgPartitionLog
from .remote_txn import PgRemoteTxns
from .retention import NodeRetention
from .retention_sql import vacuum
from .schema import DEFAULT_SCHEMA
from .topic_notices import announce_topics
from .topics import PgTopic, PgTopicCatalog
from .txn_publication import TxnPartition
from .txn_storage import PgTransactionStorage
from .writer import PgChange, PgWriter

if TYPE_CHECKING:
    from uuid import UUID

log = logging.getLogger(__name__)

NODE_RECORD_KINDS = ("acl", "scram")


@dataclass(frozen=True, slots=True)
class PgNodeSettings:
    schema: str = DEFAULT_SCHEMA
    # Node-wide budget for the partitions' in-memory tails, shared over the
    # partitions that are read (tablets.tail_budget).
    tail_cache_bytes: int = 256 << 20
    # Node-wide defaults for topic configs (log.retention.ms and friends).
    topic_defaults: dict[str, str] = field(default_factory=dict)
    producer_id_expiration_ms: int = 86_400_000
    max_producers_per_partition: int = 10_000
    read_connections: int = 4  # the pool reads below the tails use
    # Several gateways over one database (pgstore.cluster); None: this one claims everything.
    cluster: ClusterSettings | None = None
    # The log cleaner of compacted topics (log.cleaner.*).
    cleaner: CleanerSettings = field(default_factory=CleanerSettings)


def _cluster_session(settings: PgNodeSettings) -> dict[str, str] | None:
    """The session settings of every connection of a gateway in a cluster (None
    alone): a session that sits in a transaction for a quarter of the lease is
    ended (``membership.session_settings``). A gateway paused (SIGSTOP, a stall)
    between its writer's fenced append and its COMMIT holds the partition's row
    locked, and the successor's takeover of that row would wait for as long as
    the pause lasts (``tests/test_pgstore_writer_pause.py``)."""
    if settings.cluster is None:
        return None
    return session_settings(settings.cluster.lease_seconds)


class LoadedOffsets(ConsumerOffsetStore, Protocol):
    """Consumer offsets on PostgreSQL, loaded at start (``pgstore.consumer_offsets``)."""

    async def load(self, conn: asyncpg.Connection) -> None: ...

    def is_released(self, group: str, topic: str, partition: int) -> bool: ...

    def drop_topic(self, topic: str, change: PgChange) -> None:
        """Add the deletion of a deleted topic's offsets to ``change``."""
        ...


class LoadedRecords(NodeRecordStore, Protocol):
    """Node records of one kind on PostgreSQL, loaded at start (``pgstore.node_records``)."""

    async def load(self, conn: asyncpg.Connection) -> None: ...


# How the node makes them: (writer, schema) and (writer, schema, kind).
OffsetsFactory = Callable[[PgWriter, str], LoadedOffsets]
RecordsFactory = Callable[[PgWriter, str, str], LoadedRecords]


class PgNodeStorage:
    def __init__(self, dsn: str, settings: PgNodeSettings | None = None, *,
                 offsets: OffsetsFactory | None = None,
                 records: RecordsFactory | None = None) -> None:
        self.dsn = dsn
        self.settings = settings or PgNodeSettings()
        self.writer = PgWriter(dsn, connect=functools.partial(
            connect_any, server_settings=_cluster_session(self.settings)))
        self.validators = ThreadPoolExecutor(max_workers=2, thread_name_prefix="pg-validate")
        # The server passes PgConsumerOffsets and PgNodeRecords
        # (pgstore/consumer_offsets.py, pgstore/node_records.py).
        self._offsets_factory = offsets
        self._records_factory = records
        self._offsets: LoadedOffsets | None = None
        self._records: dict[str, LoadedRecords] = {}
        self._pool: asyncpg.Pool | None = None
        self._catalog: PgTopicCatalog | None = None
        self._txn_storage = PgTransactionStorage(
            self.writer, None, self.settings.schema, partition=self.partition,
            has_partition=self.has_partition, txn_partition=_txn_partition)
        self.retention = NodeRetention(None, self.settings.producer_id_expiration_ms)
        self.cleaner = PgCleaner(self.settings.cleaner, self.settings.schema,
                                 deleted=self._compacted_away)
        self.cluster_id = ""
        self._cluster: PgCluster | None = None

    # ----------------------------------------------------------- lifecycle
    async def start(self) -> None:
        schema = self.settings.schema
        conn: asyncpg.Connection = await asyncpg.connect(self.dsn)
        try:
            await migrate(conn, schema)
            self.cluster_id = str(await conn.fetchval(
                f"SELECT cluster_id FROM {quoted(schema)}.cluster"))
            self._pool = await asyncpg.create_pool(
                self.dsn, min_size=1, max_size=self.settings.read_connections,
                server_settings=_cluster_session(self.settings))
            self._txn_storage.connect_pool(self._pool)
            await self.writer.start()
            clustered = self.settings.cluster is not None
            context = LogContext(self.writer, self._pool, LogSql(schema), self.validators,
                                 self._txn_storage, batch_epochs=clustered)
            self.retention.vacuum = self._vacuum
            self._catalog = PgTopicCatalog(context, self.settings, lambda: self._offsets)
            if clustered:
                self._catalog.notify = lambda change, name: announce_topics(change, schema, name)
            await self._catalog.load(conn, claim=not clustered)
            await self._txn_storage.load(conn)
            if self._offsets_factory is not None:
                offsets = self._offsets = self._offsets_factory(self.writer, schema)
                if isinstance(offsets, PgConsumerOffsets):  # a transaction's offsets
                    self._txn_storage.connect_offsets(offsets)  # (before load: its hook)
                await offsets.load(conn)
                offsets.is_important = self._catalog.is_important_consumer
                self.retention.important = PgImportantConsumers(offsets, schema)
            if self._records_factory is not None:
                for kind in NODE_RECORD_KINDS:
                    records = self._records_factory(self.writer, schema, kind)
                    await records.load(conn)
                    self._records[kind] = records
            if self.settings.cluster is not None:
                # Routing answers "no leader yet" until the gateway has joined.
                self._cluster = PgCluster(self.dsn, schema, self._catalog,
                                          self.settings.cluster, self._offsets,
                                          txns=self._txn_storage)
        finally:
            await conn.close()
        self.cleaner.start(self.catalog.logs)
        log.info("PostgreSQL store: %d topics, %d partitions %s (schema %s)",
                 len(self.catalog.topics), len(self.catalog.logs()),
                 "loaded, led once the cluster hands them out" if clustered else "claimed",
                 schema)

    async def join_cluster(self, listeners: list[Listener]) -> None:
        """Register this gateway with its advertised listeners and lead its
        share of the partitions and coordinator slots (``settings.cluster``)."""
        assert self._cluster is not None, "no cluster settings, or not started"
        await self._cluster.join(listeners)

    def cluster(self) -> PgCluster | None:
        """The routing view (None: not in a cluster); before ``join_cluster``
        it knows no leader and no coordinator."""
        return self._cluster

    async def close(self) -> None:
        await self.cleaner.close()
        if self._catalog is not None:
            self._catalog.tail_budget.close()
        if self._cluster is not None:
            await self._cluster.leave()
        await self.writer.close()
        await self._txn_storage.group_rereads.close()
        if self._pool is not None:
            await self._pool.close()
        self.validators.shutdown(wait=True, cancel_futures=True)

    @property
    def catalog(self) -> PgTopicCatalog:
        assert self._catalog is not None, "the PostgreSQL store is not started"
        return self._catalog

    # -------------------------------------------------------------- topics
    def list_topics(self) -> list[PgTopic]:
        return self.catalog.list_topics()

    def find_topic(self, name: str) -> PgTopic | None:
        return self.catalog.topics.get(name)

    def topic_by_id(self, topic_id: UUID) -> PgTopic | None:
        return self.catalog.by_id.get(topic_id)

    def topic(self, name: str) -> PgTopic:
        return self.catalog.topic(name)

    def partition(self, name: str, index: int) -> PgPartitionLog:
        return self.catalog.partition(name, index)

    def has_partition(self, name: str, index: int) -> bool:
        topic = self.catalog.topics.get(name)
        return topic is not None and 0 <= index < len(topic.partitions)

    def topic_configs(self, topic: TopicView) -> dict[str, str]:
        return self.catalog.topic_configs(topic)

    def check_new_topic(self, name: str, partitions: int, replication_factor: int,
                        configs: dict[str, str | None]) -> dict[str, str]:
        return self.catalog.check_new_topic(name, partitions, replication_factor, configs)

    async def create_topic(self, name: str, partitions: int,
                           configs: dict[str, str]) -> PgTopic:
        try:
            topic = await self.catalog.create_topic(name, partitions, configs)
        except TopicAlreadyExists:
            if self._cluster is not None:
                # Made by another gateway a moment ago: learn it now (its
                # notice may have been read while this create was in flight,
                # and skipped), so the next lookup here finds it.
                await self._cluster.catch_up_topics()
            raise
        if self._cluster is not None:
            await self._cluster.lead_new()  # its partitions need leaders now
        return topic

    async def delete_topic(self, name: str) -> PgTopic:
        topic = await self.catalog.delete_topic(name)
        self.retention.forget(name)
        return topic

    def check_new_partitions(self, name: str, count: int) -> PgTopic:
        return self.catalog.check_new_partitions(name, count)

    async def create_partitions(self, name: str, count: int) -> None:
        await self.catalog.create_partitions(name, count)
        if self._cluster is not None:
            await self._cluster.lead_new()

    async def set_topic_configs(self, name: str, configs: dict[str, str]) -> None:
        await self.catalog.set_topic_configs(name, configs)

    # ---------------------------------------------- retention and compaction
    async def _vacuum(self) -> None:
        assert self._pool is not None
        async with self._pool.acquire() as conn:
            await vacuum(conn, self.settings.schema)

    async def enforce_retention(self) -> None:
        """Retention of every partition (held back for important consumer
        groups), and expiry of idle producers."""
        await self.retention.run(self.catalog.logs(), now_ms())

    async def compact(self, name: str, index: int) -> RunStats | None:
        """Compact one partition of a compacted topic now, due or not (what the
        cleaner does in the background); its stats, or None if it did not run
        (``NotLeader``: another gateway leads it)."""
        partition = self.partition(name, index)
        partition.check_writable()
        return await self.cleaner.clean(self.cleaner.compacted(partition), force=True)

    def _compacted_away(self, nbytes: int) -> None:
        """A compaction left ``nbytes`` of dead rows: retention's VACUUM counts them."""
        self.retention.deleted_since_vacuum += nbytes

    # ------------------------------------------------ health and statistics
    def store_failure(self) -> BaseException | None:
        return None

    def write_stats(self) -> WriteStats:
        return self.writer.stats

    def cleaner_stats(self) -> CleanerStats:
        return self.cleaner.stats

    def compaction_statuses(self, now_ms: int) -> list[PartitionCompaction]:
        """The compacted partitions led here, as of the cleaner's last check."""
        return self.cleaner.statuses(self.catalog.logs())

    def producer_stats(self) -> tuple[int, int]:
        logs = self.catalog.logs()
        return (sum(len(p.producer_states) for p in logs),
                sum(p.producer_states.evictions for p in logs))

    def important_groups(self, topic: str | None = None) -> list[ImportantGroup]:
        """What the important consumer groups hold back from retention, of one
        topic (None: every topic)."""
        if topic is None:
            return self.retention.report(self.catalog.logs())
        found = self.catalog.topics.get(topic)
        return [] if found is None else self.retention.report(found.partitions)

    # --------------------------------------------- offsets and node records
    @property
    def consumer_offsets(self) -> ConsumerOffsetStore:
        if self._offsets is None:
            raise StorageError("consumer offsets are not connected to this PostgreSQL store")
        return self._offsets

    def node_records(self, kind: NodeRecordKind) -> NodeRecordStore:
        found = self._records.get(kind)
        if found is None:
            raise StorageError(f"node records ({kind}) are not connected to this PostgreSQL "
                               "store")
        return found

    def transaction_storage(self) -> PgTransactionStorage:
        """The transaction coordinator's storage (``txn_storage``)."""
        return self._txn_storage

    def remote_transactions(self) -> PgRemoteTxns:
        """Transactional batches stored across gateways (``remote_txn``); once started."""
        assert self._pool is not None, "the engine is not started"
        return PgRemoteTxns(self._pool, _txn_partition, self.settings.schema,
                            self._txn_storage.forget_recovered, self._txn_storage.own_unmoved)


def _txn_partition(log: PartitionLog) -> TxnPartition:
    """Every log of this engine is a ``PgPartitionLog``, which is a ``TxnPartition``."""
    assert isinstance(log, PgPartitionLog), f"not a log of the PostgreSQL store: {log!r}"
    return log
