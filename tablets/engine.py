"""The storage engine: topics and their partition tablets on one RocksDB store.

It implements the storage seam's ``NodeStorage`` (``tablets/seam.py``, the
contract in Kafka's terms: topics, partitions, configs, appends, reads,
offsets), and hands the transaction coordinator its ``TransactionStorage``
(``txn_storage.py``). Another backend implements the same Protocols; nothing
here knows about the Kafka protocol.

The engine owns the store and its writer, start-up and shutdown, the
committed consumer offsets and important consumer groups, retention and the
cleaner's runs over every partition, the node's statistics, its node records
and the transaction storage. The topics are its collaborator's,
``engine.catalog`` (``topic_catalog``: topic records, Kafka's checks of new
topics and partitions, the settings each topic's configs give its tablets);
the seam's topic and partition methods delegate there.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from common.clock import now_ms

from . import keys
from .cleaner import Cleaner, CleanerSettings
from .consumer_offsets import ConsumerOffsets
from .format import mark_current, needs_migration
from .important import ImportantConsumers
from .node_records import NODE_RECORD_KINDS, NodeRecords
from .rocks_store import FsyncPolicy, Ops, RocksStore
from .seam import (
    CleanerStats,
    ImportantGroup,
    NodeRecordKind,
    PartitionCompaction,
    RunStats,
    TopicView,
    WriteStats,
)
from .store import GroupCommitWriter
from .topic_catalog import Topic, TopicCatalog
from .topic_config import TOPIC_CONFIGS
from .topic_names import check_topic_name
from .txn_storage import RocksTransactionStorage

if TYPE_CHECKING:
    from uuid import UUID

    from .tablet import PartitionTablet

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EngineSettings:
    fsync: FsyncPolicy = "never"
    # Node-wide budget for the partitions' in-memory tails, shared over the
    # partitions that are read (tablets.tail_budget).
    tail_cache_bytes: int = 256 << 20
    # Node-wide defaults for topic configs (log.retention.ms and friends).
    topic_defaults: dict[str, str] = field(default_factory=dict)
    # Idempotent producers: idle ones are forgotten, and a partition keeps at
    # most this many (the least recently used goes first).
    producer_id_expiration_ms: int = 86_400_000
    max_producers_per_partition: int = 10_000
    # The log cleaner of compacted topics (log.cleaner.*).
    cleaner: CleanerSettings = field(default_factory=CleanerSettings)


class StorageEngine:
    def __init__(self, data_dir: str, settings: EngineSettings | None = None) -> None:
        self.settings = settings or EngineSettings()
        os.makedirs(data_dir, exist_ok=True)
        self.store = RocksStore(os.path.join(data_dir, "rocksdb"), self.settings.fsync)
        self.files_root = os.path.join(data_dir, "segments")
        self._migrate = needs_migration(self.store)  # refuses a newer format
        self.writer: GroupCommitWriter | None = None
        # Checks the records of compressed and large batches off the event
        # loop; two threads bound the memory decompression holds at once.
        self.validators = ThreadPoolExecutor(max_workers=2, thread_name_prefix="validate")
        self._consumer_offsets: ConsumerOffsets | None = None  # set by start()
        self.important: ImportantConsumers | None = None  # set by start()
        self._node_records: dict[str, NodeRecords] = {}
        self.cleaner = Cleaner(self.store, self.settings.cleaner)
        # The topics and their tablets, seeing the engine as a narrow Protocol.
        self.catalog = TopicCatalog(self)
        self.cluster_id = self._load_cluster_id()

    # ---------------------------------------------------------- lifecycle
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Load every topic and its tablets, and start the writer thread."""
        self.writer = GroupCommitWriter(self.store, loop)
        self.catalog.load(self._migrate)
        if self._migrate or self.store.get(keys.FORMAT) is None:
            mark_current(self.store)
            self._migrate = False
        offsets = self._consumer_offsets = ConsumerOffsets(self.store, self.writer)
        offsets.load()
        self.important = ImportantConsumers(offsets)
        offsets.is_important = self.catalog.is_important_consumer
        self.cleaner.start(loop, self.tablets)
        log.info("loaded %d topics, committed offsets of %d groups", len(self.topics),
                 len(self.consumer_offsets.groups()))

    def close(self) -> None:
        self.cleaner.close()
        self.catalog.tail_budget.close()
        self.validators.shutdown(wait=True, cancel_futures=True)
        if self.writer is not None:
            self.writer.close()
        self.store.close()

    def _load_cluster_id(self) -> str:
        key = keys.COUNTER + b"cluster.id"
        value = self.store.get(key)
        if value is None:
            value = uuid.uuid4().hex[:22].encode()
            ops = Ops()
            ops.put(key, value)
            self.store.write_now(ops)
        return value.decode()

    @property
    def consumer_offsets(self) -> ConsumerOffsets:
        assert self._consumer_offsets is not None, "engine not started"
        return self._consumer_offsets

    # ------------------------------------------- topics (the catalog's)
    @property
    def topics(self) -> dict[str, Topic]:
        """Every topic by name (the catalog's)."""
        return self.catalog.topics

    def list_topics(self) -> list[Topic]:
        """Every topic, sorted by name."""
        return self.catalog.list_topics()

    def find_topic(self, name: str) -> Topic | None:
        return self.catalog.find_topic(name)

    def topic_by_id(self, topic_id: UUID) -> Topic | None:
        return self.catalog.topic_by_id(topic_id)

    def topic(self, name: str) -> Topic:
        return self.catalog.topic(name)

    def partition(self, name: str, index: int) -> PartitionTablet:
        return self.catalog.partition(name, index)

    def has_partition(self, name: str, index: int) -> bool:
        return self.catalog.has_partition(name, index)

    def topic_configs(self, topic: TopicView) -> dict[str, str]:
        """Every config of a topic with its effective value."""
        return self.catalog.topic_configs(topic)

    def check_new_topic(
        self, name: str, partitions: int, replication_factor: int,
        configs: dict[str, str | None],
    ) -> dict[str, str]:
        return self.catalog.check_new_topic(name, partitions, replication_factor, configs)

    async def create_topic(
        self, name: str, partitions: int, configs: dict[str, str]
    ) -> Topic:
        return await self.catalog.create_topic(name, partitions, configs)

    async def delete_topic(self, name: str) -> Topic:
        return await self.catalog.delete_topic(name)

    def check_new_partitions(self, name: str, count: int) -> Topic:
        return self.catalog.check_new_partitions(name, count)

    async def create_partitions(self, name: str, count: int) -> None:
        await self.catalog.create_partitions(name, count)

    async def set_topic_configs(self, name: str, configs: dict[str, str]) -> None:
        """Replace a topic's config overrides (checked again here)."""
        await self.catalog.set_topic_configs(name, configs)

    def tablets(self) -> list[PartitionTablet]:
        """Every partition of every topic."""
        return self.catalog.tablets()

    # ------------------------------------------ retention and compaction
    async def enforce_retention(self) -> None:
        """Retention of every partition, and expiry of idle producers."""
        now = now_ms()
        assert self.important is not None, "engine not started"
        for topic in list(self.topics.values()):
            for tablet in topic.partitions:
                if not tablet.deleted:
                    # Held back at what important consumer groups have not committed.
                    await self.important.retain(tablet, now)
                    await tablet.truncation.expire_producers(
                        now, self.settings.producer_id_expiration_ms)

    async def compact(self, name: str, index: int) -> RunStats | None:
        """Compact one partition of a compacted topic now, due or not (what the
        cleaner does in the background); its stats, or None if it did not run."""
        return await self.cleaner.clean(self.partition(name, index), force=True)

    def producer_stats(self) -> tuple[int, int]:
        """(producer ids kept, producer ids evicted) over every partition."""
        tablets = self.tablets()
        return (sum(len(t.producers) for t in tablets),
                sum(t.producers.evictions for t in tablets))

    # ------------------------------------------------- health and statistics
    def store_failure(self) -> BaseException | None:
        """Why a store write failed (writes are refused until a restart), or None."""
        return None if self.writer is None else self.writer.failed

    def write_stats(self) -> WriteStats:
        return self.store.stats

    def cleaner_stats(self) -> CleanerStats:
        return self.cleaner.stats

    def compaction_statuses(self, now_ms: int) -> list[PartitionCompaction]:
        """Every partition the cleaner could compact now (its topic is compacted)."""
        return [PartitionCompaction(topic.name, tablet.partition, tablet.compaction.status,
                                    tablet.clean_end)
                for topic in self.topics.values() for tablet in topic.partitions
                if tablet.compaction.cleanable(now_ms) is not None]

    def important_groups(self, topic: str | None = None) -> list[ImportantGroup]:
        """What the important consumer groups hold back from retention, of one
        topic (None: every topic)."""
        if self.important is None:
            return []
        if topic is None:
            return self.important.report_tablets(self.tablets())
        found = self.topics.get(topic)
        return [] if found is None else self.important.report_tablets(found.partitions)

    # ------------------------------------------------------- node records
    def node_records(self, kind: NodeRecordKind) -> NodeRecords:
        """The node's records of one kind: "acl" or "scram" (credentials)."""
        found = self._node_records.get(kind)
        if found is None:
            found = self._node_records[kind] = NodeRecords(self.store, NODE_RECORD_KINDS[kind],
                                                           self.writer)
        return found

    def cluster(self) -> None:
        """One node alone: it leads every partition and coordinates every key."""
        return None

    def transaction_storage(self) -> RocksTransactionStorage:
        """What the transaction coordinator may ask of this engine."""
        assert self.writer is not None, "engine not started"
        return RocksTransactionStorage(self.store, self.writer, self.consumer_offsets,
                                       self.partition, self.has_partition,
                                       self.catalog.tablet_of_ref)


__all__ = ["TOPIC_CONFIGS", "EngineSettings", "StorageEngine", "Topic", "check_topic_name"]
