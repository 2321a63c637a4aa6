"""The topics of the PostgreSQL store (``PgTopicCatalog``, held by
``PgNodeStorage``): the seam's ``TopicView``s and their partitions' logs, by
name, by id and by Kafka's collision key.

Kafka's checks of a new topic run here, in the controller's order (name,
existence, collision, configs, partition count, replication factor), before
anything is written (a compacted topic is compacted by ``pgstore.cleaner``). Each
change is one ``PgChange`` through the node's writer: a topic's row with its
partitions' rows; a deletion (one cascading delete: partitions, batches and
their bytes, producers); new partitions; config overrides.

At start-up (``load``), a gateway alone (no cluster) claims every
partition: one statement bumps every partition's leader epoch, so a gateway
started later on the same database fences this one's writes
(``PgAppends``), and the logs are built from the rows as claimed. In a
cluster (``claim=False``) nothing is claimed: every log starts closed
(``fenced``) and ``pgstore.cluster`` opens those the gateway comes to lead;
each topic change then also notifies the other gateways (``notify``), which
reread the catalog (``refresh``).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol
from uuid import UUID

import asyncpg

from common.clock import now_ms
from tablets.errors import (
    InvalidPartitions,
    StorageError,
    TopicAlreadyExists,
    UnknownPartition,
    UnknownTopic,
)
from tablets.producer_rules import ProducerEntry
from tablets.tablet_settings import TabletSettings
from tablets.tail_budget import TailBudget
from tablets.topic_config import effective, validate_all
from tablets.topic_names import MAX_PARTITIONS, check_new_topic, collision_key

from .log_sql import LogRow
from .log_state import LogContext
from .partition_log import PgPartitionLog
from .producer_rows import PgProducerRows
from .topic_settings import topic_settings

if TYPE_CHECKING:
    from tablets.seam import TopicView

    from .migrate import Connection
    from .writer import PgChange

log = logging.getLogger(__name__)

# A partition this node created or claimed: its epoch starts here (0: never led).
FIRST_EPOCH = 1


class CatalogSettings(Protocol):
    @property
    def tail_cache_bytes(self) -> int: ...
    @property
    def topic_defaults(self) -> dict[str, str]: ...
    @property
    def max_producers_per_partition(self) -> int: ...


class TopicOffsets(Protocol):
    """The committed offsets a deleted topic's deletion drops (same change)."""

    def drop_topic(self, topic: str, change: PgChange) -> None: ...


@dataclass(slots=True, eq=False)
class PgTopic:
    name: str
    topic_id: UUID
    configs: dict[str, str]  # overrides only
    partitions: list[PgPartitionLog] = field(default_factory=list)
    settings: TabletSettings | None = None  # derived from the configs, cached
    # Bumped by every config change made here: a catalog reread that began
    # before one must not put back what it read (``refresh``).
    configs_changed: int = 0


class PgTopicCatalog:
    def __init__(self, context: LogContext, settings: CatalogSettings,
                 offsets: Callable[[], TopicOffsets | None] = lambda: None) -> None:
        self.context = context
        self._offsets = offsets  # a deleted topic's committed offsets go with it
        self.settings = settings
        self.topics: dict[str, PgTopic] = {}
        self.by_id: dict[UUID, PgTopic] = {}
        self.by_collision_key: dict[str, PgTopic] = {}
        self.tail_budget = TailBudget(settings.tail_cache_bytes, self.logs)
        # In a cluster: logs start closed, and each change tells the others.
        self.claims = True
        self.notify: Callable[[PgChange, str], None] | None = None
        # In a cluster: the leaders of ``count`` new partitions, written with
        # their rows (pgstore.cluster: PgCluster.place_new); None: no leader.
        self.place: Callable[[int], Awaitable[list[int] | None]] | None = None
        self._creating: set[str] = set()  # registered, not yet committed
        self._deleting: set[UUID] = set()  # unregistered, not yet committed
        s = context.sql.schema
        self._sql_topic = (f"INSERT INTO {s}.topics (topic_id, name, configs, created_ms) "
                           "VALUES ($1, $2, $3::jsonb, $4)")
        self._sql_partitions = f"""
            INSERT INTO {s}.partitions (topic_id, partition, leader_epoch, leader_node)
            SELECT $1, g, {FIRST_EPOCH}, ($4::integer[])[g - $2 + 1]
              FROM generate_series($2::int, $3::int) g
         RETURNING log_id, partition, leader_epoch"""
        self._sql_delete = f"DELETE FROM {s}.topics WHERE topic_id = $1"
        self._sql_configs = f"UPDATE {s}.topics SET configs = $2::jsonb WHERE topic_id = $1"

    # ------------------------------------------------------------ start-up
    async def load(self, conn: Connection, claim: bool = True) -> None:
        """Build the logs; with ``claim``, claim every partition first (its
        leader epoch bumped), else every log starts closed."""
        s = self.context.sql.schema
        self.claims = claim
        async with conn.transaction():
            if claim:
                await conn.execute(f"UPDATE {s}.partitions SET leader_epoch = leader_epoch + 1")
            topics = await conn.fetch(f"SELECT topic_id, name, configs FROM {s}.topics")
            rows = await conn.fetch(f"""
                SELECT p.log_id, p.topic_id, p.partition, p.leader_epoch, p.log_start_offset,
                       p.log_end_offset, p.size_bytes,
                       (SELECT running_max_timestamp FROM {s}.batches b
                         WHERE b.log_id = p.log_id ORDER BY base_offset DESC LIMIT 1) AS running,
                       (SELECT avg(size) FROM (SELECT size FROM {s}.batches b
                         WHERE b.log_id = p.log_id ORDER BY base_offset DESC LIMIT 64) r) AS mean
                  FROM {s}.partitions p ORDER BY p.topic_id, p.partition""")
            producers: dict[int, list[tuple[int, ProducerEntry]]] = defaultdict(list)
            for row in await conn.fetch(
                    f"SELECT log_id, producer_id, epoch, last_timestamp, recent "
                    f"FROM {s}.producers"):
                producers[int(row["log_id"])].append((int(row["producer_id"]), (
                    ProducerEntry.from_columns(int(row["epoch"]), int(row["last_timestamp"]),
                                               bytes(row["recent"])))))
        by_topic: dict[UUID, list[Any]] = defaultdict(list)
        for row in rows:
            by_topic[row["topic_id"]].append(row)
        for record in topics:
            topic = PgTopic(record["name"], record["topic_id"], json.loads(record["configs"]))
            for row in by_topic.get(topic.topic_id, []):
                loaded = LogRow(int(row["log_id"]), int(row["leader_epoch"]),
                                int(row["log_start_offset"]), int(row["log_end_offset"]),
                                int(row["size_bytes"]),
                                -1 if row["running"] is None else int(row["running"]),
                                0.0 if row["mean"] is None else float(row["mean"]))
                topic.partitions.append(self._log(topic, int(row["partition"]), loaded,
                                                  producers.get(loaded.log_id, [])))
            self._register(topic)
        self.tail_budget.reshare()

    async def refresh(self, conn: Connection) -> None:
        """Catch up with topic changes other gateways made: topics made (their
        logs closed), deleted (released), new partitions, changed configs."""
        s = self.context.sql.schema
        # A config change made here while the reread runs may have committed
        # after its snapshot: the topic keeps it (its own notice rereads again).
        changed_before = {t.topic_id: t.configs_changed for t in self.topics.values()}
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            topics = await conn.fetch(f"SELECT topic_id, name, configs FROM {s}.topics")
            rows = await conn.fetch(f"SELECT log_id, topic_id, partition, leader_epoch "
                                    f"FROM {s}.partitions ORDER BY topic_id, partition")
        by_topic: dict[UUID, list[Any]] = defaultdict(list)
        for row in rows:
            by_topic[row["topic_id"]].append(row)
        present = {record["topic_id"] for record in topics}
        for topic in list(self.topics.values()):
            if topic.topic_id not in present and topic.name not in self._creating:
                self._unregister(topic)
                for partition in topic.partitions:
                    partition.release()
                log.info("topic %s was deleted by another gateway", topic.name)
        for record in topics:
            if record["topic_id"] in self._deleting:
                continue
            known_topic = self.by_id.get(record["topic_id"])
            if known_topic is None:
                if record["name"] in self._creating or record["name"] in self.topics:
                    continue  # a create of this name is in flight here
                known_topic = PgTopic(record["name"], record["topic_id"],
                                      json.loads(record["configs"]))
                self._register(known_topic)
                log.info("topic %s was made by another gateway", known_topic.name)
            topic = known_topic
            configs = json.loads(record["configs"])
            if configs != topic.configs and (
                    changed_before.get(topic.topic_id) == topic.configs_changed):
                topic.configs, topic.settings = configs, None
            known = len(topic.partitions)
            self._add_logs(topic, [r for r in by_topic.get(topic.topic_id, [])
                                   if int(r["partition"]) >= known])

    # ------------------------------------------------------------- lookups
    def list_topics(self) -> list[PgTopic]:
        return sorted(self.topics.values(), key=lambda t: t.name)

    def topic(self, name: str) -> PgTopic:
        topic = self.topics.get(name)
        if topic is None:
            raise UnknownTopic(f"topic {name!r} does not exist")
        return topic

    def partition(self, name: str, index: int) -> PgPartitionLog:
        topic = self.topic(name)
        if not 0 <= index < len(topic.partitions):
            raise UnknownPartition(f"partition {name}-{index} does not exist")
        return topic.partitions[index]

    def logs(self) -> list[PgPartitionLog]:
        return [p for topic in self.topics.values() for p in topic.partitions]

    def topic_configs(self, topic: TopicView) -> dict[str, str]:
        return effective(topic.configs, self.settings.topic_defaults)

    def settings_of(self, topic: PgTopic) -> TabletSettings:
        if topic.settings is None:
            topic.settings = topic_settings(
                topic.name, self.topic_configs(topic), self.settings.max_producers_per_partition)
        return topic.settings

    def is_important_consumer(self, group: str, topic: str | None) -> bool:
        """The topic (None: any topic) names the group in
        gateway.important.consumer.groups."""
        if topic is None:
            return any(group in self.settings_of(t).important_groups
                       for t in self.topics.values())
        found = self.topics.get(topic)
        return found is not None and group in self.settings_of(found).important_groups

    # ------------------------------------------------ creating and deleting
    def check_new_topic(self, name: str, partitions: int, replication_factor: int,
                        configs: dict[str, str | None]) -> dict[str, str]:
        """Kafka's checks of a new topic, in its controller's order; the config
        overrides as stored."""
        found = self.by_collision_key.get
        return check_new_topic(
            name, partitions, replication_factor, configs, exists=self.topics.__contains__,
            colliding=lambda key: None if (other := found(key)) is None else other.name)

    async def create_topic(self, name: str, partitions: int,
                           configs: dict[str, str]) -> PgTopic:
        stored = self.check_new_topic(name, partitions, 1, dict(configs))
        topic = PgTopic(name, uuid.uuid4(), stored)
        self._register(topic)  # before the write lands, so a concurrent create sees it
        self._creating.add(name)
        rows: list[Any] = []
        try:
            leaders = await self._leaders(partitions)
            change = self.context.writer.begin()
            change.execute(self._sql_topic, topic.topic_id, name, json.dumps(stored), now_ms())
            change.fetch(self._sql_partitions, topic.topic_id, 0, partitions - 1, leaders,
                         into=lambda found: rows.__setitem__(slice(None), found))
            self._announce(change, name)
            await self.context.writer.commit(change)
        except StorageError as exc:
            self._unregister(topic)
            if isinstance(exc.__cause__, asyncpg.UniqueViolationError):
                # Another gateway made it first (this one has not read its
                # notice yet): Kafka's answer, and the caller catches up.
                raise TopicAlreadyExists(f"Topic '{name}' already exists.") from exc
            raise
        except BaseException:
            self._unregister(topic)
            raise
        finally:
            self._creating.discard(name)
        self._add_logs(topic, rows)
        log.info("created topic %s (%d partitions, id %s)", name, partitions, topic.topic_id)
        return topic

    async def delete_topic(self, name: str) -> PgTopic:
        topic = self.topic(name)
        self._unregister(topic)
        for partition in topic.partitions:
            partition.release()
        change = self.context.writer.begin()
        change.execute(self._sql_delete, topic.topic_id)  # cascades to every row of it
        offsets = self._offsets()
        if offsets is not None:
            offsets.drop_topic(name, change)
        self._announce(change, name)
        self._deleting.add(topic.topic_id)
        try:
            await self.context.writer.commit(change)
        finally:
            self._deleting.discard(topic.topic_id)
        self.tail_budget.reshare()
        log.info("deleted topic %s", name)
        return topic

    def check_new_partitions(self, name: str, count: int) -> PgTopic:
        topic = self.topic(name)
        if count <= len(topic.partitions):
            raise InvalidPartitions(
                f"Topic currently has {len(topic.partitions)} partitions, which is higher than "
                f"or equal to the requested {count}.")
        if count > MAX_PARTITIONS:
            raise InvalidPartitions(f"Number of partitions must be at most {MAX_PARTITIONS}")
        return topic

    async def create_partitions(self, name: str, count: int) -> None:
        topic = self.check_new_partitions(name, count)
        leaders = await self._leaders(count - len(topic.partitions))
        change = self.context.writer.begin()
        rows: list[Any] = []
        change.fetch(self._sql_partitions, topic.topic_id, len(topic.partitions), count - 1,
                     leaders, into=lambda found: rows.__setitem__(slice(None), found))
        self._announce(change, name)
        await self.context.writer.commit(change)
        self._add_logs(topic, rows)

    async def set_topic_configs(self, name: str, configs: dict[str, str]) -> None:
        """Replace a topic's config overrides (checked again here)."""
        topic = self.topic(name)
        stored = validate_all(configs)
        change = self.context.writer.begin()
        change.execute(self._sql_configs, topic.topic_id, json.dumps(stored))
        self._announce(change, name)
        await self.context.writer.commit(change)
        topic.configs = stored
        topic.settings = None
        topic.configs_changed += 1

    # ------------------------------------------------------------ internals
    async def _leaders(self, count: int) -> list[int] | None:
        return None if self.place is None else await self.place(count)

    def _announce(self, change: PgChange, name: str) -> None:
        if self.notify is not None:
            self.notify(change, name)

    def _log(self, topic: PgTopic, index: int, row: LogRow,
             producers: list[tuple[int, ProducerEntry]]) -> PgPartitionLog:
        def settings() -> TabletSettings:
            return self.settings_of(topic)

        sql = self.context.sql
        partition = PgPartitionLog(self.context, topic.topic_id, index, topic.name, row,
                                   settings, PgProducerRows(sql, row.log_id, producers),
                                   self.tail_budget)
        partition.fenced = not self.claims  # in a cluster: opened once led (pgstore.cluster)
        return partition

    def _add_logs(self, topic: PgTopic, rows: list[Any]) -> None:
        for row in sorted(rows, key=lambda r: int(r["partition"])):
            index = int(row["partition"])
            if index < len(topic.partitions):
                continue  # already known (a reread raced with this gateway's own change)
            assert index == len(topic.partitions), "partitions are numbered in order"
            topic.partitions.append(self._log(
                topic, index, LogRow(int(row["log_id"]), int(row["leader_epoch"]), 0, 0, 0, -1),
                []))
        self.tail_budget.reshare()

    def _register(self, topic: PgTopic) -> None:
        self.topics[topic.name] = topic
        self.by_id[topic.topic_id] = topic
        self.by_collision_key[collision_key(topic.name)] = topic

    def _unregister(self, topic: PgTopic) -> None:
        self.topics.pop(topic.name, None)
        self.by_id.pop(topic.topic_id, None)
        if self.by_collision_key.get(collision_key(topic.name)) is topic:
            del self.by_collision_key[collision_key(topic.name)]
