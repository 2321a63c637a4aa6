"""The PostgreSQL engine implements the seam: checked structurally by mypy
(strict on ``pgstore``), as ``tablets/seam_check.py`` checks the RocksDB
engine. Each function returns an implementation as the Protocol it must
satisfy, so a method missing, or with another signature, fails the type
check here rather than in a handler."""

from __future__ import annotations

from tablets.seam import ChangeWriter, NodeStorage, PartitionLog, TopicView, TransactionStorage

from .node import PgNodeStorage
from .partition_log import PgPartitionLog
from .topics import PgTopic
from .txn_publication import TxnPartition
from .txn_storage import PgTransactionStorage


def node(storage: PgNodeStorage) -> NodeStorage:
    return storage


def partition_log(log: PgPartitionLog) -> PartitionLog:
    return log


def topic(found: PgTopic) -> TopicView:
    return found


def transaction_storage(storage: PgTransactionStorage) -> TransactionStorage:
    return storage


def change_writer(storage: PgTransactionStorage) -> ChangeWriter:
    return storage


def txn_partition(log: PgPartitionLog) -> TxnPartition:
    return log
