"""The RocksDB engine implements the seam: checked structurally by mypy (strict
on ``tablets``, tests/run_all.sh), and at run time by ``tests/test_seam.py``.

Each function returns an implementation as the Protocol it must satisfy, so a
method missing, or with another signature, fails the type check here rather
than in a handler."""

from __future__ import annotations

from .consumer_offsets import ConsumerOffsets
from .engine import StorageEngine
from .node_records import NodeRecords, OfflineNodeRecords
from .seam import (
    ChangeWriter,
    ConsumerOffsetStore,
    NodeRecordStore,
    NodeStorage,
    OfflineNodeRecordStore,
    PartitionLog,
    TopicView,
    TransactionStorage,
)
from .tablet import PartitionTablet
from .topic_catalog import Topic
from .txn_storage import RocksTransactionStorage


def node(engine: StorageEngine) -> NodeStorage:
    return engine


def partition_log(tablet: PartitionTablet) -> PartitionLog:
    return tablet


def topic(found: Topic) -> TopicView:
    return found


def transaction_storage(storage: RocksTransactionStorage) -> TransactionStorage:
    return storage


def change_writer(storage: RocksTransactionStorage) -> ChangeWriter:
    return storage


def consumer_offsets(offsets: ConsumerOffsets) -> ConsumerOffsetStore:
    return offsets


def node_records(records: NodeRecords) -> NodeRecordStore:
    return records


def offline_node_records(records: OfflineNodeRecords) -> OfflineNodeRecordStore:
    return records
