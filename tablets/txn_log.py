"""A partition's transactions (a part of ``PartitionTablet``): the blobs
of open transactions' batches, the sink that names and counts them
(``BlobSink``, implemented by the coordinator's ``txn.pending``), and the
commit's part of the log (``stage_commit``).

A pending batch's bytes are in a segment file from the moment it was
produced; its ``B`` key says where (``log_entry.file_entry``, base offset 0).
A commit moves that small entry to the log (``L`` key, base offset set,
``SHIFTED``: the file's copy keeps base offset 0, the first 16 bytes are
patched on the way out) and deletes the ``B`` key, in the commit's one
write: no record byte is copied.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import batch as batch_header
from . import keys, log_entry
from .in_memory_batches import InMemoryBatches
from .log_entry import LEADER_EPOCH
from .seam import PendingBlob
from .store import Ops

if TYPE_CHECKING:
    from collections.abc import Callable

    from .segment_files import PartitionFiles
    from .segments import Segments
    from .store import RocksStore
    from .tablet_settings import TabletSettings


class TransactionLog:
    if TYPE_CHECKING:
        settings: Callable[[], TabletSettings]
        store: RocksStore
        files: PartitionFiles
        pending: dict[bytes, bytes]
        prefix: bytes
        meta_key: bytes
        log_end_offset: int
        size_bytes: int
        segments: Segments
        _tail: InMemoryBatches

        def _meta(self) -> bytes: ...

        def _index_timestamp(self, offset: int, max_timestamp: int, ops: Ops) -> None: ...

        def _cache(self, offset: int, data: bytes) -> None: ...

        def _advance_high_watermark(self, offset: int) -> None: ...

    def abort_pending(self, instance: int, ops: Ops) -> None:
        """Drop the pending batches of transaction ``instance`` (aborted or
        expired): their keys go in ``ops``, their bytes are punched out of
        their files once it is durable."""
        start, end = keys.blob_range(self.prefix, instance)
        ops.delete_range(start, end)
        doomed = [k for k in self.pending if start <= k < end]
        self.files.discard([self.pending.pop(key) for key in doomed], ops)

    def stage_commit(self, blobs: list[PendingBlob], marker: bytes,
                     ops: Ops) -> Callable[[], None]:
        """Add a committed transaction's part of this log to ``ops``: a
        reference to each of its blobs at the end of the log, then the COMMIT
        ``marker``. Returns what publishes them once ``ops`` is durable.

        Offsets are taken now, so the transaction's batches are consecutive.
        Their bytes join the in-memory tail when all were held in memory;
        otherwise the tail restarts after them (it must stay contiguous).
        """
        offset = self.log_end_offset
        settings = self.settings()
        cached = all(blob.data is not None for blob in blobs)
        if not cached:
            self._tail = InMemoryBatches()
        for blob in blobs:
            entry = self.pending.pop(blob.key, None) or self.store.get(blob.key)
            if entry is None:
                raise log_entry.MissingBlob(f"pending blob {blob.key.hex()} is not stored")
            ops.put(keys.offset_key(keys.LOG, self.prefix, offset),
                    log_entry.rebase(entry, offset))
            ops.delete(blob.key)
            max_timestamp = batch_header.max_timestamp_of(blob.header)
            self._index_timestamp(offset, max_timestamp, ops)
            if cached:
                assert blob.data is not None  # every blob's (``cached``)
                self._cache(offset, log_entry.patch(blob.data, offset, LEADER_EPOCH))
            size = log_entry.size(blob.header)
            self.size_bytes += size
            self.segments.add(offset, size, max_timestamp, settings.segment_bytes,
                              settings.segment_ms, settings.compaction is not None, ops)
            offset += batch_header.record_count_of(blob.header)
        data = batch_header.stamp(memoryview(marker), batch_header.parse_batches(marker)[0],
                                  offset, LEADER_EPOCH)
        no, position = self.files.append(data, ops, settings.segment_bytes,
                                         settings.segment_ms,
                                         batch_header.max_timestamp_of(data))
        ops.put(keys.offset_key(keys.LOG, self.prefix, offset),
                log_entry.file_entry(data, offset, no, position, False))
        self._index_timestamp(offset, batch_header.max_timestamp_of(data), ops)
        self._cache(offset, data)
        self.size_bytes += len(data)
        self.segments.add(offset, len(data), batch_header.max_timestamp_of(data),
                          settings.segment_bytes, settings.segment_ms,
                          settings.compaction is not None, ops)
        offset += 1
        self.log_end_offset = offset
        ops.put(self.meta_key, self._meta())
        return lambda: self._advance_high_watermark(offset)
