"""Appending to a partition's log (``Appends``, a collaborator the tablet
holds as ``tablet.appends``; the tablet's ``append`` is its ``append``, bound
once): a produced record set checked, given offsets, stored and acknowledged.

Offsets are taken on the event loop, in the order ``append`` was called, so
concurrent produce requests are ordered by arrival. A batch's records are
checked once (``validate``): on the event loop when that is cheap, otherwise
on a worker thread (the tablet's ``validators``); an append waiting for its
check holds back the appends after it (``_Checking``), so offsets and
sequences still follow arrival order.

A batch is stored as the bytes the producer sent, with its offset, leader
epoch and (when Kafka would rewrite it) max timestamp patched, appended once
to the partition's segment files; RocksDB holds where it lies
(``log_entry.file_entry``), with the time index, the virtual segments and
the meta record, in one write. Writes complete in submission order; once in
the WAL the append resolves and the high watermark moves (``log_reads``).
Idempotent producers' sequences are checked by ``producer_rules`` and kept
(``producers``) in the same write as the batches they describe; a retry of a
stored batch is answered with the original and stores nothing.

Transactional batches do not enter the log when produced: they go to the
segment files too, indexed as pending blobs of their transaction (a
``BlobSink`` names the keys); a commit (``txn_log``) later moves them into
the log.

It reads and writes the tablet's state through ``AppendingTablet``, the
narrow view it is constructed with. What never changes after construction
(the writer, the files, the segments, the producers, the reads' methods) is
bound once here, so the per-batch path looks up no more attributes than it
did inside the tablet.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from . import batch as batch_header
from . import keys, log_entry, validate
from .errors import (
    BatchRefused,
    StorageError,
    TabletError,
    UnknownPartition,
    UnsupportedRecordKind,
)
from .log_entry import LEADER_EPOCH
from .producer_rules import REFUSED, CachedBatch, next_seq
from .rocks_store import Ops
from .seam import AppendResult, BlobSink

if TYPE_CHECKING:
    from collections.abc import Callable
    from concurrent.futures import Executor

    from .log_reads import LogReads
    from .producer_rules import ProducerStates
    from .segment_files import PartitionFiles
    from .segment_rules import Segments
    from .store import GroupCommitWriter
    from .tablet_settings import TabletSettings


class AppendingTablet(Protocol):
    """The tablet state an append reads and writes."""

    writer: GroupCommitWriter
    validators: Executor  # read per use: tests hold its checks (testkit.txn)
    settings: Callable[[], TabletSettings]
    partition: int
    prefix: bytes
    meta_key: bytes
    files: PartitionFiles
    pending: dict[bytes, bytes]  # pending blob key -> file entry
    log_start_offset: int
    log_end_offset: int
    size_bytes: int
    deleted: bool
    producers: ProducerStates[Ops]
    segments: Segments[Ops]
    reads: LogReads

    @property
    def name(self) -> str: ...

    def meta(self) -> bytes: ...


@dataclass(slots=True)
class _Checking:
    """An append waiting for its records to be checked, or for those before it."""

    checked: asyncio.Future[int]  # the batch's max timestamp, once checked
    appended: asyncio.Future[AppendResult]
    view: memoryview
    header: batch_header.BatchHeader
    settings: TabletSettings
    now_ms: int
    sink: BlobSink | None


class Appends:
    def __init__(self, tablet: AppendingTablet) -> None:
        self._tablet = tablet
        # Bound once: none of these is replaced after the tablet is built.
        self._writer = tablet.writer
        self._settings = tablet.settings
        self._partition = tablet.partition
        self._prefix = tablet.prefix
        self._meta_key = tablet.meta_key
        self._files = tablet.files
        self._pending = tablet.pending
        self._producers = tablet.producers
        self._segments = tablet.segments
        self._meta = tablet.meta
        self._index_timestamp = tablet.reads.index_timestamp
        self._cache = tablet.reads.cache
        self._advance_high_watermark = tablet.reads.advance_high_watermark
        self._checking: deque[_Checking] = deque()

    def append(self, records: bytes | memoryview, now_ms: int,
               sink: BlobSink | None = None) -> asyncio.Future[AppendResult]:
        """Validate, assign offsets and queue one atomic write of a record set.

        A transactional batch goes to ``sink``'s transaction instead of the
        log, and its result has base offset -1, or with
        ``txn_offset_lower_bound`` a lower bound of the offset its commit
        will give it (exact when the transaction is the partition's only
        writer). A retried batch of an idempotent producer is not stored
        again: its result is the original.

        Raises at once, before anything is stored, what the batch header shows
        (InvalidRecordBatch, InvalidRecord, RecordTooLarge,
        UnsupportedRecordKind); the returned future fails with what the
        records show (InvalidRecord, InvalidTimestamp, InvalidRecordBatch) or
        what the producer's sequences show (InvalidProducerEpoch,
        OutOfOrderSequence, UnknownProducerId), and otherwise resolves once
        the batch is in the WAL.

        Offsets (and sequences) are taken in the order of the calls: an append
        whose records are checked on a worker thread (compressed or large
        batches) holds back the appends after it until it is checked.
        """
        view = memoryview(records)
        settings = self._settings()
        # The header's checks and, when cheap, the records' in one C call.
        header, max_timestamp = validate.check_batch(view, settings, now_ms)
        if header.is_transactional != (sink is not None):
            raise UnsupportedRecordKind(
                "transactional batches need an open transaction" if sink is None else
                "a transaction's record set holds only transactional batches")
        loop = self._writer.loop
        checked: asyncio.Future[int]
        if max_timestamp is not None or validate.runs_inline(header):
            if max_timestamp is None:  # refused by the C checks: these raise its error
                max_timestamp = validate.check_records(view, header, settings, now_ms,
                                                       f"{settings.topic}-{self._partition}")
            if sink is not None:
                sink.expect()
            if not self._checking:
                return self._commit(view, header, max_timestamp, settings, now_ms,
                                    loop.create_future(), sink)
            checked = loop.create_future()
            checked.set_result(max_timestamp)
        else:
            if sink is not None:
                sink.expect()
            try:
                checked = asyncio.wrap_future(
                    self._tablet.validators.submit(validate.check_records, view, header,
                                                   settings, now_ms, self._tablet.name),
                    loop=loop,
                )
            except BaseException:
                if sink is not None:
                    sink.settled()
                raise
        appended: asyncio.Future[AppendResult] = loop.create_future()
        self._checking.append(_Checking(checked, appended, view, header, settings, now_ms, sink))
        checked.add_done_callback(self._commit_checked)
        return appended

    def _commit_checked(self, _checked: asyncio.Future[int] | None = None) -> None:
        """Commit, in arrival order, the appends whose records are checked."""
        queue = self._checking
        while queue and queue[0].checked.done():
            item = queue.popleft()
            if item.checked.cancelled():
                error: BaseException | None = StorageError("record validation was cancelled")
            else:
                error = item.checked.exception()
            if error is None and self._tablet.deleted:
                error = UnknownPartition(f"partition {self._partition} was deleted")
            if error is not None:
                if not item.appended.done():
                    item.appended.set_exception(error)
                if item.sink is not None:
                    item.sink.settled()
                continue
            self._commit(item.view, item.header, item.checked.result(), item.settings,
                         item.now_ms, item.appended, item.sink)

    def _commit(
        self,
        view: memoryview,
        header: batch_header.BatchHeader,
        max_timestamp: int,
        settings: TabletSettings,
        now_ms: int,
        appended: asyncio.Future[AppendResult],
        sink: BlobSink | None,
    ) -> asyncio.Future[AppendResult]:
        """Check a checked batch's sequence, assign it offsets (or a blob of its
        transaction) and queue its write; resolve ``appended``."""
        try:
            return self._store(view, header, max_timestamp, settings, now_ms, appended, sink)
        finally:
            if sink is not None:
                sink.settled()  # stored or refused: the commit no longer waits for it

    def _store(
        self,
        view: memoryview,
        header: batch_header.BatchHeader,
        max_timestamp: int,
        settings: TabletSettings,
        now_ms: int,
        appended: asyncio.Future[AppendResult],
        sink: BlobSink | None,
    ) -> asyncio.Future[AppendResult]:
        tablet = self._tablet
        ops = Ops()
        key = b""
        if sink is not None:
            try:
                # First: a batch whose transaction ended stores nothing, not
                # even its sequence.
                key = sink.next_key(self._prefix)
            except Exception as exc:
                if not appended.done():
                    appended.set_exception(exc)
                return appended
        cached = None
        if header.producer_id >= 0:
            try:
                duplicate = self._check_sequence(header)
            except TabletError as exc:
                if not appended.done():
                    appended.set_exception(exc)
                return appended
            if duplicate is not None and duplicate.base_offset == REFUSED:
                appended.set_exception(BatchRefused(
                    f"{tablet.name}: producer {header.producer_id} sequence "
                    f"{duplicate.first_seq}..{duplicate.last_seq} was refused before; nothing "
                    "of it is stored"))
                return appended
            if duplicate is not None:
                # The original may still be on its way to the WAL: an empty change
                # lands after it (writes land in submission order), so the retry
                # is never acknowledged before the data it stands for is durable.
                offset = duplicate.base_offset  # a transactional one's: its bound
                if sink is not None and not settings.txn_offset_lower_bound:
                    offset = -1
                result = AppendResult(offset, -1, tablet.log_start_offset)
                return self._write(ops, appended, result, None)
            cached = CachedBatch(header.base_sequence,
                                 next_seq(header.base_sequence, header.record_count - 1), -1)
        data = batch_header.stamp(view, header, 0 if sink is not None else tablet.log_end_offset,
                                  LEADER_EPOCH)
        if settings.log_append_time:  # stamped when stored, as Kafka stamps its log
            max_timestamp = now_ms
            data = batch_header.set_max_timestamp(data, now_ms, log_append_time=True)
        elif max_timestamp != header.max_timestamp:
            # Kafka stores the records' true max timestamp, whatever the
            # producer wrote; the time index relies on it.
            data = batch_header.set_max_timestamp(data, max_timestamp)
        append_time = now_ms if settings.log_append_time else -1
        if sink is not None:
            try:
                sink.admit(len(data))
            except TabletError as exc:
                return self._refuse(ops, appended, exc, header, cached, now_ms)
            # Where the commit puts it at the earliest: it appends the
            # transaction's batches of this partition in order at the log's
            # end, which only grows. Kept for a retry of it; answered if the
            # topic opts in.
            bound = tablet.log_end_offset + sink.pending_records(self._prefix)
            entry = log_entry.file_entry(data, 0, *self._files.append(
                data, ops, settings.segment_bytes, settings.segment_ms, now_ms), False)
            ops.put(key, entry)
            self._pending[key] = entry
            if cached is not None:
                self._producers.stage(header.producer_id, header.producer_epoch,
                                      CachedBatch(cached.first_seq, cached.last_seq, bound),
                                      now_ms, ops)
            sink.added(key, data)
            offset = bound if settings.txn_offset_lower_bound else -1
            return self._write(ops, appended, AppendResult(offset, append_time,
                                                           tablet.log_start_offset), None)
        base_offset = tablet.log_end_offset
        if cached is not None:
            self._producers.stage(header.producer_id, header.producer_epoch,
                                  CachedBatch(cached.first_seq, cached.last_seq, base_offset),
                                  now_ms, ops)
        no, position = self._files.append(data, ops, settings.segment_bytes,
                                          settings.segment_ms, now_ms)
        ops.put(keys.offset_key(keys.LOG, self._prefix, base_offset),
                log_entry.file_entry(data, base_offset, no, position, False))
        self._index_timestamp(base_offset, max_timestamp, ops)
        self._cache(base_offset, data)
        tablet.size_bytes += len(data)
        self._segments.add(base_offset, len(data), max_timestamp, settings.segment_bytes,
                           settings.segment_ms, settings.compaction is not None, ops)
        offset = base_offset + header.record_count
        tablet.log_end_offset = offset
        ops.put(self._meta_key, self._meta())
        return self._write(ops, appended, AppendResult(base_offset, append_time,
                                                       tablet.log_start_offset), offset)

    def _refuse(self, ops: Ops, appended: asyncio.Future[AppendResult], error: TabletError,
                header: batch_header.BatchHeader, cached: CachedBatch | None,
                now_ms: int) -> asyncio.Future[AppendResult]:
        """Fail ``appended`` with ``error``, the batch's transaction refusing it
        (a limit; abort-only): nothing of the batch is stored, but its sequence
        numbers are kept (``producer_rules.REFUSED``), so the producer's next batch
        may follow them or use them again; a retry of it is never answered as
        a stored duplicate."""
        if cached is None:
            appended.set_exception(error)
            return appended
        self._producers.stage(header.producer_id, header.producer_epoch,
                              CachedBatch(cached.first_seq, cached.last_seq, REFUSED), now_ms, ops)
        done = self._writer.submit(ops)

        def on_written(fut: asyncio.Future[None]) -> None:
            if not appended.done():
                appended.set_exception(fut.exception() or error)

        done.add_done_callback(on_written)
        return appended

    def _check_sequence(self, header: batch_header.BatchHeader) -> CachedBatch | None:
        """The batch an idempotent retry repeats, or None; raises on a gap or a
        stale epoch. Called in arrival order, after earlier batches staged."""
        first = header.base_sequence
        return self._producers.check(header.producer_id, header.producer_epoch, first,
                                     next_seq(first, header.record_count - 1))

    def _write(self, ops: Ops, appended: asyncio.Future[AppendResult], result: AppendResult,
               publish_to: int | None) -> asyncio.Future[AppendResult]:
        """Queue ``ops``; once in the WAL, resolve ``appended`` with ``result`` and
        (for log appends) move the high watermark to ``publish_to``."""
        done = self._writer.submit(ops)

        def on_written(fut: asyncio.Future[None]) -> None:
            # The high watermark first: the fetches it wakes are then scheduled
            # before the produce request's task, so a tail consumer's answer is
            # written before the producer's (docs/performance.md, "End-to-end
            # median"). Either way both follow the write.
            if fut.exception() is None and publish_to is not None:
                self._advance_high_watermark(publish_to)
            if appended.done():
                pass
            elif fut.exception() is not None:
                appended.set_exception(fut.exception())  # type: ignore[arg-type]
            else:
                appended.set_result(result)

        done.add_done_callback(on_written)
        return appended
