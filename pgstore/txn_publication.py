"""The pieces of ``pgstore.txn_storage`` that are not the storage itself: what
it needs of a partition log (``TxnPartition``, the Protocol the engine's log
implements), its errors, the change that carries failure hooks, the opaque
references and a commit's plan for one partition."""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from tablets import batch as batch_header
from tablets.errors import CommitRefused, StorageError
from tablets.seam import AtomicChange, PendingBlob

from .writer import PgChange

LOG_REF = struct.Struct(">q")
PENDING_REF = struct.Struct(">qqi")  # log id, instance, ordinal


class TxnPartition(Protocol):
    """What ``PgTransactionStorage`` needs of one partition's log.

    ``reserve`` and ``published`` are called on the event loop; a change
    carrying a reservation goes through the same ``PgWriter`` as the log's
    own appends, so they land in the order offsets were taken.
    """

    @property
    def log_id(self) -> int: ...

    @property
    def leader_epoch(self) -> int:
        """The epoch this gateway writes the partition at: a commit or a
        pending batch lands only while the partition row still holds it."""
        ...

    @property
    def batch_epoch(self) -> int:
        """The partition leader epoch stamped on the batches stored (what
        Metadata, Fetch and OffsetForLeaderEpoch answer for the partition)."""
        ...

    @property
    def publish_epoch(self) -> int | None:
        """The epoch the partition row must hold for a commit to publish into
        it: ``leader_epoch`` while this gateway leads the partition; None
        when another gateway does (the commit then takes its offsets from the
        row, under its lock, and the leader learns of them from the notice)."""
        ...

    def reserve(self, count: int) -> int | None:
        """Take ``count`` offsets at the log end for a commit's publication
        (as an append takes its own), returning the first; None when this
        gateway does not lead the partition, or its log end is in doubt: the
        database then assigns them from the partition row, under its lock."""
        ...

    def published(self, base: int, end: int, nbytes: int, max_timestamp: int) -> None:
        """The offsets [base, end), ``nbytes`` of batches stamped up to
        ``max_timestamp``, are durable: the log end and high watermark move
        to ``end`` (waiting long-polls wake)."""
        ...

    def in_doubt(self) -> None:
        """A change carrying offsets reserved here failed or its outcome is
        unknown: reread the partition row before the next append."""
        ...


class PublicationFenced(StorageError):
    """A partition of the commit is no longer at the publisher's leader epoch
    (or its log end moved under it): nothing of the change was written."""


class MissingPending(StorageError):
    """A commit names pending batches that are not stored (aborted meanwhile):
    nothing of the change was written."""


class OffsetsMoved(CommitRefused):
    """A transaction's offsets: a row is not at the version this gateway holds
    (another gateway committed it): nothing of the change was written."""


class PgTxnChange(PgChange):
    """A ``PgChange`` that also carries what to undo in memory if it fails."""

    __slots__ = ("_failed",)

    def __init__(self) -> None:
        super().__init__()
        self._failed: list[Callable[[], None]] = []

    def on_failure(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` if the change fails (refused, lost, in doubt)."""
        self._failed.append(callback)


def as_txn_change(change: AtomicChange) -> PgTxnChange:
    assert isinstance(change, PgTxnChange), f"not a change of PgTransactionStorage: {change!r}"
    return change


def log_ref_of(log_id: int) -> bytes:
    return LOG_REF.pack(log_id)


def log_id_of(log_ref: bytes) -> int:
    value: int = LOG_REF.unpack(log_ref[:LOG_REF.size])[0]
    return value


def parse_pending_ref(ref: bytes) -> tuple[int, int, int]:
    """(log id, instance, ordinal) of a pending reference."""
    log_id, instance, ordinal = PENDING_REF.unpack(ref)
    return int(log_id), int(instance), int(ordinal)


def pending_bytes(batch: bytes | memoryview, batch_epoch: int) -> bytes:
    """A transactional batch as its pending row stores it: one batch, stamped
    with base offset 0 and the log's batch epoch (the commit gives it its
    offsets)."""
    view = memoryview(batch)
    parsed = batch_header.parse_batches(view, verify_crc=False)
    if len(parsed) != 1:
        raise ValueError(f"one batch per pending blob, not {len(parsed)}")
    return batch_header.stamp(view, parsed[0], 0, batch_epoch)


def batch_size(header: bytes) -> int:
    """The whole batch's size, from its header's length field."""
    length: int = struct.unpack_from(">i", header, 8)[0]
    return length + 12


@dataclass(frozen=True, slots=True)
class Publication:
    """One partition's part of a commit, as staged."""

    instance: int  # the transaction's (0: no blobs)
    ordinals: list[int]
    deltas: list[int]
    last_deltas: list[int]
    max_timestamps: list[int]
    running: list[int]
    count: int  # offsets taken, the marker's included
    nbytes: int  # bytes added to the partition, the marker's included


def plan_publication(log_id: int, blobs: list[PendingBlob]) -> Publication:
    ordinals: list[int] = []
    deltas: list[int] = []
    last_deltas: list[int] = []
    max_timestamps: list[int] = []
    running: list[int] = []
    delta = nbytes = 0
    top = -1
    instances = set()
    for blob in blobs:
        blob_log, instance, ordinal = parse_pending_ref(blob.key)
        if blob_log != log_id:
            raise ValueError(f"pending blob {blob.key.hex()} is not of log {log_id}")
        instances.add(instance)
        records = batch_header.record_count_of(blob.header)
        max_ts = batch_header.max_timestamp_of(blob.header)
        top = max(top, max_ts)
        ordinals.append(ordinal)
        deltas.append(delta)
        last_deltas.append(batch_header.last_offset_of(blob.header)
                           - batch_header.base_offset_of(blob.header))
        max_timestamps.append(max_ts)
        running.append(top)
        nbytes += batch_size(blob.header)
        delta += records
    if len(instances) > 1:
        raise ValueError(f"pending blobs of several transactions in one commit: {instances}")
    return Publication(instances.pop() if instances else 0, ordinals, deltas, last_deltas,
                       max_timestamps, running, delta + 1, nbytes)
