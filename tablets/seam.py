"""The storage seam: everything the Kafka layer and the transaction coordinator
may ask of a storage engine, in Kafka's terms (as Tansu's ``Storage`` trait).

Three contracts, checked: statically by mypy (``tablets/seam_check.py`` returns
each RocksDB implementation as its Protocol; the callers are typed with the
Protocols), at run time by ``tests/test_seam.py``, and by the import rule of
``tests/test_layers.py`` (above the seam nothing imports the engine's internals):

``NodeStorage`` -- one node's storage, what the protocol layer calls:
  - topics: create (``check_new_topic`` first, Kafka's checks in Kafka's order),
    delete, list, find by name or id, configs (overrides; ``topic_configs`` the
    effective values), added partitions; ``partition``/``has_partition`` for one
    partition's log; ``cluster_id``;
  - retention (``enforce_retention``: retention.ms/bytes, idle producers), and
    forced compaction of one partition;
  - health and statistics for metrics: ``store_failure`` (a write failed: the
    node refuses writes until restarted, the health check answers 503),
    ``write_stats`` (the atomic writes: count, bytes, latency, group sizes),
    ``cleaner_stats``/``compaction_statuses`` (the log cleaner), ``producer_stats``
    and the important consumer groups' holds;
  - node records: small node-wide records of one kind (ACLs, SCRAM
    credentials), whole in memory, changed atomically (``node_records``);
  - consumer offsets: ``consumer_offsets`` (a ``ConsumerOffsetStore``);
  - the cluster: ``cluster()``, a ``ClusterView`` when several gateways share
    the store (who is live, who leads each partition, who coordinates each
    key), None when this node is alone and leads everything (RocksDB).

``PartitionLog`` -- one partition (Kafka's ``UnifiedLog``), what a handler calls:
  append one batch (idempotence and sequence checks included; acknowledged only
  once durable), read from an offset (Fetch; ``waiter`` is the long-poll),
  offsets (log start, high watermark, last stable offset, log end), list by
  time (ListOffsets), DeleteRecords, the producer state (DescribeProducers).

``TransactionStorage`` -- what the transaction coordinator calls: its own state
  (one record per transactional id, one per partition of an open transaction),
  counters (producer ids, transaction instances), pending data (a transaction's
  batches are staged as pending blobs, published by a commit as one atomic
  change with the markers and the offsets, dropped by an abort), and recovery
  (the pending blobs of a transaction that was open at a crash).

Rules of the seam, so another engine (not on this machine) can sit behind it:
  - whatever may do I/O is async (returns an awaitable); reads of in-memory
    state (offsets, names) are plain;
  - no RocksDB type, no key layout and no writer object crosses it: an atomic
    change is an ``AtomicChange`` the engine makes (``begin``), fills (the
    engine's methods) and writes (``commit``); blobs are named by opaque
    ``bytes`` references the engine hands out;
  - values crossing it are the types named here (and ``tablets.errors``,
    ``tablets.topic_config`` for config names, ``tablets.batch``/``control``
    for Kafka's record-batch format, engine-independent).

In Kafka's terms nothing here is replicated: one node, one copy, one leader
whose epoch never changes (``LEADER_EPOCH``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol
from uuid import UUID

from common.histogram import Histogram

from .log_entry import LEADER_EPOCH

# Changes per atomic write: how much the group commit gathers.
GROUP_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


@dataclass(slots=True)
class WriteStats:
    """The node's atomic writes, exported as metrics (and read by the benchmarks)."""

    writes: int = 0  # store writes (one per group)
    loop_writes: int = 0  # of those, written on the event loop (store.py)
    changes: int = 0  # atomic changes submitted
    fsyncs: int = 0
    bytes: int = 0
    write_seconds: float = 0.0
    write_latency: Histogram = field(default_factory=Histogram)  # seconds per write
    group_sizes: Histogram = field(default_factory=lambda: Histogram(GROUP_SIZE_BUCKETS))


@dataclass(frozen=True, slots=True)
class PartitionCompaction:
    """One compacted partition's compaction, for metrics."""

    topic: str
    partition: int
    status: CompactionStatus
    clean_offset: int  # up to where the log is compacted


# ------------------------------------------------------------------ values
@dataclass(slots=True)
class RunStats:
    keys: int = 0
    map_end: int = 0
    records_read: int = 0
    records_kept: int = 0
    bytes_read: int = 0  # by both passes
    bytes_cleaned: int = 0  # the log rewritten: from its start to where the map ended
    bytes_reclaimed: int = 0
    batches_rewritten: int = 0
    batches_dropped: int = 0
    blobs_deleted: int = 0


@dataclass(slots=True)
class CleanerStats:
    """Node-wide totals, exported as metrics."""

    runs: int = 0
    chunks: int = 0  # chunks swapped in
    bytes_read: int = 0
    bytes_reclaimed: int = 0
    failures: int = 0
    seconds: float = 0.0
    running: bool = False  # a run is under way now


@dataclass(slots=True)
class CompactionStatus:
    """One partition's compaction, for metrics."""

    runs: int = 0
    bytes_reclaimed: int = 0
    cleanable_bytes: int = 0  # as of the last check
    dirty_ratio: float = 0.0  # likewise
    dirty_since_ms: int = -1  # first batch timestamp of the oldest uncompacted segment
    failure: str | None = None  # why the last run failed: the partition is skipped


class OpenFile(Protocol):
    """An open file of the engine's (a segment file): only its descriptor is used."""

    def fileno(self) -> int: ...


@dataclass(frozen=True, slots=True)
class FileRegion:
    """Bytes of the log lying in a file the engine owns, handed out without reading them.

    The contract, for engines that keep record bytes in files:
    - the bytes a region names never change: an engine deletes or replaces a
      file (retention, compaction) but never writes over bytes it handed out;
    - the region holds its ``file`` object, which keeps the descriptor open
      (and a deleted file's bytes readable) for as long as the region lives,
      so a reader may send it after the engine moved on.
    The protocol layer sends a region with ``os.sendfile`` on plaintext
    listeners and through ``read()`` otherwise.
    """

    file: OpenFile
    offset: int
    length: int

    def __len__(self) -> int:
        return self.length

    def read(self) -> bytes:
        data = os.pread(self.file.fileno(), self.length, self.offset)
        if len(data) != self.length:
            raise OSError(f"short read of a file region: {len(data)} of {self.length} bytes")
        return data


@dataclass(slots=True)
class ReadResult:
    # Record batches in order: bytes, or regions of the engine's files (a
    # batch whose header is patched on the way out is its first bytes, then
    # a region of the rest).
    batches: list[bytes | FileRegion]
    high_watermark: int
    log_start_offset: int

    @property
    def nbytes(self) -> int:
        return sum(len(b) for b in self.batches)


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int
    log_append_time: int  # -1 unless the topic uses LogAppendTime
    log_start_offset: int


@dataclass(frozen=True, slots=True)
class PendingBlob:
    """A transactional batch stored outside the log until its transaction commits."""

    key: bytes
    header: bytes  # its 61-byte header, as produced
    data: bytes | None  # the batch itself, while held in memory


class BlobSink(Protocol):
    """An open transaction, receiving one partition's transactional batches.

    ``append`` announces each batch it accepts with ``expect`` (which raises
    if the transaction takes no more batches) and settles it exactly once,
    with ``settled``, after its blob is registered (``added``) or it failed:
    the transaction's commit waits for what it expects. ``next_key`` raises
    if the transaction ended in between; nothing of the batch is then stored.
    """

    def expect(self) -> None: ...

    def admit(self, nbytes: int) -> None:
        """Raise a TabletError to refuse a batch (nothing of it is stored)."""

    def next_key(self, partition_prefix: bytes) -> bytes: ...

    def pending_records(self, partition_prefix: bytes) -> int:
        """Records of the transaction's batches already added to this partition."""
        ...

    def added(self, key: bytes, batch: bytes) -> None: ...

    def settled(self) -> None: ...


# ---------------------------------------------------------------- consumer offsets
TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class OffsetCommit:
    """What a client asks to commit for one partition."""

    offset: int
    leader_epoch: int = -1
    metadata: str = ""


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp: int  # ms since the epoch
    version: int
    # The transactional id whose transaction committed it ("" for OffsetCommit):
    # the offset-range check lets a transaction re-commit its own offset.
    committer: str = ""
    # Who committed it, as the caller names it (the gateway: the group member
    # and its generation, of a plain commit or of a transaction's member-fenced
    # TxnOffsetCommit); "" when unknown.
    # The embedded engine keeps it in memory only: a restart forgets it, which
    # makes the conflict checks stricter, never looser (PostgreSQL stores it,
    # for the gateways that read the row).
    member: str = ""


@dataclass(frozen=True, slots=True)
class ImportantGroup:
    """One important group on one partition, as metrics and the console show it."""

    topic: str
    partition: int
    group: str
    committed: int | None  # its committed offset; None: never committed here
    released: bool  # its offsets were deleted: it holds nothing
    lag: int  # records from its committed offset (or the log start) to the high watermark
    held_bytes: int
    held_age_ms: int
    passed: int  # retention passes that went past it (the ceiling)
    records_passed: int  # records retention deleted before it committed them


class AtomicChange:
    """An opaque atomic change: made by ``TransactionStorage.begin``, filled by
    the engine's methods, written whole by ``commit``. Only the engine that
    made it reads what it holds."""

    __slots__ = ()


class ProducerState(Protocol):
    """One idempotent producer of a partition (DescribeProducers)."""

    @property
    def epoch(self) -> int: ...
    @property
    def last_seq(self) -> int: ...
    @property
    def last_timestamp(self) -> int: ...


class ProducerStates(Protocol):
    def items(self) -> Sequence[tuple[int, ProducerState]]: ...


class PartitionLog(Protocol):
    """One partition's log (Kafka's UnifiedLog on a single replica)."""

    @property
    def topic_id(self) -> UUID: ...
    @property
    def partition(self) -> int: ...
    @property
    def name(self) -> str: ...  # topic-partition, for messages
    @property
    def deleted(self) -> bool: ...  # its topic was deleted: every call refuses
    @property
    def log_start_offset(self) -> int: ...
    @property
    def log_end_offset(self) -> int: ...
    @property
    def high_watermark(self) -> int: ...
    @property
    def last_stable_offset(self) -> int: ...
    @property
    def size_bytes(self) -> int: ...
    @property
    def producers(self) -> ProducerStates: ...

    def append(self, records: bytes | memoryview, now_ms: int,
               sink: BlobSink | None = None) -> Awaitable[AppendResult]:
        """Append one record batch (v2), checked; resolves once durable. With
        ``sink``, a transactional batch is staged as a pending blob instead."""
        ...

    async def read(self, offset: int, max_bytes: int, min_one: bool = True) -> ReadResult:
        """Whole batches from the one holding ``offset``; as bytes, or as
        ``FileRegion``s of the engine's files (a batch whose first bytes are
        patched on the way out: those bytes, then a region of the rest)."""
        ...

    def waiter(self) -> asyncio.Future[None]:
        """Resolves at the next append or truncation (Fetch's long-poll)."""
        ...

    def forget_waiter(self, future: asyncio.Future[None]) -> None: ...
    def wake_waiters(self) -> None: ...

    async def offset_for_timestamp(self, target: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first batch at or after ``target``."""
        ...

    async def max_timestamp(self) -> tuple[int, int] | None: ...

    async def delete_records(self, before: int) -> int:
        """DeleteRecords: the new log start offset."""
        ...


class TopicView(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def topic_id(self) -> UUID: ...
    @property
    def configs(self) -> dict[str, str]: ...  # overrides only
    @property
    def partitions(self) -> Sequence[PartitionLog]: ...


class NodeRecordStore(Protocol):
    """Records of one kind (ACLs, SCRAM credentials): name -> opaque value."""

    @property
    def records(self) -> Mapping[bytes, bytes]: ...
    def get(self, name: bytes) -> bytes | None: ...

    async def change(self, puts: dict[bytes, bytes], deletes: Iterable[bytes] = ()) -> None:
        """Write ``puts`` and delete ``deletes`` atomically."""
        ...

    def change_now(self, puts: dict[bytes, bytes], deletes: Iterable[bytes] = ()) -> None:
        """The same, synchronously: only opened offline (``open_node_records``)."""
        ...


class OfflineNodeRecordStore(NodeRecordStore, Protocol):
    """The records of one kind of a stopped gateway's data directory (the
    security CLI): ``tablets.open_node_records``."""

    def close(self) -> None: ...


class ConsumerOffsetStore(Protocol):
    """Committed consumer offsets (Kafka's __consumer_offsets)."""

    is_important: Callable[[str, str | None], bool]

    def groups(self) -> list[str]: ...
    def has_offsets(self, group: str) -> bool: ...
    def committed(self, group: str, topic: str, partition: int) -> CommittedOffset | None: ...
    def group_offsets(self, group: str) -> dict[TopicPartition, CommittedOffset]: ...
    def latest(self, group: str, topic: str, partition: int) -> CommittedOffset | None: ...
    @property
    def last_version(self) -> int: ...
    def version(self, group: str, topic: str, partition: int) -> int: ...

    async def commit(
        self, group: str, commits: Mapping[TopicPartition, OffsetCommit], now_ms: int,
        member: str = "",
    ) -> None:
        """Commit offsets (OffsetCommit); visible and acknowledged once durable."""
        ...

    async def delete(self, group: str, partitions: Iterable[TopicPartition] | None = None,
                     release: bool = True) -> int:
        """Delete some (None: all) offsets of a group; returns how many."""
        ...

    def publish(self, group: str, staged: Mapping[TopicPartition, CommittedOffset]) -> None: ...

    # A group's generation. An engine shared by several gateways persists it,
    # so that it never goes back when the group's coordinator moves
    # (``persists_generations``): ``generation`` is the stored one (read at
    # start-up and when the coordinator gains the group's slot), and
    # ``next_generation`` stores a new one, above ``after`` and the stored one,
    # before JoinGroup answers with it. The embedded engine keeps none: 0, and
    # ``after + 1`` without a write (the generation restarts with the process).
    @property
    def persists_generations(self) -> bool: ...
    def generation(self, group: str) -> int: ...
    async def next_generation(self, group: str, after: int) -> int: ...


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


@dataclass(frozen=True, slots=True)
class RecoveredBlob:
    """A pending blob found at start-up (its transaction was open at a crash)."""

    ref: bytes  # opaque: the engine's name for it
    ordinal: int  # its place among the transaction's blobs
    header: bytes  # the batch's 61-byte header
    nbytes: int  # the whole batch


class ChangeWriter(Protocol):
    """Makes and writes atomic changes (the coordinator's parts write with it;
    a test may stand in for it to hold writes)."""

    def begin(self) -> AtomicChange: ...
    def commit(self, change: AtomicChange) -> asyncio.Future[None]:
        """Write the change atomically; resolves once durable, in submission order."""
        ...


class TransactionStorage(ChangeWriter, Protocol):
    """What the transaction coordinator (txn/) may ask of the engine.

    A partition's ``log_ref`` is an opaque id of one incarnation of it (a topic
    deleted and created again under the same name gets another); a pending
    blob's ``ref`` is the engine's opaque name for it, made by ``pending_ref``.
    """

    @property
    def consumer_offsets(self) -> ConsumerOffsetStore: ...

    def partition(self, name: str, index: int) -> PartitionLog: ...
    def has_partition(self, name: str, index: int) -> bool: ...

    # the coordinator's own state
    def counter(self, name: str) -> int | None:
        """A persisted counter (producer ids, transaction instances); None if unset."""
        ...

    def set_counter(self, change: AtomicChange, name: str, value: int) -> None: ...
    def txn_states(self) -> Iterable[tuple[str, bytes]]:
        """(transactional id, its state) of every id (start-up)."""
        ...

    def put_txn_state(self, change: AtomicChange, transactional_id: str,
                      value: bytes) -> None: ...
    def delete_txn_state(self, change: AtomicChange, transactional_id: str) -> None: ...
    def txn_partitions(self, transactional_id: str,
                       instance: int) -> Iterable[tuple[TopicPartition, UUID]]:
        """The partitions (and topic ids) persisted for an open transaction."""
        ...

    def put_txn_partition(self, change: AtomicChange, transactional_id: str, instance: int,
                          tp: TopicPartition, topic_id: UUID) -> None: ...
    def delete_txn_partition(self, change: AtomicChange, transactional_id: str,
                             instance: int, tp: TopicPartition, topic_id: UUID) -> None: ...

    # pending data: stage, publish, abort, recover
    def log_ref(self, log: PartitionLog) -> bytes: ...
    def pending_ref(self, log_ref: bytes, instance: int, ordinal: int) -> bytes: ...
    def pending_log_ref(self, ref: bytes) -> bytes:
        """The ``log_ref`` of the partition a pending blob belongs to."""
        ...

    def stage_commit(self, change: AtomicChange, log: PartitionLog,
                     blobs: list[PendingBlob], marker: bytes) -> Callable[[], None]:
        """Add to ``change`` the publication of ``blobs`` at the end of ``log``,
        then the COMMIT ``marker``, without copying their bytes; the result
        makes them visible (high watermark) once ``change`` is durable."""
        ...

    def stage_offsets(self, change: AtomicChange, group: str,
                      commits: Mapping[TopicPartition, OffsetCommit], now_ms: int,
                      committer: str, members: Mapping[TopicPartition, str] | None,
                      ) -> dict[TopicPartition, CommittedOffset]:
        """Add a transaction's offset commit to ``change``; publish the result
        (``ConsumerOffsetStore.publish``) once it is durable."""
        ...

    def abort_pending(self, change: AtomicChange, log_ref: bytes, instance: int) -> None:
        """Add the deletion of every pending blob of ``instance`` on a partition."""
        ...

    def recover_pending(self, log_ref: bytes, instance: int) -> list[RecoveredBlob]:
        """The pending blobs of ``instance`` on a partition, in order (start-up)."""
        ...


NodeRecordKind = str  # "acl" or "scram"

__all__ = [
    "GROUP_SIZE_BUCKETS",
    "LEADER_EPOCH",
    "AppendResult",
    "AtomicChange",
    "BlobSink",
    "BrokerAddress",
    "ChangeWriter",
    "CleanerStats",
    "ClusterView",
    "CommittedOffset",
    "CompactionStatus",
    "ConsumerOffsetStore",
    "ImportantGroup",
    "NodeRecordKind",
    "NodeRecordStore",
    "NodeStorage",
    "OfflineNodeRecordStore",
    "OffsetCommit",
    "PartitionCompaction",
    "PartitionLog",
    "PendingBlob",
    "ProducerState",
    "ProducerStates",
    "ReadResult",
    "RecoveredBlob",
    "RunStats",
    "TopicPartition",
    "TopicView",
    "TransactionStorage",
    "WriteStats",
]
