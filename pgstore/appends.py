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

The leader is the only writer of its appends, so offsets taken on the
event loop are right as long as every change before lands and no commit
of another gateway publishes into the partition meanwhile (it takes its
offsets from the row, under its lock: ``pgstore.txn_storage``). When a
change does not land (refused, failed, or its outcome unknown because the
connection broke during the commit), or such a commit moved the row's log
end, the changes after it find the log end moved and are refused by the
fence, so nothing lands out of order and no offset is given twice; an
append refused so was not written, and takes new offsets after the reread
(up to ``MAX_REASSIGN`` times, then it fails retriably). The log is then *in doubt*: no offsets are
assigned until every change in flight has settled and the partition row (and
its producers) has been reread; the appends queued meanwhile then go on from
the row's log end. A reread that finds another epoch fences the partition:
this append and every later one fail with ``NotLeader``
(NOT_LEADER_OR_FOLLOWER), and nothing of them is stored.

A transactional batch takes the same queue, then goes to its transaction
instead of the log (``pending_appends``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
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
from tablets.producer_rules import CachedBatch, next_seq
from tablets.seam import AppendResult, BlobSink

from . import pending_appends
from .append_items import FenceMiss, Item
from .log_sql import load_row
from .producer_rows import PgProducerRows

if TYPE_CHECKING:

    from .log_state import LogState
    from .writer import PgChange

logger = logging.getLogger(__name__)

RECENT_BATCHES = 64  # the mean batch size (reads' bound) is over about this many
# An append the fence refused because the row's log end moved under it
# (another gateway's commit published into the partition meanwhile) was not
# written: it takes new offsets after the reread, up to this many times
# (each one reread of the row), before it fails (retriably).
MAX_REASSIGN = 32


class PgAppends:
    def __init__(self, log: LogState) -> None:
        self._log = log
        self.log = log  # for ``pending_appends``
        self._queue: deque[Item] = deque()
        self._in_flight = 0  # changes queued in the writer, not yet settled
        self._doubt = False  # a change failed: reread the row before assigning offsets
        self._rereading: asyncio.Task[None] | None = None
        self._fence_misses: list[asyncio.Future[AppendResult]] = []  # answered after the reread
        self._again: list[Item] = []  # assigned again after the reread
        self.reassigned = 0  # appends assigned again so far (statistics, tests)
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
        self._queue.append(Item(checked, appended, view, header, settings, now_ms, sink))
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
                        pending_appends.assign(self, item, item.sink)
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

    def _assign(self, item: Item) -> None:
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
        base = item.base = log.log_end_offset
        data = batch_header.stamp(item.view, header, base, log.batch_epoch)
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
                     refused=lambda: FenceMiss(f"{log.name}: the partition row moved"))
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
        self.submit(change, item.appended,
                     AppendResult(base, append_time, log.log_start_offset), again=item)

    def _answer_retry(self, item: Item, duplicate: CachedBatch) -> None:
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
                     refused=lambda: FenceMiss(f"{log.name}: the original batch did not land"))
        self.submit(change, item.appended,
                     AppendResult(duplicate.base_offset, -1, log.log_start_offset))

    def submit(self, change: PgChange, appended: asyncio.Future[AppendResult],
                result: AppendResult, settle: Callable[[], None] | None = None, *,
                again: Item | None = None) -> None:
        """Queue ``change``; answer ``appended`` once written (``settle``
        runs first, either way: after the change's durable callbacks).
        ``again``: the append to assign again if the fence refuses it."""
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
                if (isinstance(error, FenceMiss) and again is not None
                        and again.reassigned < MAX_REASSIGN and not appended.done()):
                    again.reassigned += 1
                    self.reassigned += 1
                    self._again.append(again)
                elif isinstance(error, FenceMiss):
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
        again, self._again = sorted(self._again, key=lambda item: item.base), []
        if log.deleted or log.fenced:
            misses += [item.appended for item in again]
        else:  # not written: new offsets from the row, first, in their order
            self._queue.extendleft(reversed(again))
        for future in misses:
            if not future.done():
                future.set_exception(error)
        log.catch_up()  # a notice past the row read: once more
        self._drain()

    def _fail_waiting(self, error: StorageError) -> None:
        misses, self._fence_misses = self._fence_misses, []
        misses += [item.appended for item in self._again]
        self._again = []
        waiting = [item.appended for item in self._queue if item.checked.done()]
        for item in self._queue:
            if item.checked.done() and item.sink is not None:
                item.sink.settled()
        self._queue = deque(item for item in self._queue if not item.checked.done())
        for future in [*misses, *waiting]:
            if not future.done():
                future.set_exception(error)

