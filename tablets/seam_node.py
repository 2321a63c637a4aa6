"""The storage seam (``tablets.seam``), its node-level surface: what the
protocol layer calls on one node's storage, and the cluster it may be part of.

``NodeStorage`` -- one node's storage:
  - topics: create (``check_new_topic`` first, Kafka's checks in Kafka's order),
    delete, list, find by name or id, configs (overrides; ``topic_configs`` the
    effective values), added partitions; ``partition``/``has_partition`` for one
    partition's log; ``cluster_id``;
  - retention (``enforce_retention``: retention.ms/bytes, idle producers), and
    forced compaction of one partition;
  - health and statistics for metrics (``tablets.seam_stats``):
    ``store_failure`` (a write failed: the node refuses writes until
    restarted, the health check answers 503), ``write_stats``,
    ``cleaner_stats``/``compaction_statuses``, ``producer_stats`` and the
    important consumer groups' holds;
  - node records (``node_records``) and consumer offsets
    (``consumer_offsets``), ``tablets.seam_offsets``;
  - the transaction coordinator's side (``transaction_storage``,
    ``tablets.seam_txn``);
  - the cluster: ``cluster()``, a ``ClusterView`` when several gateways share
    the store (who is live, who leads each partition, who coordinates each
    key), None when this node is alone and leads everything (RocksDB).

Callers import them from ``tablets.seam``, the seam's one public entry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol
from uuid import UUID

from .seam_log import PartitionLog, TopicView
from .seam_offsets import ConsumerOffsetStore, NodeRecordKind, NodeRecordStore
from .seam_stats import (
    CleanerStats,
    ImportantGroup,
    PartitionCompaction,
    RunStats,
    WriteStats,
)
from .seam_txn import TransactionStorage


class NodeStorage(Protocol):
    """One node's storage, as the protocol layer sees it."""

    @property
    def cluster_id(self) -> str: ...
    @property
    def consumer_offsets(self) -> ConsumerOffsetStore: ...

    # topics
    def list_topics(self) -> Sequence[TopicView]:
        """Every topic, sorted by name."""
        ...
    def find_topic(self, name: str) -> TopicView | None: ...
    def topic_by_id(self, topic_id: UUID) -> TopicView | None: ...
    def topic(self, name: str) -> TopicView: ...  # UnknownTopic if absent
    def partition(self, name: str, index: int) -> PartitionLog: ...
    def has_partition(self, name: str, index: int) -> bool: ...
    def topic_configs(self, topic: TopicView) -> dict[str, str]: ...
    def check_new_topic(self, name: str, partitions: int, replication_factor: int,
                        configs: dict[str, str | None]) -> dict[str, str]: ...
    async def create_topic(self, name: str, partitions: int,
                           configs: dict[str, str]) -> TopicView: ...
    async def delete_topic(self, name: str) -> TopicView: ...
    def check_new_partitions(self, name: str, count: int) -> TopicView: ...
    async def create_partitions(self, name: str, count: int) -> None: ...
    async def set_topic_configs(self, name: str, configs: dict[str, str]) -> None: ...

    # retention and compaction
    async def enforce_retention(self) -> None: ...
    async def compact(self, name: str, index: int) -> RunStats | None: ...

    # health and statistics
    def store_failure(self) -> BaseException | None: ...
    def write_stats(self) -> WriteStats: ...
    def cleaner_stats(self) -> CleanerStats: ...
    def compaction_statuses(self, now_ms: int) -> list[PartitionCompaction]: ...
    def producer_stats(self) -> tuple[int, int]: ...
    def important_groups(self, topic: str | None = None) -> list[ImportantGroup]: ...

    # node records (ACLs, SCRAM credentials)
    def node_records(self, kind: NodeRecordKind) -> NodeRecordStore: ...

    # the transaction coordinator's side
    def transaction_storage(self) -> TransactionStorage: ...

    # the cluster (None: this node alone leads every partition and coordinates every key)
    def cluster(self) -> ClusterView | None: ...


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    """A live gateway as Metadata and FindCoordinator name it."""

    node_id: int
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class ClusterNode:
    """A live gateway with its lease and its share, for the console and
    /metrics (docs/cluster.md)."""

    address: BrokerAddress
    lease_expires_at: float  # seconds since the Unix epoch, by the store's clock
    partitions_led: int
    coordinator_slots_led: int


class ClusterView(Protocol):
    """Several gateways over one store: the view as this gateway last read it.
    Answers are hints for routing; every write is fenced by the store itself."""

    def nodes(self, listener: str) -> Sequence[ClusterNode]:
        """The live gateways as ``brokers`` lists them, with their leases and
        how many partitions and coordinator slots each leads."""
        ...

    def brokers(self, listener: str) -> Sequence[BrokerAddress]:
        """The live gateways, by node id, at their advertised address for the
        listener of that name (else their first listener)."""
        ...

    def partition_leader(self, topic: str, index: int) -> int | None:
        """The node leading the partition (None: no live leader right now)."""
        ...

    def leader_epoch(self, topic: str, index: int) -> int:
        """The partition's leader epoch as this gateway knows it (its own when
        it leads the partition; -1: no leader known)."""
        ...

    def leads(self, topic: str, index: int) -> bool:
        """This gateway leads the partition and has opened its log."""
        ...

    def coordinator(self, key: str) -> int | None:
        """The node coordinating a group or transactional id (None: none now)."""
        ...

    def coordinates(self, key: str) -> bool:
        """This gateway coordinates the key and has loaded its state."""
        ...

    def watch_coordination(self, lost: Callable[[Callable[[str], bool]], None],
                           gained: Callable[[Callable[[str], bool]], None] | None = None,
                           ) -> None:
        """Call ``lost(was_here)`` whenever this gateway stops coordinating some
        keys (``was_here(key)``: the key was among them), before it may gain
        them again, so that state kept in memory for them is dropped; and
        ``gained(is_new)`` when it gains some, once the engine has read their
        state again and before ``coordinates`` says yes for them."""
        ...

    async def reload_coordinated(self, keep: Callable[[str], bool]) -> None:
        """Read the state of the coordinated keys ``keep`` selects from the
        store again (a write for them failed with its outcome unknown); the
        caller then takes it as ``gained`` would. Raises what the store
        raises while it cannot be read."""
        ...

    async def catch_up_topics(self) -> None:
        """Reread the topic catalog now: topics and configs another gateway
        changed a moment ago (its notice may not have been acted on yet)."""
        ...
