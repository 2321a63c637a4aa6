"""Produce on the PostgreSQL store (``PgAppends``, a collaborator of
``PgPartitionLog``): one checked batch per append, one ``PgChange`` per batch,
written through the node's group-commit writer.

An append is checked as Kafka checks it (``tablets.validate``: the header on
the event loop; the records there too when cheap, else on a worker thread),
then, in arrival order, on the event loop:

- an idempotent producer's sequence is checked (``tablets.producer_rules``):
  a retry of one of its last five batches is answered with the original's
  offset once that is durable, and stores nothing; an epoch or sequence
  error is answered as the RocksDB engine answers it;
- the batch takes the next offsets from the log end, is stamped with its
  base offset (and LogAppendTime, and its true max timestamp), and its change
  is queued: the fence (the partition row moves only at this leader's epoch
  and from the log end the offsets were taken from), the bytes and their
  index row, the producer's row.

The leader is the only writer, so offsets taken on the event loop are right
as long as every change before lands. When one does not (refused, failed,
or its outcome unknown because the connection broke during the commit), the
changes after it find the log end moved and are refused by the fence, so
nothing lands out of order. The log is then *in doubt*: no offsets are
assigned until every change in flight has settled and the partition row (and
its producers) has been reread; the appends queued meanwhile then go on from
the row's log end. A reread that finds another epoch fences the partition:
this append and every later one fail with ``NotLeader``
(NOT_LEADER_OR_FOLLOWER), and nothing of them is stored.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tablets import batch as batch_header
from tablets import validate
from tablets.errors import (
    BatchRefused,
    NotLeader,
    StorageError,
    TabletError,
    UnknownPartition,
    UnsupportedRecordKind,
)
from tablets.producer_rules import REFUSED, CachedBatch, next_seq
from tablets.seam import LEADER_EPOCH, AppendResult, BlobSink

from .log_sql import load_row
from .producer_rows import PgProducerRows
from .txn_publication import log_ref_of

if TYPE_CHECKING:
    from tablets.tablet_settings import TabletSettings

    from .log_state import LogState
    from .writer import PgChange

logger = logging.getLogger(__name__)

# A batch header's producer id, epoch and base sequence (bytes 43 to 56).
_PRODUCER_IDENTITY = slice(43, 57)
RECENT_BATCHES = 64  # the mean batch size (reads' bound) is over about this many


class _FenceMiss(StorageError):
    """The partition row was not at this leader's epoch and log end: an
    earlier change did not land, or another gateway claimed the partition.
    Answered once the row is reread (``NotLeader``, or retriable)."""


@dataclass(slots=True)
class _Item:
    checked: asyncio.Future[int]  # the records' max timestamp, once checked
    appended: asyncio.Future[AppendResult]
    view: memoryview
    header: batch_header.BatchHeader
    settings: TabletSettings
    now_ms: int
    sink: BlobSink | None  # a transactional batch's transaction


class PgAppends:
    def __init__(self, log: LogState) -> None:
        self._log = log
        self._queue: deque[_Item] = deque()
        self._in_flight = 0  # changes queued in the writer, not yet settled
        self._doubt = False  # a change failed: reread the row before assigning offsets
        self._rereading: asyncio.Task[None] | None = None
        self._fence_misses: list[asyncio.Future[AppendResult]] = []  # answered after the reread
        self._failures = 0  # changes failed so far (a batch joins the tail only if none did)

    def append(self, records: bytes | memoryview, now_ms: int,
               sink: BlobSink | None = None) -> asyncio.Future[AppendResult]:
        """Check a batch, then (in arrival order) assign its offsets and queue
        its change; resolves once durable. Raises at once what the header
        (and cheap records) show; the future fails with what the records,
        the producer's sequence or the fence show."""
        log = self._log
        log.check_writable()
        view = memoryview(records)
        settings = log.settings()
        header = validate.check_header(view, settings)
        if header.is_transactional != (sink is not None):
            raise UnsupportedRecordKind(
                "transactional batches need an open transaction" if sink is None else
                "a transaction's record set holds only transactional batches")
        if sink is not None and log.context.pending is None:
            raise UnsupportedRecordKind(f"{log.name}: no transaction storage on this log")
        loop = asyncio.get_running_loop()
        checked: asyncio.Future[int]
        if validate.runs_inline(header):
            checked = loop.create_future()
            checked.set_result(validate.check_records(view, header, settings, now_ms, log.name))
            if sink is not None:
                sink.expect()  # settled exactly once from here on
        else:
            if sink is not None:
                sink.expect()
            try:
                checked = asyncio.wrap_future(log.validators.submit(
                    validate.check_records, view, header, settings, now_ms, log.name),
                    loop=loop)
            except BaseException:
                if sink is not None:
                    sink.settled()
                raise
            checked.add_done_callback(lambda _: self._drain())
        appended: asyncio.Future[AppendResult] = loop.create_future()
        self._queue.append(_Item(checked, appended, view, header, settings, now_ms, sink))
        self._drain()
        return appended

    @property
    def in_doubt(self) -> bool:
        """A change failed: no offsets are taken until the row is reread."""
        return self._doubt

    def doubt(self) -> None:
        """A change carrying this log's offsets (a commit's) failed or its
        outcome is unknown: reread the row before taking offsets again."""
        self._failures += 1
        self._doubt = True
        self._maybe_reread()

    # ------------------------------------------------------------ in order
    def _drain(self) -> None:
        """Assign offsets, in arrival order, to the appends whose records are
        checked; none while the log is in doubt."""
        queue = self._queue
        while queue and queue[0].checked.done():
            if self._doubt:
                self._maybe_reread()
                return
            item = queue.popleft()
            if item.appended.done():
                if item.sink is not None:
                    item.sink.settled()
                continue
            error: BaseException | None
            if item.checked.cancelled():
                error = StorageError("record validation was cancelled")
            else:
                error = item.checked.exception()
            if error is None:
                try:
                    self._log.check_writable()
                    if item.sink is not None:
                        self._assign_pending(item, item.sink)
                    else:
                        self._assign(item)
                except Exception as exc:  # nothing of the batch staged
                    # (a TabletError, or the transaction's own: it ended)
                    error = exc
                    if item.sink is not None:
                        item.sink.settled()
            elif item.sink is not None:
                item.sink.settled()
            if error is not None and not item.appended.done():
                item.appended.set_exception(error)

    def _assign(self, item: _Item) -> None:
        log = self._log
        header = item.header
        cached: CachedBatch | None = None
        if header.producer_id >= 0:
            first = header.base_sequence
            last = next_seq(first, header.record_count - 1)
            duplicate = log.producer_states.check(header.producer_id, header.producer_epoch,
                                                  first, last)
            if duplicate is not None:
                self._answer_retry(item, duplicate)
                return
            cached = CachedBatch(first, last, log.log_end_offset)
        settings = item.settings
        base = log.log_end_offset
        data = batch_header.stamp(item.view, header, base, LEADER_EPOCH)
        max_timestamp = item.checked.result()
        if settings.log_append_time:  # stamped when stored, as Kafka stamps its log
            max_timestamp = item.now_ms
            data = batch_header.set_max_timestamp(data, item.now_ms, log_append_time=True)
        elif max_timestamp != header.max_timestamp:
            # Kafka stores the records' true max timestamp; the time index relies on it.
            data = batch_header.set_max_timestamp(data, max_timestamp)
        end = base + header.record_count
        running = max(log.running_max_timestamp, max_timestamp)
        sql = log.sql
        change = log.writer.begin()
        change.fence(sql.append, log.log_id, log.leader_epoch, base, end, len(data), data,
                     end - 1, max_timestamp, running,
                     refused=lambda: _FenceMiss(f"{log.name}: the partition row moved"))
        if cached is not None:
            log.producer_states.stage(header.producer_id, header.producer_epoch, cached,
                                      item.now_ms, change)
        change.nbytes = len(data)
        failures = self._failures
        change.on_durable(
            lambda: log.append_durable(base, end, data, in_order=failures == self._failures))
        log.log_end_offset = end
        log.size_bytes += len(data)
        log.running_max_timestamp = running
        log.mean_batch_bytes += ((len(data) - log.mean_batch_bytes) /
                                 (RECENT_BATCHES if log.mean_batch_bytes else 1))
        append_time = item.now_ms if settings.log_append_time else -1
        self._submit(change, item.appended,
                     AppendResult(base, append_time, log.log_start_offset))

    def _assign_pending(self, item: _Item, sink: BlobSink) -> None:
        """A transactional batch: stored once as a pending row of its
        transaction (``PgTransactionStorage.stage_pending``), nothing in the
        log; its transaction learns of it (``added``) once it is durable,
        and settles it either way. Raising a TabletError means nothing was
        staged (the caller settles)."""
        log = self._log
        assert log.context.pending is not None  # checked by ``append``
        header = item.header
        log_ref = log_ref_of(log.log_id)
        # First: a batch whose transaction ended stores nothing, not even
        # its sequence.
        ref = sink.next_key(log_ref)
        cached: CachedBatch | None = None
        if header.producer_id >= 0:
            first = header.base_sequence
            last = next_seq(first, header.record_count - 1)
            duplicate = log.producer_states.check(header.producer_id, header.producer_epoch,
                                                  first, last)
            if duplicate is not None:
                self._answer_pending_retry(item, duplicate, sink, ref)
                return
            cached = CachedBatch(first, last, -1)
        settings = item.settings
        data = batch_header.stamp(item.view, header, 0, LEADER_EPOCH)
        max_timestamp = item.checked.result()
        if settings.log_append_time:
            data = batch_header.set_max_timestamp(data, item.now_ms, log_append_time=True)
        elif max_timestamp != header.max_timestamp:
            data = batch_header.set_max_timestamp(data, max_timestamp)
        try:
            sink.admit(len(data))
        except TabletError as exc:
            self._refuse_pending(item, exc, cached, sink)
            return
        # Where the commit puts it at the earliest (the transaction's batches
        # of this partition go in order at the log end, which only grows):
        # kept for a retry, answered if the topic opts in.
        bound = log.log_end_offset + sink.pending_records(log_ref)
        change = log.writer.begin()
        stored = log.context.pending.stage_pending(change, log, ref, data)  # type: ignore[arg-type]
        if cached is not None:
            log.producer_states.stage(header.producer_id, header.producer_epoch,
                                      CachedBatch(cached.first_seq, cached.last_seq, bound),
                                      item.now_ms, change)
        change.on_durable(lambda: sink.added(ref, stored))
        append_time = item.now_ms if settings.log_append_time else -1
        offset = bound if settings.txn_offset_lower_bound else -1
        self._submit(change, item.appended,
                     AppendResult(offset, append_time, log.log_start_offset), sink.settled)

    def _answer_pending_retry(self, item: _Item, duplicate: CachedBatch, sink: BlobSink,
                              ref: bytes) -> None:
        """A retry of a recent transactional batch: answered once the original
        is durable, if its pending row is there (the producer's id, epoch and
        first sequence in its header), storing nothing."""
        log = self._log
        if duplicate.base_offset == REFUSED:
            raise BatchRefused(f"{log.name}: producer {item.header.producer_id} sequence "
                               f"{duplicate.first_seq}..{duplicate.last_seq} was refused "
                               "before; nothing of it is stored")
        instance = int.from_bytes(ref[8:16], "big", signed=True)
        identity = bytes(item.view[_PRODUCER_IDENTITY])
        change = log.writer.begin()
        change.fence(log.sql.pending_landed, log.log_id, log.leader_epoch, instance, identity,
                     refused=lambda: _FenceMiss(f"{log.name}: the original batch did not land"))
        offset = duplicate.base_offset if item.settings.txn_offset_lower_bound else -1
        self._submit(change, item.appended, AppendResult(offset, -1, log.log_start_offset),
                     sink.settled)

    def _refuse_pending(self, item: _Item, error: TabletError, cached: CachedBatch | None,
                        sink: BlobSink) -> None:
        """The transaction refuses the batch (a limit; it is abort-only now):
        nothing of it is stored, but its sequence numbers are kept
        (``producer_rules.REFUSED``), so the producer's next batch may follow
        them or use them again, and a retry is never answered as stored."""
        log = self._log
        if cached is None:
            raise error
        header = item.header
        change = log.writer.begin()
        change.fence(log.sql.epoch_fence, log.log_id, log.leader_epoch,
                     refused=lambda: NotLeader(f"{log.name}: this gateway no longer leads it"))
        log.producer_states.stage(header.producer_id, header.producer_epoch,
                                  CachedBatch(cached.first_seq, cached.last_seq, REFUSED),
                                  item.now_ms, change)
        appended = item.appended
        done = log.writer.commit(change)

        def on_written(fut: asyncio.Future[None]) -> None:
            sink.settled()
            if not appended.done():
                appended.set_exception(error if fut.cancelled() or fut.exception() is None
                                       else fut.exception())  # type: ignore[arg-type]

        done.add_done_callback(on_written)

    def _answer_retry(self, item: _Item, duplicate: CachedBatch) -> None:
        """A retry of a recent batch: answered with the original's offset once
        the original is durable (its change comes first, and this one checks
        the log end reached past it), storing nothing."""
        log = self._log
        if duplicate.base_offset < 0:  # kept for a transactional batch: none here
            raise BatchRefused(f"{log.name}: producer {item.header.producer_id} sequence "
                               f"{duplicate.first_seq}..{duplicate.last_seq} was not stored")
        change = log.writer.begin()
        change.fence(log.sql.landed, log.log_id, log.leader_epoch,
                     duplicate.base_offset + item.header.record_count,
                     refused=lambda: _FenceMiss(f"{log.name}: the original batch did not land"))
        self._submit(change, item.appended,
                     AppendResult(duplicate.base_offset, -1, log.log_start_offset))

    def _submit(self, change: PgChange, appended: asyncio.Future[AppendResult],
                result: AppendResult, settle: Callable[[], None] | None = None) -> None:
        """Queue ``change``; answer ``appended`` once written (``settle``
        runs first, either way: after the change's durable callbacks)."""
        self._in_flight += 1
        done = self._log.writer.commit(change)

        def on_written(fut: asyncio.Future[None]) -> None:
            self._in_flight -= 1
            if settle is not None:
                settle()
            error = StorageError("write cancelled") if fut.cancelled() else fut.exception()
            if error is None:
                if not appended.done():
                    appended.set_result(result)
            else:
                self._failures += 1
                self._doubt = True
                if isinstance(error, _FenceMiss):
                    self._fence_misses.append(appended)
                elif not appended.done():
                    appended.set_exception(error)
            if self._doubt:
                self._maybe_reread()

        done.add_done_callback(on_written)

    # ------------------------------------------------------------ in doubt
    def _maybe_reread(self) -> None:
        if self._doubt and self._in_flight == 0 and self._rereading is None:
            self._rereading = asyncio.get_running_loop().create_task(
                self._reread(), name=f"reread-{self._log.name}")

    async def _reread(self) -> None:
        """Reread the partition row and its producers (nothing in flight), then
        answer the appends the fence refused and go on."""
        log = self._log
        try:
            async with log.context.pool.acquire() as conn:
                row = await load_row(conn, log.sql, log.log_id, log.mean_batch_bytes)
                producers = await PgProducerRows.fetch(conn, log.sql, log.log_id)
        except Exception as exc:  # PostgreSQL unreachable: what waits fails, retriably
            self._rereading = None
            logger.warning("%s: cannot reread the partition: %s", log.name, exc)
            self._fail_waiting(StorageError(f"{log.name}: cannot reread the partition: {exc}"))
            return
        if row is None:
            log.release()  # its topic was deleted
        elif row.leader_epoch != log.leader_epoch:
            log.fenced = True
        else:
            log.reset_from(row)
            log.producer_rows.loaded = producers.loaded
            log.producer_states.load()
        self._doubt = False
        self._rereading = None
        error: TabletError | StorageError
        if log.deleted:
            error = UnknownPartition(f"partition {log.name} was deleted")
        elif log.fenced:
            error = NotLeader(
                f"{log.name}: not written: another gateway claimed the partition (leader "
                f"epoch {row.leader_epoch if row else '?'}; this gateway's was "
                f"{log.leader_epoch})")
        else:
            error = StorageError(f"{log.name}: not written: an earlier write did not land; "
                                 "retry")
        misses, self._fence_misses = self._fence_misses, []
        for future in misses:
            if not future.done():
                future.set_exception(error)
        self._drain()

    def _fail_waiting(self, error: StorageError) -> None:
        misses, self._fence_misses = self._fence_misses, []
        waiting = [item.appended for item in self._queue if item.checked.done()]
        for item in self._queue:
            if item.checked.done() and item.sink is not None:
                item.sink.settled()
        self._queue = deque(item for item in self._queue if not item.checked.done())
        for future in [*misses, *waiting]:
            if not future.done():
                future.set_exception(error)

