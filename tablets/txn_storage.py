"""The transaction coordinator's side of the seam, on RocksDB
(``seam.TransactionStorage``).

What txn/ means, in this engine's key layout (``keys``): a transactional id's
state is one ``TXN_STATE`` key, each partition of its open transaction one
``TXN_PARTITION`` key (transactional id, instance, topic id, partition ->
topic name); counters are ``COUNTER`` keys holding a big-endian 64-bit value;
a pending batch is a ``TXN_BLOB`` key (partition prefix, instance, ordinal)
holding where its bytes lie in the partition's segment files, so a
partition's log reference is its key prefix and a pending reference is the
blob's key; an abort deletes the keys and punches the bytes out. Every
change is one ``Ops`` submitted to the node's single writer (group commit),
so a commit -- log entries, markers, offsets, the coordinator's state -- is
one atomic RocksDB write.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable, Iterator, Mapping
from uuid import UUID

from . import keys, log_entry
from .batch import HEADER_SIZE
from .consumer_offsets import ConsumerOffsets
from .rocks_store import Ops, RocksStore
from .seam import (
    AtomicChange,
    CommittedOffset,
    OffsetCommit,
    PartitionLog,
    PendingBlob,
    RecoveredBlob,
    TopicPartition,
)
from .store import GroupCommitWriter
from .tablet import PartitionTablet

_COUNTER = struct.Struct(">q")


def _ops(change: AtomicChange) -> Ops:
    assert isinstance(change, Ops), f"not a change of this engine: {change!r}"
    return change


def _tablet(log: PartitionLog) -> PartitionTablet:
    assert isinstance(log, PartitionTablet), f"not a partition of this engine: {log!r}"
    return log


def partition_entry(transactional_id: str, instance: int, tp: TopicPartition,
                    topic_id: UUID) -> tuple[bytes, bytes]:
    """(key, value) persisting one partition of an open transaction."""
    return (keys.txn_partition_key(transactional_id, instance, topic_id, tp[1]),
            tp[0].encode())


def partitions_range(transactional_id: str, instance: int) -> tuple[bytes, bytes]:
    """[start, end) of every ``partition_entry`` key of one transaction."""
    start = keys.txn_partitions_prefix(transactional_id, instance)
    return start, start + b"\xff" * 21  # above any topic id (16) + partition (4)


def decode_partition_entry(key: bytes, value: bytes) -> tuple[TopicPartition, UUID]:
    topic_id, partition = keys.parse_txn_partition_key(key)
    return (bytes(value).decode(), partition), topic_id


class RocksTransactionStorage:
    """The node's store and writer, as the transaction coordinator sees them."""

    def __init__(self, store: RocksStore, writer: GroupCommitWriter,
                 offsets: ConsumerOffsets, partition: Callable[[str, int], PartitionTablet],
                 has_partition: Callable[[str, int], bool],
                 tablet_of_ref: Callable[[bytes], PartitionTablet | None]) -> None:
        self._store = store
        self._writer = writer
        self._offsets = offsets
        self._partition = partition
        self._has_partition = has_partition
        self._tablet_of_ref = tablet_of_ref

    @property
    def consumer_offsets(self) -> ConsumerOffsets:
        return self._offsets

    def partition(self, name: str, index: int) -> PartitionTablet:
        return self._partition(name, index)

    def has_partition(self, name: str, index: int) -> bool:
        return self._has_partition(name, index)

    # ---------------------------------------------------- atomic changes
    def begin(self) -> AtomicChange:
        return Ops()

    def commit(self, change: AtomicChange) -> asyncio.Future[None]:
        return self._writer.submit(_ops(change))

    # ------------------------------------------------ the coordinator's state
    def counter(self, name: str) -> int | None:
        raw = self._store.get(keys.COUNTER + name.encode())
        return None if raw is None else int(_COUNTER.unpack(raw)[0])

    def set_counter(self, change: AtomicChange, name: str, value: int) -> None:
        _ops(change).put(keys.COUNTER + name.encode(), _COUNTER.pack(value))

    def txn_states(self) -> Iterator[tuple[str, bytes]]:
        start = keys.TXN_STATE
        for key, value in self._store.scan(start, start + b"\xff"):
            yield key[len(start):].decode(), value

    def put_txn_state(self, change: AtomicChange, transactional_id: str, value: bytes) -> None:
        _ops(change).put(keys.txn_state_key(transactional_id), value)

    def delete_txn_state(self, change: AtomicChange, transactional_id: str) -> None:
        _ops(change).delete(keys.txn_state_key(transactional_id))

    def txn_partitions(self, transactional_id: str,
                       instance: int) -> Iterator[tuple[TopicPartition, UUID]]:
        for key, value in self._store.scan(*partitions_range(transactional_id, instance)):
            yield decode_partition_entry(key, value)

    def put_txn_partition(self, change: AtomicChange, transactional_id: str, instance: int,
                          tp: TopicPartition, topic_id: UUID) -> None:
        _ops(change).put(*partition_entry(transactional_id, instance, tp, topic_id))

    def delete_txn_partition(self, change: AtomicChange, transactional_id: str, instance: int,
                             tp: TopicPartition, topic_id: UUID) -> None:
        _ops(change).delete(keys.txn_partition_key(transactional_id, instance, topic_id, tp[1]))

    # ------------------------------------------------------- pending data
    def log_ref(self, log: PartitionLog) -> bytes:
        return _tablet(log).prefix

    def pending_ref(self, log_ref: bytes, instance: int, ordinal: int) -> bytes:
        return keys.blob_key(log_ref, instance, ordinal)

    def pending_log_ref(self, ref: bytes) -> bytes:
        return keys.blob_partition(ref)

    def stage_commit(self, change: AtomicChange, log: PartitionLog,
                     blobs: list[PendingBlob], marker: bytes) -> Callable[[], None]:
        return _tablet(log).transactions.stage_commit(blobs, marker, _ops(change))

    def stage_offsets(self, change: AtomicChange, group: str,
                      commits: Mapping[TopicPartition, OffsetCommit], now_ms: int,
                      committer: str, members: Mapping[TopicPartition, str] | None,
                      ) -> dict[TopicPartition, CommittedOffset]:
        return self._offsets.stage(group, commits, now_ms, _ops(change), committer, members)

    def abort_pending(self, change: AtomicChange, log_ref: bytes, instance: int) -> None:
        tablet = self._tablet_of_ref(log_ref)
        if tablet is None:  # its topic was deleted, with its keys and files
            _ops(change).delete_range(*keys.blob_range(log_ref, instance))
        else:
            tablet.transactions.abort_pending(instance, _ops(change))

    def recover_pending(self, log_ref: bytes, instance: int) -> list[RecoveredBlob]:
        return [RecoveredBlob(key, keys.blob_ordinal(key), bytes(value[:HEADER_SIZE]),
                              log_entry.size(value))
                for key, value in self._store.scan(*keys.blob_range(log_ref, instance))]
