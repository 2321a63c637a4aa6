"""A transactional batch's append on the PostgreSQL store (for
``pgstore.appends.PgAppends``, in its arrival order): stored once as a
pending row of its transaction (``PgTransactionStorage.stage_pending``),
nothing in the log, through the node's writer like every append.

The ``BlobSink`` contract (``tablets.seam``), as the RocksDB engine keeps it
(``tablets/appends.py``): ``next_key`` first (a batch whose transaction
ended stores nothing, not even its sequence), ``admit`` before anything is
staged, ``added`` once the pending row is durable, ``settled`` exactly once
either way (the transaction's commit waits for it). The producer's sequence
is staged in the same change, with the lowest offset the commit can give
the batch; a retry is answered once the original's pending row is there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from tablets import batch as batch_header
from tablets.errors import BatchRefused, NotLeader, TabletError
from tablets.producer_rules import REFUSED, CachedBatch, next_seq
from tablets.seam import AppendResult, BlobSink

from .append_items import FenceMiss, Item
from .remote_txn import RemotePendingSink
from .txn_publication import log_ref_of

if TYPE_CHECKING:
    from .log_state import LogState
    from .writer import PgChange

# A batch header's producer id, epoch and base sequence (bytes 43 to 56).
_PRODUCER_IDENTITY = slice(43, 57)


class PgAppends(Protocol):
    """What of ``pgstore.appends.PgAppends`` this uses."""

    @property
    def log(self) -> LogState: ...

    def submit(self, change: PgChange, appended: asyncio.Future[AppendResult],
               result: AppendResult, settle: Callable[[], None] | None = None) -> None: ...


def assign(appends: PgAppends, item: Item, sink: BlobSink) -> None:
    """A transactional batch: stored once as a pending row of its
    transaction (``PgTransactionStorage.stage_pending``), nothing in the
    log; its transaction learns of it (``added``) once it is durable,
    and settles it either way. When it raises (a TabletError, or the
    transaction's own error: it ended), nothing was staged and the caller
    settles it."""
    log = appends.log
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
            _answer_retry(appends, item, duplicate, sink, ref)
            return
        cached = CachedBatch(first, last, -1)
    settings = item.settings
    data = batch_header.stamp(item.view, header, 0, log.batch_epoch)
    max_timestamp = item.checked.result()
    if settings.log_append_time:
        data = batch_header.set_max_timestamp(data, item.now_ms, log_append_time=True)
    elif max_timestamp != header.max_timestamp:
        data = batch_header.set_max_timestamp(data, max_timestamp)
    try:
        sink.admit(len(data))
    except TabletError as exc:
        _refuse(appends, item, exc, cached, sink)
        return
    # Where the commit puts it at the earliest (the transaction's batches
    # of this partition go in order at the log end, which only grows):
    # kept for a retry, answered if the topic opts in.
    bound = log.log_end_offset + sink.pending_records(log_ref)
    change = log.writer.begin()
    if isinstance(sink, RemotePendingSink):  # a transaction another gateway coordinates
        stored = sink.stage(change, log, ref, data)  # type: ignore[arg-type]
    else:  # the coordinator's own: fenced by its slot too (``txn_slots.fence_pending``)
        transactional_id: str | None = getattr(sink, "transactional_id", None)
        stored = log.context.pending.stage_pending(change, log, ref, data,  # type: ignore[arg-type]
                                                   transactional_id)
    if cached is not None:
        log.producer_states.stage(header.producer_id, header.producer_epoch,
                                  CachedBatch(cached.first_seq, cached.last_seq, bound),
                                  item.now_ms, change)
    change.on_durable(lambda: sink.added(ref, stored))
    append_time = item.now_ms if settings.log_append_time else -1
    offset = bound if settings.txn_offset_lower_bound else -1
    appends.submit(change, item.appended,
                   AppendResult(offset, append_time, log.log_start_offset), sink.settled)


def _answer_retry(appends: PgAppends, item: Item, duplicate: CachedBatch, sink: BlobSink,
                  ref: bytes) -> None:
    """A retry of a recent transactional batch: answered once the original
    is durable, if its pending row is there (the producer's id, epoch and
    first sequence in its header), storing nothing."""
    log = appends.log
    if duplicate.base_offset == REFUSED:
        raise BatchRefused(f"{log.name}: producer {item.header.producer_id} sequence "
                           f"{duplicate.first_seq}..{duplicate.last_seq} was refused "
                           "before; nothing of it is stored")
    instance = int.from_bytes(ref[8:16], "big", signed=True)
    identity = bytes(item.view[_PRODUCER_IDENTITY])
    change = log.writer.begin()
    change.fence(log.sql.pending_landed, log.log_id, log.leader_epoch, instance, identity,
                 refused=lambda: FenceMiss(f"{log.name}: the original batch did not land"))
    offset = duplicate.base_offset if item.settings.txn_offset_lower_bound else -1
    appends.submit(change, item.appended, AppendResult(offset, -1, log.log_start_offset),
                   sink.settled)


def _refuse(appends: PgAppends, item: Item, error: TabletError, cached: CachedBatch | None,
            sink: BlobSink) -> None:
    """The transaction refuses the batch (a limit; it is abort-only now):
    nothing of it is stored, but its sequence numbers are kept
    (``producer_rules.REFUSED``), so the producer's next batch may follow
    them or use them again, and a retry is never answered as stored."""
    log = appends.log
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
