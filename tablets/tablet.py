"""PartitionTablet: one topic partition's log, kept as keys in RocksDB.

State in memory (rebuilt from the store at start-up):

- ``log_start_offset``  first offset still readable (retention, DeleteRecords);
- ``log_end_offset``    next offset to assign; appends take offsets from here
  synchronously, on the event loop, so concurrent produce requests are
  ordered by arrival;
- ``high_watermark``    end of what is in the WAL; readers see nothing above
  it. Writes complete in submission order, so it only moves forward;
- the *tail*: the newest batches as bytes, so consumers at the head of the log
  are served without touching RocksDB;
- the time index: (base offset, running max timestamp) each time the running
  max grows, for ListOffsets by timestamp and time-based retention.

Nothing here parses records on the produce or fetch path: a batch is bytes
plus the 61-byte header.

Transactional batches do not enter the log when produced: ``append`` stores
them as blobs of their transaction (a ``BlobSink`` names the keys), and
``stage_commit`` later writes the small log entries that reference them
(``log_entry``), at the end of the log, in the transaction's one commit write.
Idempotent producers' sequences are checked and kept by ``producers``, in the
same write as the batches they describe.
"""

from __future__ import annotations

import asyncio
import struct
import time
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from . import batch as rb
from . import keys, log_entry
from .errors import (
    InvalidTimestamp,
    OffsetOutOfRange,
    RecordTooLarge,
    UnsupportedRecordKind,
)
from .memory_run import MemoryRun
from .producers import CachedBatch, ProducerStates, next_seq
from .records import record_timestamps
from .store import GroupCommitWriter, Ops, RocksStore

if TYPE_CHECKING:
    from uuid import UUID

_META = struct.Struct(">qqq")  # log start offset, log end offset, bytes stored
_TIMESTAMP = struct.Struct(">q")

LEADER_EPOCH = 0  # one copy, one leader, forever: the epoch never changes
READAHEAD_BYTES = 4 << 20  # read past a fetch below the tail, for the next ones


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int
    log_append_time: int  # -1 unless the topic uses LogAppendTime
    log_start_offset: int


@dataclass(slots=True)
class ReadResult:
    batches: list[bytes]
    high_watermark: int
    log_start_offset: int

    @property
    def nbytes(self) -> int:
        return sum(len(b) for b in self.batches)


@dataclass(frozen=True, slots=True)
class PendingBlob:
    """A transactional batch stored outside the log until its transaction commits."""

    key: bytes
    header: bytes  # its 61-byte header, as produced
    data: bytes | None  # the batch itself, while held in memory


class BlobSink(Protocol):
    """An open transaction, receiving one partition's transactional batches."""

    def next_key(self, partition_prefix: bytes) -> bytes: ...

    def added(self, key: bytes, batch: bytes) -> None: ...


@dataclass(frozen=True, slots=True)
class TabletSettings:
    """The effective configs a tablet enforces (read from the topic each time)."""

    max_message_bytes: int
    log_append_time: bool
    timestamp_difference_max_ms: int
    retention_ms: int
    retention_bytes: int
    max_producers: int = 10_000  # producer ids whose sequences a partition keeps


class PartitionTablet:
    def __init__(
        self,
        store: RocksStore,
        writer: GroupCommitWriter,
        topic_id: UUID,
        partition: int,
        settings: Callable[[], TabletSettings],
        tail_cache_bytes: int,
    ) -> None:
        self.store = store
        self.writer = writer
        self.topic_id = topic_id
        self.partition = partition
        self.settings = settings
        self.prefix = keys.partition_prefix(topic_id, partition)
        self.meta_key = keys.META + self.prefix
        self.log_start_offset = 0
        self.log_end_offset = 0
        self.high_watermark = 0
        self.size_bytes = 0
        self.deleted = False
        self._tail_cache_bytes = tail_cache_bytes
        self._tail = MemoryRun()
        # Batches read ahead of a consumer below the tail, up to _ahead_end.
        self._ahead = MemoryRun()
        self._ahead_end = 0
        self._ts_offsets = array("q")
        self._ts_values = array("q")
        self._waiters: set[asyncio.Future[None]] = set()
        self.producers = ProducerStates(self.prefix, settings().max_producers)

    # ------------------------------------------------------------------ load
    def load(self) -> None:
        """Rebuild the in-memory state from the store (start-up)."""
        raw = self.store.get(self.meta_key)
        if raw is not None:
            self.log_start_offset, self.log_end_offset, self.size_bytes = _META.unpack(raw)
        self.high_watermark = self.log_end_offset
        start, end = keys.TIME_INDEX + self.prefix, keys.TIME_INDEX + self.prefix + b"\xff" * 8
        for key, value in self.store.scan(start, end):
            self._ts_offsets.append(keys.offset_of_key(key))
            self._ts_values.append(_TIMESTAMP.unpack(value)[0])
        self.producers.load(self.store)

    def initial_ops(self, ops: Ops) -> None:
        ops.put(self.meta_key, self._meta())

    def _meta(self) -> bytes:
        return _META.pack(self.log_start_offset, self.log_end_offset, self.size_bytes)

    # ---------------------------------------------------------------- append
    def append(self, records: bytes | memoryview, now_ms: int,
               sink: BlobSink | None = None) -> asyncio.Future[AppendResult]:
        """Validate, assign offsets and queue one atomic write of a record set.

        A transactional record set goes to ``sink``'s transaction instead of
        the log, and its result has base offset -1. A retried batch of an
        idempotent producer is not stored again: its result is the original.

        Raises (before anything is stored) InvalidRecordBatch, RecordTooLarge,
        InvalidTimestamp, UnsupportedRecordKind, or an idempotence error
        (InvalidProducerEpoch, OutOfOrderSequence, UnknownProducerId). The
        returned future resolves once the batches are in the WAL.
        """
        headers = rb.parse_batches(records)
        settings = self.settings()
        for header in headers:
            if header.size > settings.max_message_bytes:
                raise RecordTooLarge(
                    f"batch of {header.size} bytes exceeds max.message.bytes="
                    f"{settings.max_message_bytes}"
                )
            if header.is_control:
                raise UnsupportedRecordKind("clients do not write control batches")
            if header.is_transactional != (sink is not None):
                raise UnsupportedRecordKind(
                    "transactional batches need an open transaction" if sink is None else
                    "a transaction's record set holds only transactional batches")
            if settings.timestamp_difference_max_ms < 2**63 - 1 and not settings.log_append_time:
                limit = settings.timestamp_difference_max_ms
                for ts in (header.base_timestamp, header.max_timestamp):
                    if abs(now_ms - ts) > limit:
                        raise InvalidTimestamp(
                            f"timestamp {ts} is out of range (message.timestamp.difference.max.ms"
                            f"={limit})"
                        )
        view = memoryview(records)
        ops = Ops()
        if headers[0].producer_id >= 0:
            return self._append_idempotent(view, headers, now_ms, sink, ops)
        return self._append_to_log(view, headers, now_ms, ops)

    def _append_to_log(self, view: memoryview, headers: list[rb.BatchHeader], now_ms: int,
                       ops: Ops) -> asyncio.Future[AppendResult]:
        settings = self.settings()
        base_offset = self.log_end_offset
        offset = base_offset
        for header in headers:
            data = rb.stamp(view, header, offset, LEADER_EPOCH)
            max_timestamp = header.max_timestamp
            if settings.log_append_time:
                data = rb.set_log_append_time(data, now_ms)
                max_timestamp = now_ms
            ops.put(keys.offset_key(keys.LOG, self.prefix, offset), data)
            self._index_timestamp(offset, max_timestamp, ops)
            self._cache(offset, data)
            self.size_bytes += len(data)
            offset += header.record_count
        self.log_end_offset = offset
        ops.put(self.meta_key, self._meta())
        result = AppendResult(
            base_offset, now_ms if settings.log_append_time else -1, self.log_start_offset
        )
        return self._submit(ops, result, offset)

    def _submit(self, ops: Ops, result: AppendResult,
                publish_to: int | None) -> asyncio.Future[AppendResult]:
        """Queue ``ops``; once in the WAL, resolve with ``result`` and (for log
        appends) move the high watermark to ``publish_to``."""
        done = self.writer.submit(ops)
        appended: asyncio.Future[AppendResult] = done.get_loop().create_future()

        def on_written(fut: asyncio.Future[None]) -> None:
            if appended.cancelled():
                pass
            elif fut.exception() is not None:
                appended.set_exception(fut.exception())  # type: ignore[arg-type]
            else:
                appended.set_result(result)
            if fut.exception() is None and publish_to is not None:
                self._advance_high_watermark(publish_to)

        done.add_done_callback(on_written)
        return appended

    def _index_timestamp(self, offset: int, max_timestamp: int, ops: Ops) -> None:
        if not self._ts_values or max_timestamp > self._ts_values[-1]:
            self._ts_offsets.append(offset)
            self._ts_values.append(max_timestamp)
            ops.put(keys.offset_key(keys.TIME_INDEX, self.prefix, offset),
                    _TIMESTAMP.pack(max_timestamp))

    # ------------------------------------------------ idempotent producers
    def _append_idempotent(self, view: memoryview, headers: list[rb.BatchHeader], now_ms: int,
                           sink: BlobSink | None, ops: Ops) -> asyncio.Future[AppendResult]:
        """A batch of an idempotent or transactional producer: sequence checks,
        then the log (idempotent) or the transaction's blobs (transactional).

        As in Kafka (Produce v3+), such a record set is exactly one batch.
        """
        if len(headers) != 1:
            raise rb.InvalidRecordBatch(
                "an idempotent or transactional record set must be exactly one batch")
        header = headers[0]
        pid, epoch, first_seq = header.producer_id, header.producer_epoch, header.base_sequence
        if first_seq < 0:
            raise rb.InvalidRecordBatch(f"producer {pid} sent a batch without a sequence")
        last_seq = next_seq(first_seq, header.record_count - 1)
        duplicate = self.producers.check(pid, epoch, first_seq, last_seq)
        if duplicate is not None:
            # The original may still be on its way to the WAL: an empty change
            # lands after it (writes land in submission order), so the retry
            # is never acknowledged before the data it stands for is durable.
            return self._submit(Ops(), AppendResult(duplicate.base_offset, -1,
                                                    self.log_start_offset), None)
        if sink is None:
            base_offset = self.log_end_offset
            self.producers.stage(pid, epoch, CachedBatch(first_seq, last_seq, base_offset),
                                 now_ms, ops)
            return self._append_to_log(view, headers, now_ms, ops)
        data = rb.stamp(view, header, 0, LEADER_EPOCH)
        append_time = -1
        if self.settings().log_append_time:  # stamped when stored, as Kafka stamps its log
            append_time = now_ms
            data = rb.set_log_append_time(data, now_ms)
        key = sink.next_key(self.prefix)
        ops.put(key, data)
        self.producers.stage(pid, epoch, CachedBatch(first_seq, last_seq, -1), now_ms, ops)
        sink.added(key, data)
        return self._submit(ops, AppendResult(-1, append_time, self.log_start_offset), None)

    # --------------------------------------------------- transaction commit
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
        cached = all(blob.data is not None for blob in blobs)
        if not cached:
            self._tail = MemoryRun()
        for blob in blobs:
            ops.put(keys.offset_key(keys.LOG, self.prefix, offset),
                    log_entry.reference(blob.header, offset, LEADER_EPOCH, blob.key))
            self._index_timestamp(offset, rb.max_timestamp_of(blob.header), ops)
            if cached:
                self._cache(offset, log_entry.patch(blob.data, offset, LEADER_EPOCH))
            self.size_bytes += log_entry.size(blob.header)
            offset += rb.record_count_of(blob.header)
        data = rb.stamp(memoryview(marker), rb.parse_batches(marker)[0], offset, LEADER_EPOCH)
        ops.put(keys.offset_key(keys.LOG, self.prefix, offset), data)
        self._index_timestamp(offset, rb.max_timestamp_of(data), ops)
        self._cache(offset, data)
        self.size_bytes += len(data)
        offset += 1
        self.log_end_offset = offset
        ops.put(self.meta_key, self._meta())
        return lambda: self._advance_high_watermark(offset)

    def _advance_high_watermark(self, offset: int) -> None:
        if offset > self.high_watermark:
            self.high_watermark = offset
            self.wake_waiters()

    def _cache(self, offset: int, data: bytes) -> None:
        self._tail.append(offset, data)
        self._tail.trim(self._tail_cache_bytes)

    def release(self) -> None:
        """The partition is deleted: wake its fetchers and free its memory now
        (a tablet and its topic reference each other, so only the cyclic
        garbage collector would free them, and big buffers do not prompt it)."""
        self.deleted = True
        self.wake_waiters()
        self._tail, self._ahead, self._ahead_end = MemoryRun(), MemoryRun(), 0
        self._ts_offsets, self._ts_values = array("q"), array("q")

    def set_tail_budget(self, nbytes: int) -> None:
        """This partition's share of the node's in-memory tail budget."""
        self._tail_cache_bytes = nbytes
        self._tail.trim(nbytes)

    @property
    def _tail_start(self) -> int:
        return self._tail.first_offset(default=self.log_end_offset)

    # ------------------------------------------------------------------ read
    @property
    def last_stable_offset(self) -> int:
        # Transactional data reaches the log only when committed.
        return self.high_watermark

    async def read(self, offset: int, max_bytes: int, min_one: bool = True) -> ReadResult:
        """Batches from the one containing ``offset``, up to ``max_bytes``.

        With ``min_one`` the first batch is returned whole even when larger
        (KIP-74). Reads at or past the high watermark return nothing; reads
        outside [log start, log end] raise OffsetOutOfRange.
        """
        hw = self.high_watermark
        if offset < self.log_start_offset or offset > self.log_end_offset:
            raise OffsetOutOfRange(
                f"offset {offset} is outside [{self.log_start_offset}, {self.log_end_offset}]"
            )
        if offset >= hw:  # at the end, or in a write not yet in the WAL
            return ReadResult([], hw, self.log_start_offset)
        if offset >= self._tail_start:
            batches = self._tail.slice(offset, hw, max_bytes, min_one)
        elif self._ahead.first_offset(default=self._ahead_end) <= offset < self._ahead_end:
            batches = self._ahead.slice(offset, hw, max_bytes, min_one)
        else:
            # A consumer behind the tail reads the log in order: read ahead of
            # it, so its next fetches are served from memory without a trip
            # to a reader thread (what bounds a one-partition consumer).
            loop = asyncio.get_running_loop()
            loaded = await loop.run_in_executor(
                self.store.readers, self._read_disk, offset, hw, max_bytes + READAHEAD_BYTES,
                min_one,
            )
            self._ahead = MemoryRun([rb.base_offset_of(b) for b in loaded], loaded)
            self._ahead_end = rb.last_offset_of(loaded[-1]) + 1 if loaded else 0
            batches = self._ahead.slice(offset, hw, max_bytes, min_one)
        return ReadResult(batches, hw, self.log_start_offset)
    def _read_disk(self, offset: int, hw: int, max_bytes: int, min_one: bool) -> list[bytes]:
        out: list[bytes] = []
        total = 0
        floor = keys.LOG + self.prefix
        start = keys.offset_key(keys.LOG, self.prefix, offset)
        end = keys.offset_key(keys.LOG, self.prefix, hw)
        for _key, entry in self.store.scan_from_containing(start, floor, end):
            if rb.last_offset_of(entry) < offset:
                continue
            size = log_entry.size(entry)
            if total + size > max_bytes and (out or not min_one):
                break
            out.append(log_entry.resolve(entry, self.store.get))
            total += size
        return out

    # ------------------------------------------------------------- long-poll
    def waiter(self) -> asyncio.Future[None]:
        """A future resolved the next time the high watermark moves."""
        future = asyncio.get_running_loop().create_future()
        self._waiters.add(future)
        return future

    def forget_waiter(self, future: asyncio.Future[None]) -> None:
        """Drop a waiter whose fetch stopped waiting (timeout, other partition)."""
        self._waiters.discard(future)

    def wake_waiters(self) -> None:
        waiters, self._waiters = self._waiters, set()
        for future in waiters:
            if not future.done():
                future.set_result(None)

    # ------------------------------------------------------ offsets by time
    def _batch_at(self, offset: int) -> bytes | None:
        """The stored batch containing ``offset`` (a blocking read)."""
        batches = self._read_disk(offset, self.high_watermark, 1, True)
        return batches[0] if batches else None

    def _first_record_at_or_after(self, target: int) -> tuple[int, int] | None:
        index = bisect_left(self._ts_values, target)
        if index == len(self._ts_values):
            return None
        offset = max(self._ts_offsets[index - 1] if index else 0, self.log_start_offset)
        hw = self.high_watermark
        # The first batch whose max timestamp reaches the target is at
        # _ts_offsets[index]; scanning from the previous entry keeps the
        # answer exact after retention trimmed the index.
        while offset < hw:
            data = self._batch_at(offset)
            if data is None:
                return None
            if rb.max_timestamp_of(data) >= target:
                for record_offset, timestamp in record_timestamps(data):
                    if timestamp >= target and record_offset >= self.log_start_offset:
                        return record_offset, timestamp
            offset = rb.last_offset_of(data) + 1
        return None

    async def offset_for_timestamp(self, target: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record stamped at or after ``target``."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self.store.readers, self._first_record_at_or_after, target
        )

    async def max_timestamp(self) -> tuple[int, int] | None:
        """(offset, timestamp) of the record with the largest timestamp."""
        if not self._ts_values or self.high_watermark == self.log_start_offset:
            return None
        return await self.offset_for_timestamp(self._ts_values[-1])

    # ------------------------------------------------------ producer expiry
    async def expire_producers(self, now_ms: int, expiration_ms: int) -> int:
        """Forget producers idle for ``producer.id.expiration.ms``."""
        ops = Ops()
        expired = self.producers.expire(now_ms, expiration_ms, ops)
        if expired:
            await self.writer.submit(ops)
        return expired

    # ----------------------------------------------------- deleting records
    async def delete_records(self, before: int) -> int:
        """Advance the log start offset to ``before`` (DeleteRecords); returns it.

        ``-1`` means the high watermark, as in Kafka.
        """
        if before == -1:
            before = self.high_watermark
        if before < 0 or before > self.high_watermark:
            raise OffsetOutOfRange(
                f"offset {before} is outside [{self.log_start_offset}, {self.high_watermark}]"
            )
        if before > self.log_start_offset:
            await self._truncate_front(before)
        return self.log_start_offset

    async def enforce_retention(self, now_ms: int) -> None:
        """Drop the oldest batches past retention.ms or retention.bytes."""
        settings = self.settings()
        new_start = self.log_start_offset
        if settings.retention_ms >= 0 and self._ts_values:
            cutoff = now_ms - settings.retention_ms
            # Entries before `index` have running max < cutoff: every batch
            # before the next entry's base offset is older than retention.
            index = bisect_left(self._ts_values, cutoff)
            if index > 0:
                hw = self.high_watermark
                expired_until = self._ts_offsets[index] if index < len(self._ts_offsets) else hw
                new_start = max(new_start, min(expired_until, self.high_watermark))
        if settings.retention_bytes >= 0 and self.size_bytes > settings.retention_bytes:
            loop = asyncio.get_running_loop()
            by_size = await loop.run_in_executor(
                self.store.readers, self._start_for_size, settings.retention_bytes
            )
            new_start = max(new_start, by_size)
        if new_start > self.log_start_offset:
            await self._truncate_front(new_start)

    def _start_for_size(self, retention_bytes: int) -> int:
        """The first batch to keep: as in Kafka, the oldest data goes only while
        what remains is still at least retention.bytes."""
        excess = self.size_bytes - retention_bytes
        floor = keys.LOG + self.prefix
        for key, entry in self.store.scan(floor, floor + b"\xff" * 8):
            base = keys.offset_of_key(key)
            size = log_entry.size(entry)
            if excess - size < 0 or base >= self.high_watermark:
                return base
            excess -= size
        return self.high_watermark

    async def _truncate_front(self, new_start: int) -> None:
        """Make ``new_start`` the log start offset; delete batches wholly below it."""
        loop = asyncio.get_running_loop()
        floor = keys.LOG + self.prefix
        start_key = keys.offset_key(keys.LOG, self.prefix, new_start)

        def doomed() -> tuple[bytes, int, list[bytes]]:
            # Batches below the one containing new_start go; that one stays,
            # and so do the blobs of the committed transactional batches.
            cut = floor
            freed = 0
            blobs = []
            for key, entry in self.store.scan(floor, start_key + b"\x00"):
                if rb.last_offset_of(entry) >= new_start:
                    break
                cut = keys.offset_key(keys.LOG, self.prefix, keys.offset_of_key(key) + 1)
                freed += log_entry.size(entry)
                if log_entry.is_reference(entry):
                    blobs.append(log_entry.blob_key(entry))
            return cut, freed, blobs

        cut, freed, blobs = await loop.run_in_executor(self.store.readers, doomed)
        if new_start <= self.log_start_offset:
            return  # another truncation got there first
        self.log_start_offset = new_start
        self.size_bytes = max(0, self.size_bytes - freed)
        ops = Ops()
        ops.delete_range(floor, cut)
        for blob in blobs:
            ops.delete(blob)
        # Keep the index entry that covers new_start, clamped to it.
        index = bisect_right(self._ts_offsets, new_start) - 1
        if index > 0:
            ops.delete_range(
                keys.offset_key(keys.TIME_INDEX, self.prefix, 0),
                keys.offset_key(keys.TIME_INDEX, self.prefix, self._ts_offsets[index]),
            )
            del self._ts_offsets[:index]
            del self._ts_values[:index]
        self._tail.drop_below(new_start)
        ops.put(self.meta_key, self._meta())
        await self.writer.submit(ops)
        self.wake_waiters()


def now_ms() -> int:
    return time.time_ns() // 1_000_000
