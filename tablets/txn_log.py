"""A partition's transactions (``TransactionLog``, a collaborator the tablet
holds as ``tablet.transactions``; ``txn_storage`` calls it): the blobs of
open transactions' batches, the sink that names and counts them
(``BlobSink``, implemented by the coordinator's ``txn.pending``), and the
commit's part of the log (``stage_commit``).

A pending batch's bytes are in a segment file from the moment it was
produced; its ``B`` key says where (``log_entry.file_entry``, base offset 0).
A commit moves that small entry to the log (``L`` key, base offset set,
``SHIFTED``: the file's copy keeps base offset 0, the first 16 bytes are
patched on the way out) and deletes the ``B`` key, in the commit's one
write: no record byte is copied.

It reads and writes the tablet's state through ``TransactionalTablet``, the
narrow view it is constructed with.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from . import batch as batch_header
from . import keys, log_entry
from .in_memory_batches import InMemoryBatches
from .log_entry import LEADER_EPOCH
from .rocks_store import Ops
from .seam import PendingBlob

if TYPE_CHECKING:
    from collections.abc import Callable

    from .rocks_store import RocksStore
    from .segment_files import PartitionFiles
    from .segment_rules import Segments
    from .tablet_settings import TabletSettings


class TransactionalTablet(Protocol):
    """The tablet state a commit or an abort reads and writes."""

    settings: Callable[[], TabletSettings]
    store: RocksStore
    files: PartitionFiles
    pending: dict[bytes, bytes]  # pending blob key -> file entry
    prefix: bytes
    meta_key: bytes
    log_end_offset: int
    size_bytes: int
    segments: Segments[Ops]
    _tail: InMemoryBatches

    def meta(self) -> bytes: ...

    def _index_timestamp(self, offset: int, max_timestamp: int, ops: Ops) -> None: ...

    def _cache(self, offset: int, data: bytes) -> None: ...

    def _advance_high_watermark(self, offset: int) -> None: ...


class TransactionLog:
    def __init__(self, log: TransactionalTablet) -> None:
        self.log = log

    def abort_pending(self, instance: int, ops: Ops) -> None:
        """Drop the pending batches of transaction ``instance`` (aborted or
        expired): their keys go in ``ops``, their bytes are punched out of
        their files once it is durable."""
        log = self.log
        start, end = keys.blob_range(log.prefix, instance)
        ops.delete_range(start, end)
        doomed = [k for k in log.pending if start <= k < end]
        log.files.discard([log.pending.pop(key) for key in doomed], ops)

    def stage_commit(self, blobs: list[PendingBlob], marker: bytes,
                     ops: Ops) -> Callable[[], None]:
        """Add a committed transaction's part of this log to ``ops``: a
        reference to each of its blobs at the end of the log, then the COMMIT
        ``marker``. Returns what publishes them once ``ops`` is durable.

        Offsets are taken now, so the transaction's batches are consecutive.
        Their bytes join the in-memory tail when all were held in memory;
        otherwise the tail restarts after them (it must stay contiguous).
        """
        log = self.log
        offset = log.log_end_offset
        settings = log.settings()
        cached = all(blob.data is not None for blob in blobs)
        if not cached:
            log._tail = InMemoryBatches()
        for blob in blobs:
            entry = log.pending.pop(blob.key, None) or log.store.get(blob.key)
            if entry is None:
                raise log_entry.MissingBlob(f"pending blob {blob.key.hex()} is not stored")
            ops.put(keys.offset_key(keys.LOG, log.prefix, offset),
                    log_entry.rebase(entry, offset))
            ops.delete(blob.key)
            max_timestamp = batch_header.max_timestamp_of(blob.header)
            log._index_timestamp(offset, max_timestamp, ops)
            if cached:
                assert blob.data is not None  # every blob's (``cached``)
                log._cache(offset, log_entry.patch(blob.data, offset, LEADER_EPOCH))
            size = log_entry.size(blob.header)
            log.size_bytes += size
            log.segments.add(offset, size, max_timestamp, settings.segment_bytes,
                             settings.segment_ms, settings.compaction is not None, ops)
            offset += batch_header.record_count_of(blob.header)
        data = batch_header.stamp(memoryview(marker), batch_header.parse_batches(marker)[0],
                                  offset, LEADER_EPOCH)
        no, position = log.files.append(data, ops, settings.segment_bytes,
                                        settings.segment_ms,
                                        batch_header.max_timestamp_of(data))
        ops.put(keys.offset_key(keys.LOG, log.prefix, offset),
                log_entry.file_entry(data, offset, no, position, False))
        log._index_timestamp(offset, batch_header.max_timestamp_of(data), ops)
        log._cache(offset, data)
        log.size_bytes += len(data)
        log.segments.add(offset, len(data), batch_header.max_timestamp_of(data),
                         settings.segment_bytes, settings.segment_ms,
                         settings.compaction is not None, ops)
        offset += 1
        log.log_end_offset = offset
        ops.put(log.meta_key, log.meta())
        return lambda: log._advance_high_watermark(offset)
