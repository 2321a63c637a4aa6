"""The storage seam: everything the Kafka layer and the transaction coordinator
may ask of a storage engine, in Kafka's terms (as Tansu's ``Storage`` trait).

This module is the seam's one public entry: every caller, in ``tablets/``
and above it, imports the seam's names from here. They are declared by
concern in five modules, which nothing else imports:

- ``tablets/seam_node.py`` -- ``NodeStorage``, one node's storage, what the
  protocol layer calls (topics, retention and compaction, health and
  statistics, the other parts below), and ``ClusterView`` when several
  gateways share the store;
- ``tablets/seam_log.py`` -- ``PartitionLog``, one partition (Kafka's
  ``UnifiedLog``), what a handler calls, and ``TopicView``;
- ``tablets/seam_txn.py`` -- ``TransactionStorage``, what the transaction
  coordinator calls: its own state, counters, pending data (staged,
  published by a commit as one atomic change, dropped by an abort) and
  recovery;
- ``tablets/seam_offsets.py`` -- ``ConsumerOffsetStore`` (committed consumer
  offsets) and ``NodeRecordStore`` (ACLs, SCRAM credentials);
- ``tablets/seam_stats.py`` -- the health and statistics values for metrics.

Three contracts, checked: statically by mypy (``tablets/seam_check.py`` returns
each RocksDB implementation as its Protocol; the callers are typed with the
Protocols), at run time by ``tests/test_seam.py``, and by the import rule of
``tests/test_layers.py`` (above the seam nothing imports the engine's internals,
nor the seam's parts but through this module).

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

from .log_entry import LEADER_EPOCH
from .seam_log import (
    AppendResult,
    BlobSink,
    FileRegion,
    OpenFile,
    PartitionLog,
    ProducerState,
    ProducerStates,
    ReadResult,
    TopicView,
)
from .seam_node import BrokerAddress, ClusterNode, ClusterView, NodeStorage
from .seam_offsets import (
    CommittedOffset,
    ConsumerOffsetStore,
    NodeRecordKind,
    NodeRecordStore,
    OfflineNodeRecordStore,
    OffsetCommit,
    TopicPartition,
)
from .seam_stats import (
    GROUP_SIZE_BUCKETS,
    CleanerStats,
    CompactionStatus,
    ImportantGroup,
    PartitionCompaction,
    RunStats,
    WriteStats,
)
from .seam_txn import AtomicChange, ChangeWriter, PendingBlob, RecoveredBlob, TransactionStorage

__all__ = [
    "GROUP_SIZE_BUCKETS",
    "LEADER_EPOCH",
    "AppendResult",
    "AtomicChange",
    "BlobSink",
    "BrokerAddress",
    "ChangeWriter",
    "CleanerStats",
    "ClusterNode",
    "ClusterView",
    "CommittedOffset",
    "CompactionStatus",
    "ConsumerOffsetStore",
    "FileRegion",
    "ImportantGroup",
    "NodeRecordKind",
    "NodeRecordStore",
    "NodeStorage",
    "OfflineNodeRecordStore",
    "OffsetCommit",
    "OpenFile",
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
