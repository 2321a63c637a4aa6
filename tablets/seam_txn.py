"""The storage seam (``tablets.seam``), transactions' storage: what the
transaction coordinator (``txn/``) calls.

``TransactionStorage`` -- its own state (one record per transactional id, one
  per partition of an open transaction), counters (producer ids, transaction
  instances), pending data (a transaction's batches are staged as pending
  blobs -- ``PendingBlob`` -- published by a commit as one atomic change with
  the markers and the offsets, dropped by an abort), and recovery (the
  pending blobs of a transaction that was open at a crash: ``RecoveredBlob``).

``ChangeWriter`` -- makes and writes the ``AtomicChange``s all of that is
  staged into: opaque, made by the engine (``begin``), filled by its methods,
  written whole (``commit``). No key layout and no writer object crosses
  the seam.

Callers import them from ``tablets.seam``, the seam's one public entry.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol
from uuid import UUID

from .seam_log import PartitionLog
from .seam_offsets import CommittedOffset, ConsumerOffsetStore, OffsetCommit, TopicPartition


class AtomicChange:
    """An opaque atomic change: made by ``TransactionStorage.begin``, filled by
    the engine's methods, written whole by ``commit``. Only the engine that
    made it reads what it holds."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class PendingBlob:
    """A transactional batch stored outside the log until its transaction commits."""

    key: bytes
    header: bytes  # its 61-byte header, as produced
    data: bytes | None  # the batch itself, while held in memory


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
