"""The storage engine: topics and their partition tablets on one RocksDB store.

It implements the storage seam's ``NodeStorage`` (``tablets/seam.py``, the
contract in Kafka's terms: topics, partitions, configs, appends, reads,
offsets), and hands the transaction coordinator its ``TransactionStorage``
(``txn_storage.py``). Another backend implements the same Protocols; nothing
here knows about the Kafka protocol.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import re
import struct
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from uuid import UUID

from common.clock import now_ms

from . import keys
from .cleaner import Cleaner, CleanerSettings
from .compaction import CompactionConfig
from .config_parsing import parse_list
from .consumer_offsets import ConsumerOffsets
from .errors import (
    InvalidPartitions,
    InvalidReplicationFactor,
    InvalidTopicName,
    TopicAlreadyExists,
    UnknownPartition,
    UnknownTopic,
)
from .format import mark_current, needs_migration
from .important import ImportantConsumers
from .node_records import NODE_RECORD_KINDS, NodeRecords
from .seam import (
    CleanerStats,
    ImportantGroup,
    NodeRecordKind,
    PartitionCompaction,
    RunStats,
    TopicView,
    WriteStats,
)
from .segment_files import PartitionFiles
from .store import FsyncPolicy, GroupCommitWriter, Ops, RocksStore
from .tablet import PartitionTablet
from .tablet_settings import TabletSettings
from .topic_config import (
    IMPORTANT_GROUPS,
    IMPORTANT_MAX_BYTES,
    TOPIC_CONFIGS,
    TXN_OFFSET_LOWER_BOUND,
    TXN_PRODUCE_OFFSET,
    effective,
    validate_all,
)
from .txn_storage import RocksTransactionStorage

log = logging.getLogger(__name__)

_LEGAL_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_NAME = 249
MAX_PARTITIONS = 10_000


def check_topic_name(name: str) -> None:
    """Kafka's topic name rules (Topic.validate)."""
    if not name:
        raise InvalidTopicName("Topic name is illegal, it can't be empty")
    if name in (".", ".."):
        raise InvalidTopicName("Topic name cannot be \".\" or \"..\"")
    if len(name) > MAX_TOPIC_NAME:
        raise InvalidTopicName(
            f"Topic name is illegal, it can't be longer than {MAX_TOPIC_NAME} characters"
        )
    if not _LEGAL_NAME.match(name):
        raise InvalidTopicName(
            f"Topic name {name!r} is illegal, it contains a character other than ASCII "
            "alphanumerics, '.', '_' and '-'"
        )


def collision_key(name: str) -> str:
    """Kafka's metric names turn '.' into '_': two topics whose names then
    match would collide (Topic.hasCollision), so the second is refused."""
    return name.replace(".", "_")


@dataclass(slots=True)
class Topic:
    name: str
    topic_id: UUID
    configs: dict[str, str]  # overrides only; defaults come from the engine
    partitions: list[PartitionTablet] = field(default_factory=list)
    _settings: TabletSettings | None = None

    def record(self) -> bytes:
        return json.dumps(
            {"id": str(self.topic_id), "partitions": len(self.partitions), "configs": self.configs}
        ).encode()


@dataclass(frozen=True, slots=True)
class EngineSettings:
    fsync: FsyncPolicy = "never"
    # Node-wide budget for the partitions' in-memory tails, shared evenly.
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
        self.topics: dict[str, Topic] = {}
        self.topics_by_id: dict[UUID, Topic] = {}
        self.topics_by_collision_key: dict[str, Topic] = {}
        self.writer: GroupCommitWriter | None = None
        # Checks the records of compressed and large batches off the event
        # loop; two threads bound the memory decompression holds at once.
        self.validators = ThreadPoolExecutor(max_workers=2, thread_name_prefix="validate")
        self._consumer_offsets: ConsumerOffsets | None = None  # set by start()
        self.important: ImportantConsumers | None = None  # set by start()
        self._node_records: dict[str, NodeRecords] = {}
        self.cleaner = Cleaner(self.store, self.settings.cleaner)
        self.cluster_id = self._load_cluster_id()

    # ---------------------------------------------------------- lifecycle
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Load every topic and its tablets, and start the writer thread."""
        self.writer = GroupCommitWriter(self.store, loop)
        for key, value in self.store.scan(keys.TOPIC, keys.TOPIC + b"\xff"):
            name = key[1:].decode()
            record = json.loads(value)
            topic = Topic(name, UUID(record["id"]), record["configs"])
            self._add_partitions(topic, record["partitions"])
            for tablet in topic.partitions:
                tablet.load(self._migrate)
            self._register(topic)
        if self._migrate or self.store.get(keys.FORMAT) is None:
            mark_current(self.store)
            self._migrate = False
        self._share_tail_budget()
        offsets = self._consumer_offsets = ConsumerOffsets(self.store, self.writer)
        offsets.load()
        self.important = ImportantConsumers(offsets)
        offsets.is_important = self.is_important_consumer
        self.cleaner.start(loop, self.tablets)
        log.info("loaded %d topics, committed offsets of %d groups", len(self.topics),
                 len(self.consumer_offsets.groups()))

    def close(self) -> None:
        self.cleaner.close()
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

    # --------------------------------------------------------- topics
    def list_topics(self) -> list[Topic]:
        """Every topic, sorted by name."""
        return sorted(self.topics.values(), key=lambda t: t.name)

    def find_topic(self, name: str) -> Topic | None:
        return self.topics.get(name)

    def topic_by_id(self, topic_id: UUID) -> Topic | None:
        return self.topics_by_id.get(topic_id)

    def topic(self, name: str) -> Topic:
        topic = self.topics.get(name)
        if topic is None:
            raise UnknownTopic(f"topic {name!r} does not exist")
        return topic

    def partition(self, name: str, index: int) -> PartitionTablet:
        topic = self.topic(name)
        if not 0 <= index < len(topic.partitions):
            raise UnknownPartition(f"partition {name}-{index} does not exist")
        tablet: PartitionTablet = topic.partitions[index]
        return tablet

    def has_partition(self, name: str, index: int) -> bool:
        topic = self.topics.get(name)
        return topic is not None and 0 <= index < len(topic.partitions)

    def topic_configs(self, topic: TopicView) -> dict[str, str]:
        """Every config of a topic with its effective value."""
        return effective(topic.configs, self.settings.topic_defaults)

    def check_new_topic(
        self, name: str, partitions: int, replication_factor: int,
        configs: dict[str, str | None],
    ) -> dict[str, str]:
        """Every check of a new topic, in the order Kafka's controller makes
        them; returns the config overrides as they are stored."""
        check_topic_name(name)
        if name in self.topics:
            raise TopicAlreadyExists(f"Topic '{name}' already exists.")
        other = self.topics_by_collision_key.get(collision_key(name))
        if other is not None:
            raise InvalidTopicName(f"Topic '{name}' collides with existing topic: {other.name}")
        stored = validate_all(configs)
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise InvalidPartitions(
                f"Number of partitions must be between 1 and {MAX_PARTITIONS}, got {partitions}"
            )
        if replication_factor not in (-1, 1):
            raise InvalidReplicationFactor(
                f"Replication factor {replication_factor} is larger than the 1 available broker"
            )
        return stored

    async def create_topic(
        self, name: str, partitions: int, configs: dict[str, str]
    ) -> Topic:
        stored = self.check_new_topic(name, partitions, 1, dict(configs))
        topic = Topic(name, uuid.uuid4(), stored)
        self._add_partitions(topic, partitions)
        # Registered before the write lands so a concurrent create sees it.
        self._register(topic)
        ops = Ops()
        ops.put(keys.topic_key(name), topic.record())
        for tablet in topic.partitions:
            tablet.initial_ops(ops)
        try:
            await self._write(ops)
        except BaseException:
            self._unregister(topic)
            raise
        self._share_tail_budget()
        log.info("created topic %s (%d partitions, id %s)", name, partitions, topic.topic_id)
        return topic

    async def delete_topic(self, name: str) -> Topic:
        topic = self.topic(name)
        self._unregister(topic)
        for tablet in topic.partitions:
            tablet.release()
        ops = Ops()
        ops.delete(keys.topic_key(name))
        for kind in (keys.META, keys.LOG, keys.TIME_INDEX, keys.PRODUCER, keys.TXN_BLOB,
                     keys.SEGMENT, keys.FILE):
            ops.delete_range(*keys.topic_range(kind, topic.topic_id))
        if self._consumer_offsets is not None:
            self._consumer_offsets.drop_topic(name, ops)
        if self.important is not None:
            self.important.forget(name, [t.prefix for t in topic.partitions])
        await self._write(ops)
        await asyncio.get_running_loop().run_in_executor(
            self.store.readers, _remove_files, [t.files for t in topic.partitions])
        self._share_tail_budget()
        log.info("deleted topic %s", name)
        return topic

    def check_new_partitions(self, name: str, count: int) -> Topic:
        topic = self.topic(name)
        if count <= len(topic.partitions):
            raise InvalidPartitions(
                f"Topic currently has {len(topic.partitions)} partitions, which is higher than "
                f"or equal to the requested {count}."
            )
        if count > MAX_PARTITIONS:
            raise InvalidPartitions(f"Number of partitions must be at most {MAX_PARTITIONS}")
        return topic

    async def create_partitions(self, name: str, count: int) -> None:
        topic = self.check_new_partitions(name, count)
        before = len(topic.partitions)
        self._add_partitions(topic, count - before)
        ops = Ops()
        ops.put(keys.topic_key(name), topic.record())
        for tablet in topic.partitions[before:]:
            tablet.initial_ops(ops)
        await self._write(ops)
        self._share_tail_budget()

    async def set_topic_configs(self, name: str, configs: dict[str, str]) -> None:
        """Replace a topic's config overrides (checked again here)."""
        topic = self.topic(name)
        topic.configs = validate_all(configs)
        topic._settings = None
        ops = Ops()
        ops.put(keys.topic_key(name), topic.record())
        await self._write(ops)

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

    def is_important_consumer(self, group: str, topic: str | None) -> bool:
        """The topic (None: any topic) names the group in
        gateway.important.consumer.groups."""
        if topic is None:
            return any(group in self._tablet_settings(t).important_groups
                       for t in self.topics.values())
        found = self.topics.get(topic)
        return found is not None and group in self._tablet_settings(found).important_groups

    def tablets(self) -> list[PartitionTablet]:
        """Every partition of every topic."""
        return [t for topic in self.topics.values() for t in topic.partitions]

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
            return self.important.report(self.tablets())
        found = self.topics.get(topic)
        return [] if found is None else self.important.report(found.partitions)

    # ------------------------------------------------------- node records
    def node_records(self, kind: NodeRecordKind) -> NodeRecords:
        """The node's records of one kind: "acl" or "scram" (credentials)."""
        found = self._node_records.get(kind)
        if found is None:
            found = self._node_records[kind] = NodeRecords(self.store, NODE_RECORD_KINDS[kind],
                                                           self.writer)
        return found

    def transaction_storage(self) -> RocksTransactionStorage:
        """What the transaction coordinator may ask of this engine."""
        assert self.writer is not None, "engine not started"
        return RocksTransactionStorage(self.store, self.writer, self.consumer_offsets,
                                       self.partition, self.has_partition, self._tablet_of_ref)

    def _tablet_of_ref(self, prefix: bytes) -> PartitionTablet | None:
        """The partition a key prefix names, if its topic still exists."""
        topic_id, index = struct.unpack(">16si", prefix)
        topic = self.topics_by_id.get(UUID(bytes=topic_id))
        if topic is None or index >= len(topic.partitions):
            return None
        tablet: PartitionTablet = topic.partitions[index]
        return tablet

    # --------------------------------------------------------- internals
    def _write(self, ops: Ops) -> asyncio.Future[None]:
        assert self.writer is not None, "engine not started"
        return self.writer.submit(ops)

    def _register(self, topic: Topic) -> None:
        self.topics[topic.name] = topic
        self.topics_by_id[topic.topic_id] = topic
        self.topics_by_collision_key[collision_key(topic.name)] = topic

    def _share_tail_budget(self) -> None:
        """Split the node's tail budget evenly over every partition: many
        partitions get a short tail each, few get a long one."""
        tablets = [t for topic in self.topics.values() for t in topic.partitions]
        share = self.settings.tail_cache_bytes // max(len(tablets), 1)
        for tablet in tablets:
            tablet.set_tail_budget(share)

    def _unregister(self, topic: Topic) -> None:
        self.topics.pop(topic.name, None)
        self.topics_by_id.pop(topic.topic_id, None)
        if self.topics_by_collision_key.get(collision_key(topic.name)) is topic:
            del self.topics_by_collision_key[collision_key(topic.name)]

    def _add_partitions(self, topic: Topic, count: int) -> None:
        assert self.writer is not None, "engine not started"
        start = len(topic.partitions)
        for index in range(start, start + count):
            topic.partitions.append(
                PartitionTablet(
                    self.store,
                    self.writer,
                    self.validators,
                    topic.topic_id,
                    index,
                    functools.partial(self._tablet_settings, topic),
                    self.settings.tail_cache_bytes,
                    self.files_root,
                )
            )

    def _tablet_settings(self, topic: Topic) -> TabletSettings:
        if topic._settings is None:
            values = self.topic_configs(topic)
            # As in Kafka, retention deletes only where cleanup.policy has "delete".
            deletes = "delete" in [p.strip() for p in values["cleanup.policy"].split(",")]
            compaction = CompactionConfig.of(values)
            segment_ms = int(values["segment.ms"])
            if compaction is not None:  # Kafka's LogConfig.maxSegmentMs
                segment_ms = min(segment_ms, compaction.max_compaction_lag_ms)
            topic._settings = TabletSettings(
                max_message_bytes=int(values["max.message.bytes"]),
                log_append_time=values["message.timestamp.type"] == "LogAppendTime",
                timestamp_difference_max_ms=int(values["message.timestamp.difference.max.ms"]),
                retention_ms=int(values["retention.ms"]) if deletes else -1,
                retention_bytes=int(values["retention.bytes"]) if deletes else -1,
                max_producers=self.settings.max_producers_per_partition,
                topic=topic.name,
                segment_bytes=int(values["segment.bytes"]),
                segment_ms=segment_ms,
                deletes=deletes,
                compaction=compaction,
                txn_offset_lower_bound=values[TXN_PRODUCE_OFFSET] == TXN_OFFSET_LOWER_BOUND,
                important_groups=tuple(parse_list(values[IMPORTANT_GROUPS])),
                important_max_bytes=int(values[IMPORTANT_MAX_BYTES]),
            )
        return topic._settings


def _remove_files(partitions: list[PartitionFiles]) -> None:
    for files in partitions:
        files.remove_all()


__all__ = ["TOPIC_CONFIGS", "EngineSettings", "StorageEngine", "Topic", "check_topic_name"]
