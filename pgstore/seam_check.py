"""The PostgreSQL engine implements the seam: checked structurally by mypy
(strict on ``pgstore``), as ``tablets/seam_check.py`` does for the RocksDB
engine, and at run time by the pgstore tests.

Each function returns an implementation as the Protocol it must satisfy, so a
method missing, or with another signature, fails the type check here rather
than in a handler."""

from __future__ import annotations

from tablets.seam import (
    ConsumerOffsetStore,
    NodeRecordStore,
    OfflineNodeRecordStore,
    TransactionStorage,
)

from .consumer_offsets import PgConsumerOffsets
from .node_records import OfflinePgNodeRecords, PgNodeRecords
from .txn_storage import PgTransactionStorage


def consumer_offsets(offsets: PgConsumerOffsets) -> ConsumerOffsetStore:
    return offsets


def node_records(records: PgNodeRecords) -> NodeRecordStore:
    return records


def offline_node_records(records: OfflinePgNodeRecords) -> OfflineNodeRecordStore:
    return records


def transaction_storage(storage: PgTransactionStorage) -> TransactionStorage:
    return storage
