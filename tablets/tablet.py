"""PartitionTablet: one topic partition's log: record bytes in segment files,
indexed by keys in RocksDB.

State in memory (rebuilt from the store at start-up):

- ``log_start_offset``  first offset still readable (retention, DeleteRecords);
- ``log_end_offset``    next offset to assign; appends take offsets from here
  on the event loop, in the order ``append`` was called, so concurrent
  produce requests are ordered by arrival;
- ``high_watermark``    end of what is in the WAL; readers see nothing above
  it. Writes complete in submission order, so it only moves forward;
- the *tail*: the newest batches as bytes, so consumers at the head of the log
  are served without touching RocksDB;
- the time index: (base offset, running max timestamp) each time the running
  max grows, for ListOffsets by timestamp and time-based retention.

A batch is stored as the bytes the producer sent, with its offset, leader
epoch and (when Kafka would rewrite it) max timestamp patched, appended once
to the partition's segment files (``segment_files``, the collaborator
``files``); RocksDB holds where it lies (``log_entry.file_entry``). Its records
are checked once, at produce time (``validate``): on the event loop when
that is cheap, otherwise on a worker thread, and appends to one partition
take their offsets in the order they arrived either way. Fetch never parses
records; ListOffsets by timestamp streams one batch (``records``).

Transactional batches do not enter the log when produced: ``append`` writes
them to the segment files too, indexed as pending blobs of their
transaction (a ``BlobSink`` names the keys); a commit (``txn_log``) later
moves their small entries into the log, at its end, in the transaction's one
commit write; an abort drops them and punches their bytes out of the file.
Start-up (``recovery``) cuts what a crash left unindexed or torn.
Idempotent producers' sequences are checked and kept by ``producers``, in the
same write as the batches they describe.

Appends also keep the log's virtual segments (``segments``: where Kafka
would roll files), which compaction (``compacted_log``) follows. Compaction
and truncation (retention, DeleteRecords, idle producers' expiry:
``truncation``) change the log below its head, one at a time (``log_lock``).
Reads, long-polls and lookups by timestamp (``log_reads``), compaction,
truncation and transactional commits are collaborators the tablet holds
(``tablet.reads``, ``tablet.compaction``, ``tablet.truncation``,
``tablet.transactions``), each given the tablet as a narrow Protocol of the
state it reads and writes (the offsets, the tail, the time index kept here);
the tablet keeps the seam's ``PartitionLog`` methods, delegating.
"""

from __future__ import annotations

import asyncio
import struct
from array import array
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import batch as batch_header
from . import keys, log_entry, validate
from .compacted_log import CompactedLog
from .errors import (
    BatchRefused,
    TabletError,
    UnknownPartition,
    UnsupportedRecordKind,
)
from .in_memory_batches import InMemoryBatches
from .log_entry import LEADER_EPOCH
from .log_reads import LogReads
from .producers import REFUSED, CachedBatch, ProducerStates, next_seq
from .recovery import load_state
from .seam import AppendResult, BlobSink, ReadResult
from .segment_files import PartitionFiles
from .segments import Segment, Segments
from .store import GroupCommitWriter, Ops, RocksStore, StorageError
from .tablet_settings import TabletSettings
from .truncation import TruncatedLog
from .txn_log import TransactionLog

if TYPE_CHECKING:
    from uuid import UUID

# log start offset, log end offset, bytes stored, where the next compaction
# starts, and the active segment (base offset, size, first and largest timestamps).
_META = struct.Struct(">qqqqqqqq")


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


class PartitionTablet:
    def __init__(
        self,
        store: RocksStore,
        writer: GroupCommitWriter,
        validators: Executor,
        topic_id: UUID,
        partition: int,
        settings: Callable[[], TabletSettings],
        tail_cache_bytes: int,
        files_root: str,
    ) -> None:
        self.store = store
        self.writer = writer
        self.validators = validators
        self.topic_id = topic_id
        self.partition = partition
        self.settings = settings
        self.prefix = keys.partition_prefix(topic_id, partition)
        self.meta_key = keys.META + self.prefix
        self.files = PartitionFiles(files_root, self.prefix, f"{topic_id.hex}-{partition}")
        # Pending transactional batches: blob key -> file entry.
        self.pending: dict[bytes, bytes] = {}
        self.log_start_offset = 0
        self.log_end_offset = 0
        self.high_watermark = 0
        self.size_bytes = 0
        self.deleted = False
        self._tail = InMemoryBatches()
        self._ts_offsets = array("q")
        self._ts_values = array("q")
        self.reads = LogReads(store, self.files, self, tail_cache_bytes)
        self._checking: deque[_Checking] = deque()
        self.producers = ProducerStates(self.prefix, settings().max_producers)
        self.segments = Segments(self.prefix)
        self.clean_end = 0  # where the next compaction's dirty section starts
        # Truncation and compaction swaps change the log below the head one
        # at a time.
        self.log_lock = asyncio.Lock()
        # Collaborators, each seeing the tablet as the narrow Protocol of the
        # state it reads and writes.
        self.truncation = TruncatedLog(self)  # retention, DeleteRecords, producers' expiry
        self.compaction = CompactedLog(self)  # when a run is due; swapping chunks in
        self.transactions = TransactionLog(self)  # a commit's part of the log, aborts

    # ------------------------------------------------------------------ load
    def load(self, migrate: bool = False) -> None:
        """Rebuild the in-memory state from the store (start-up); with
        ``migrate``, move a format-1 log into segment files first."""
        raw = self.store.get(self.meta_key)
        if raw is not None:
            (self.log_start_offset, self.log_end_offset, self.size_bytes, self.clean_end,
             *active) = _META.unpack(raw)
            self.segments.load(self.store, Segment(*active))
        else:
            self.segments.active.base = self.log_end_offset
        self.high_watermark = self.log_end_offset
        load_state(self, migrate)

    def initial_ops(self, ops: Ops) -> None:
        ops.put(self.meta_key, self.meta())

    def meta(self) -> bytes:
        """The partition's meta record (``_META``), as the store keeps it."""
        active = self.segments.active
        return _META.pack(self.log_start_offset, self.log_end_offset, self.size_bytes,
                          self.clean_end, active.base, active.size, active.first_ts,
                          active.largest_ts)

    @property
    def name(self) -> str:
        """topic-partition, as Kafka names it in messages."""
        return f"{self.settings().topic}-{self.partition}"

    async def delete_records(self, before: int) -> int:
        """DeleteRecords (the seam's ``PartitionLog``): the new log start offset."""
        return await self.truncation.delete_records(before)

    # ------------------------------------------------- reads (``log_reads``)
    async def read(self, offset: int, max_bytes: int, min_one: bool = True) -> ReadResult:
        return self.reads.read(offset, max_bytes, min_one)

    def waiter(self) -> asyncio.Future[None]:
        return self.reads.waiter()

    def forget_waiter(self, future: asyncio.Future[None]) -> None:
        self.reads.forget_waiter(future)

    def wake_waiters(self) -> None:
        self.reads.wake_waiters()

    async def offset_for_timestamp(self, target: int) -> tuple[int, int] | None:
        return await self.reads.offset_for_timestamp(target)

    async def max_timestamp(self) -> tuple[int, int] | None:
        return await self.reads.max_timestamp()

    @property
    def last_stable_offset(self) -> int:
        return self.reads.last_stable_offset

    def set_tail_budget(self, nbytes: int) -> None:
        self.reads.set_tail_budget(nbytes)

    def read_entry(self, entry: bytes) -> bytes:
        return self.reads.read_entry(entry)

    def _cache(self, offset: int, data: bytes) -> None:
        self.reads.cache(offset, data)

    def _index_timestamp(self, offset: int, max_timestamp: int, ops: Ops) -> None:
        self.reads.index_timestamp(offset, max_timestamp, ops)

    def _advance_high_watermark(self, offset: int) -> None:
        self.reads.advance_high_watermark(offset)

    def release(self) -> None:
        """The partition is deleted: wake its fetchers and free its memory now
        (a tablet and its topic reference each other, so only the cyclic
        garbage collector would free them, and big buffers do not prompt it)."""
        self.deleted = True
        self.pending.clear()
        self.reads.release()

    # ---------------------------------------------------------------- append
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
        settings = self.settings()
        header = validate.check_header(view, settings)
        if header.is_transactional != (sink is not None):
            raise UnsupportedRecordKind(
                "transactional batches need an open transaction" if sink is None else
                "a transaction's record set holds only transactional batches")
        loop = self.writer.loop
        checked: asyncio.Future[int]
        if validate.runs_inline(header):
            max_timestamp = validate.check_records(view, header, settings, now_ms,
                                                   f"{settings.topic}-{self.partition}")
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
                    self.validators.submit(validate.check_records, view, header, settings,
                                           now_ms, self.name),
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
            if error is None and self.deleted:
                error = UnknownPartition(f"partition {self.partition} was deleted")
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
        ops = Ops()
        key = b""
        if sink is not None:
            try:
                # First: a batch whose transaction ended stores nothing, not
                # even its sequence.
                key = sink.next_key(self.prefix)
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
                    f"{self.name}: producer {header.producer_id} sequence "
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
                result = AppendResult(offset, -1, self.log_start_offset)
                return self._write(ops, appended, result, None)
            cached = CachedBatch(header.base_sequence,
                                 next_seq(header.base_sequence, header.record_count - 1), -1)
        data = batch_header.stamp(view, header, 0 if sink is not None else self.log_end_offset,
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
            bound = self.log_end_offset + sink.pending_records(self.prefix)
            entry = log_entry.file_entry(data, 0, *self.files.append(
                data, ops, settings.segment_bytes, settings.segment_ms, now_ms), False)
            ops.put(key, entry)
            self.pending[key] = entry
            if cached is not None:
                self.producers.stage(header.producer_id, header.producer_epoch,
                                     CachedBatch(cached.first_seq, cached.last_seq, bound),
                                     now_ms, ops)
            sink.added(key, data)
            offset = bound if settings.txn_offset_lower_bound else -1
            return self._write(ops, appended, AppendResult(offset, append_time,
                                                           self.log_start_offset), None)
        base_offset = self.log_end_offset
        if cached is not None:
            self.producers.stage(header.producer_id, header.producer_epoch,
                                 CachedBatch(cached.first_seq, cached.last_seq, base_offset),
                                 now_ms, ops)
        no, position = self.files.append(data, ops, settings.segment_bytes,
                                         settings.segment_ms, now_ms)
        ops.put(keys.offset_key(keys.LOG, self.prefix, base_offset),
                log_entry.file_entry(data, base_offset, no, position, False))
        self._index_timestamp(base_offset, max_timestamp, ops)
        self._cache(base_offset, data)
        self.size_bytes += len(data)
        self.segments.add(base_offset, len(data), max_timestamp, settings.segment_bytes,
                          settings.segment_ms, settings.compaction is not None, ops)
        offset = base_offset + header.record_count
        self.log_end_offset = offset
        ops.put(self.meta_key, self.meta())
        return self._write(ops, appended, AppendResult(base_offset, append_time,
                                                       self.log_start_offset), offset)

    def _refuse(self, ops: Ops, appended: asyncio.Future[AppendResult], error: TabletError,
                header: batch_header.BatchHeader, cached: CachedBatch | None,
                now_ms: int) -> asyncio.Future[AppendResult]:
        """Fail ``appended`` with ``error``, the batch's transaction refusing it
        (a limit; abort-only): nothing of the batch is stored, but its sequence
        numbers are kept (``producers.REFUSED``), so the producer's next batch
        may follow them or use them again; a retry of it is never answered as
        a stored duplicate."""
        if cached is None:
            appended.set_exception(error)
            return appended
        self.producers.stage(header.producer_id, header.producer_epoch,
                             CachedBatch(cached.first_seq, cached.last_seq, REFUSED), now_ms, ops)
        done = self.writer.submit(ops)

        def on_written(fut: asyncio.Future[None]) -> None:
            if not appended.done():
                appended.set_exception(fut.exception() or error)

        done.add_done_callback(on_written)
        return appended

    def _check_sequence(self, header: batch_header.BatchHeader) -> CachedBatch | None:
        """The batch an idempotent retry repeats, or None; raises on a gap or a
        stale epoch. Called in arrival order, after earlier batches staged."""
        first = header.base_sequence
        return self.producers.check(header.producer_id, header.producer_epoch, first,
                                    next_seq(first, header.record_count - 1))

    def _write(self, ops: Ops, appended: asyncio.Future[AppendResult], result: AppendResult,
               publish_to: int | None) -> asyncio.Future[AppendResult]:
        """Queue ``ops``; once in the WAL, resolve ``appended`` with ``result`` and
        (for log appends) move the high watermark to ``publish_to``."""
        done = self.writer.submit(ops)

        def on_written(fut: asyncio.Future[None]) -> None:
            if appended.done():
                pass
            elif fut.exception() is not None:
                appended.set_exception(fut.exception())  # type: ignore[arg-type]
            else:
                appended.set_result(result)
            if fut.exception() is None and publish_to is not None:
                self._advance_high_watermark(publish_to)

        done.add_done_callback(on_written)
        return appended
