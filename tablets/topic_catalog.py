"""The topic catalog (``TopicCatalog``, a collaborator the engine holds as
``engine.catalog``): the node's topics and their partition tablets, by name,
by id and by Kafka's collision key. It owns the topic records in the store
(loading them at start-up, writing them on create, delete, new partitions and
config changes), Kafka's checks of a new topic or new partitions (name rules,
collisions, counts), the ``TabletSettings`` each topic's configs give its
tablets, and the node's tail budget (``tail_budget``: shared over the partitions
that are read).

It reads the engine's state through ``CatalogOwner``, the narrow view it is
constructed with; the engine keeps the seam's ``NodeStorage`` methods,
delegating here.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import struct
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol
from uuid import UUID

from . import keys
from .compaction_config import CompactionConfig
from .config_parsing import parse_list
from .errors import (
    InvalidPartitions,
    UnknownPartition,
    UnknownTopic,
)
from .rocks_store import Ops
from .tablet import PartitionTablet
from .tablet_settings import TabletSettings
from .tail_budget import TailBudget
from .topic_config import (
    IMPORTANT_GROUPS,
    IMPORTANT_MAX_BYTES,
    TXN_OFFSET_LOWER_BOUND,
    TXN_PRODUCE_OFFSET,
    effective,
    validate_all,
)
from .topic_names import MAX_PARTITIONS, check_new_topic, collision_key

if TYPE_CHECKING:
    from concurrent.futures import Executor

    from .consumer_offsets import ConsumerOffsets
    from .important import ImportantConsumers
    from .rocks_store import RocksStore
    from .seam import TopicView
    from .segment_files import PartitionFiles
    from .store import GroupCommitWriter

log = logging.getLogger(__name__)

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


class CatalogSettings(Protocol):
    """The engine settings the catalog reads."""

    @property
    def tail_cache_bytes(self) -> int: ...
    @property
    def topic_defaults(self) -> dict[str, str]: ...
    @property
    def max_producers_per_partition(self) -> int: ...


class CatalogOwner(Protocol):
    """The engine state the catalog reads: the store and its writer (set once
    started), what a new tablet is built with, and what a deleted topic's
    committed offsets and important groups are dropped from."""

    @property
    def settings(self) -> CatalogSettings: ...
    @property
    def store(self) -> RocksStore: ...
    @property
    def writer(self) -> GroupCommitWriter | None: ...
    @property
    def validators(self) -> Executor: ...
    @property
    def files_root(self) -> str: ...
    @property
    def _consumer_offsets(self) -> ConsumerOffsets | None: ...
    @property
    def important(self) -> ImportantConsumers | None: ...


class TopicCatalog:
    def __init__(self, owner: CatalogOwner) -> None:
        self.owner = owner
        self.topics: dict[str, Topic] = {}
        self.topics_by_id: dict[UUID, Topic] = {}
        self.topics_by_collision_key: dict[str, Topic] = {}
        self.tail_budget = TailBudget(owner.settings.tail_cache_bytes, self.tablets)

    def load(self, migrate: bool) -> None:
        """Every topic and its tablets, from the store (at start-up)."""
        for key, value in self.owner.store.scan(keys.TOPIC, keys.TOPIC + b"\xff"):
            name = key[1:].decode()
            record = json.loads(value)
            topic = Topic(name, UUID(record["id"]), record["configs"])
            self._add_partitions(topic, record["partitions"])
            for tablet in topic.partitions:
                tablet.load(migrate)
            self._register(topic)
        self.tail_budget.reshare()

    # ----------------------------------------------------------- lookups
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

    def tablets(self) -> list[PartitionTablet]:
        """Every partition of every topic."""
        return [t for topic in self.topics.values() for t in topic.partitions]

    def tablet_of_ref(self, prefix: bytes) -> PartitionTablet | None:
        """The partition a key prefix names, if its topic still exists."""
        topic_id, index = struct.unpack(">16si", prefix)
        topic = self.topics_by_id.get(UUID(bytes=topic_id))
        if topic is None or index >= len(topic.partitions):
            return None
        tablet: PartitionTablet = topic.partitions[index]
        return tablet

    # ----------------------------------------------------------- configs
    def topic_configs(self, topic: TopicView) -> dict[str, str]:
        """Every config of a topic with its effective value."""
        return effective(topic.configs, self.owner.settings.topic_defaults)

    def is_important_consumer(self, group: str, topic: str | None) -> bool:
        """The topic (None: any topic) names the group in
        gateway.important.consumer.groups."""
        if topic is None:
            return any(group in self._tablet_settings(t).important_groups
                       for t in self.topics.values())
        found = self.topics.get(topic)
        return found is not None and group in self._tablet_settings(found).important_groups

    async def set_topic_configs(self, name: str, configs: dict[str, str]) -> None:
        """Replace a topic's config overrides (checked again here)."""
        topic = self.topic(name)
        topic.configs = validate_all(configs)
        topic._settings = None
        ops = Ops()
        ops.put(keys.topic_key(name), topic.record())
        await self._write(ops)

    # ------------------------------------------- creating and deleting
    def check_new_topic(
        self, name: str, partitions: int, replication_factor: int,
        configs: dict[str, str | None],
    ) -> dict[str, str]:
        """Every check of a new topic, in the order Kafka's controller makes
        them (``topic_names.check_new_topic``); the config overrides as stored."""
        found = self.topics_by_collision_key.get
        return check_new_topic(
            name, partitions, replication_factor, configs, exists=self.topics.__contains__,
            colliding=lambda key: None if (other := found(key)) is None else other.name)

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
        self.tail_budget.reshare()
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
        offsets = self.owner._consumer_offsets
        if offsets is not None:
            offsets.drop_topic(name, ops)
        important = self.owner.important
        if important is not None:
            important.forget_topic(name, [t.prefix for t in topic.partitions])
        await self._write(ops)
        await asyncio.get_running_loop().run_in_executor(
            self.owner.store.readers, _remove_files, [t.files for t in topic.partitions])
        self.tail_budget.reshare()
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
        self.tail_budget.reshare()

    # --------------------------------------------------------- internals
    def _write(self, ops: Ops) -> asyncio.Future[None]:
        writer = self.owner.writer
        assert writer is not None, "engine not started"
        return writer.submit(ops)

    def _register(self, topic: Topic) -> None:
        self.topics[topic.name] = topic
        self.topics_by_id[topic.topic_id] = topic
        self.topics_by_collision_key[collision_key(topic.name)] = topic

    def _unregister(self, topic: Topic) -> None:
        self.topics.pop(topic.name, None)
        self.topics_by_id.pop(topic.topic_id, None)
        if self.topics_by_collision_key.get(collision_key(topic.name)) is topic:
            del self.topics_by_collision_key[collision_key(topic.name)]

    def _add_partitions(self, topic: Topic, count: int) -> None:
        owner = self.owner
        assert owner.writer is not None, "engine not started"
        start = len(topic.partitions)
        for index in range(start, start + count):
            topic.partitions.append(
                PartitionTablet(
                    owner.store,
                    owner.writer,
                    owner.validators,
                    topic.topic_id,
                    index,
                    functools.partial(self._tablet_settings, topic),
                    self.tail_budget,
                    owner.files_root,
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
                max_producers=self.owner.settings.max_producers_per_partition,
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
