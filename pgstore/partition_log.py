"""One partition's log on PostgreSQL: the seam's ``PartitionLog``.

The leader (this gateway, at the leader epoch it claimed at start-up) keeps
the partition's state in memory, as the RocksDB engine's tablet does:

- ``log_start_offset``: the first offset still readable (retention,
  DeleteRecords);
- ``log_end_offset``: the next offset to assign. Appends take offsets here,
  on the event loop, in arrival order (``appends``): the leader is the only
  writer, and the epoch fence in every append's change makes that safe;
- ``high_watermark``: the end of what PostgreSQL has committed; readers see
  nothing above it, and long-polls (``waiter``) wake when it moves;
- the *tail*: the newest durable batches as bytes, so consumers at the head
  of the log never touch PostgreSQL (``tablets.in_memory_batches``, as the
  RocksDB engine's; its share of the node's budget, ``tail_share``, is 0, the
  newest batch only, unless the partition was read in the last minute:
  ``tablets.tail_budget``); below it, one query (``pgstore.batch_log``'s read);
- the idempotent producers' states (``tablets.producer_rules``, persisted in
  ``producers`` in each append's change, ``producer_rows``).

Transactions (``pgstore.txn_storage``, through ``TxnPartition``, which this
log implements): a transactional batch is appended to its transaction, not
to the log (``appends``: its bytes once, as a pending row, in the append's
change, fenced by the leader epoch); the commit publishes the transaction's
batches and its COMMIT marker at the log end, taking offsets here
(``reserve``) as an append does, and moves the high watermark once durable
(``published``); an abort deletes them. Nothing uncommitted or aborted is
ever in the log, so the last stable offset is the high watermark and a
Fetch's aborted transactions are always none, as on the embedded store.

Lookups by time use the ``batches_by_time`` index; retention and
DeleteRecords (``truncation``) delete whole batches below the new log start,
with their bytes, in one change fenced by the leader epoch.

A partition whose epoch moved (another gateway claimed it) is *fenced*:
every write then fails with ``NotLeader`` (NOT_LEADER_OR_FOLLOWER), and
nothing of it is stored.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from uuid import UUID

from tablets import batch as batch_header
from tablets.errors import NotLeader, OffsetOutOfRange, UnknownPartition
from tablets.in_memory_batches import InMemoryBatches
from tablets.producer_rules import ProducerStates
from tablets.records import first_record_at_or_after
from tablets.seam import LEADER_EPOCH, AppendResult, BlobSink, ReadResult

from .appends import PgAppends
from .batch_log import _INT64, read_cap
from .log_state import LogContext
from .producer_rows import PgProducerRows
from .truncation import Truncation

if TYPE_CHECKING:
    from tablets.tablet_settings import TabletSettings
    from tablets.tail_budget import TailBudget

    from .log_notices import LogEnd
    from .log_sql import LogRow
    from .writer import PgChange


class PgPartitionLog:
    def __init__(self, context: LogContext, topic_id: UUID, partition: int, topic_name: str,
                 row: LogRow, settings: Callable[[], TabletSettings],
                 producers: PgProducerRows, tail_budget: TailBudget) -> None:
        self.context = context
        self.writer = context.writer
        self.sql = context.sql
        self.validators = context.validators
        self._topic_id = topic_id
        self._partition = partition
        self._name = f"{topic_name}-{partition}"
        self.settings = settings
        self.log_id = row.log_id
        self.leader_epoch = row.leader_epoch  # the one this node claimed
        self.log_start_offset = row.log_start_offset
        self.log_end_offset = row.log_end_offset
        self.high_watermark = row.log_end_offset  # every row read is committed
        self.size_bytes = row.size_bytes
        self.running_max_timestamp = row.running_max_timestamp
        self.mean_batch_bytes = row.mean_batch_bytes
        self.deleted = False
        self.fenced = False  # another gateway claimed it
        self.tail = InMemoryBatches()
        self.tail_end = row.log_end_offset  # the tail holds [its first, tail_end)
        self.tail_budget = tail_budget
        self.tail_share = tail_budget.share(self)  # its share: 0 (the newest batch) until read
        self._waiters: set[asyncio.Future[None]] = set()
        # The largest log end other changes announced (``noticed``), and how
        # many notices moved this log at once.
        self.noticed_end = row.log_end_offset
        self.notices_applied = 0
        self.producer_rows = producers
        self.producer_states: ProducerStates[PgChange] = ProducerStates(
            producers, settings().max_producers)
        self.producer_states.load()
        self.appends = PgAppends(self)
        self.truncation = Truncation(self)

    # ------------------------------------------------------------ identity
    @property
    def topic_id(self) -> UUID:
        return self._topic_id

    @property
    def partition(self) -> int:
        return self._partition

    @property
    def name(self) -> str:
        return self._name

    @property
    def last_stable_offset(self) -> int:
        # Open transactions' batches are not in the log (they are pending
        # rows until their commit publishes them): everything below the high
        # watermark is stable.
        return self.high_watermark

    @property
    def producers(self) -> ProducerStates[PgChange]:
        return self.producer_states

    def check_writable(self) -> None:
        if self.deleted:
            raise UnknownPartition(f"partition {self._name} was deleted")
        if self.fenced:
            raise NotLeader(f"{self._name}: this gateway no longer leads the partition "
                            f"(its leader epoch {self.leader_epoch} moved)")

    # ------------------------------------------------------------- append
    def append(self, records: bytes | memoryview, now_ms: int,
               sink: BlobSink | None = None) -> asyncio.Future[AppendResult]:
        """Append one checked batch; resolves once PostgreSQL committed it."""
        return self.appends.append(records, now_ms, sink)

    def append_durable(self, base_offset: int, end: int, data: bytes, in_order: bool) -> None:
        """A batch is durable: the high watermark moves to its end, and (when
        every batch before it is known durable) it joins the tail. A tail
        that does not end where the batch starts (a transaction's commit was
        published in between, its batches not held here) restarts with it.
        A batch below the high watermark (a notice moved it past: another
        gateway's commit landed after it) adds nothing: the tail must reach
        the high watermark."""
        if in_order and not self.deleted and end > self.high_watermark:
            if base_offset != self.tail_end:
                self.tail = InMemoryBatches()
            self.tail.append(base_offset, data)
            self.tail_end = end
            self.tail.trim(self.tail_share)
        self.advance_high_watermark(end)

    def advance_high_watermark(self, offset: int) -> None:
        if offset > self.high_watermark:
            self.high_watermark = offset
            if self.tail_end != offset:
                # The tail must reach the high watermark (reads at or past its
                # first offset are answered from it alone): it restarts empty.
                self.tail = InMemoryBatches()
                self.tail_end = offset
            self.wake_waiters()

    # ---------------------------------- pgstore.txn_publication.TxnPartition
    @property
    def batch_epoch(self) -> int:
        # Batches carry the epoch Metadata and Fetch answer: in a cluster the
        # partition's leader epoch (a batch a commit published, or one
        # written before a leader change, carries an older one: at the
        # leader, every epoch up to the current one ends at the high
        # watermark, so a Java consumer validating its position with the
        # epoch of the records it read never finds a divergence); alone, 0.
        return self.leader_epoch if self.context.batch_epochs else LEADER_EPOCH

    @property
    def publish_epoch(self) -> int | None:
        return None if self.fenced else self.leader_epoch

    def reserve(self, count: int) -> int | None:
        """Offsets for a commit's publication at the log end, taken in order
        with the appends'; None while the log is in doubt, or led by another
        gateway (this one's view of its end is stale): the database then
        assigns them from the partition row, under its lock."""
        if self.appends.in_doubt or self.fenced or self.deleted:
            return None
        base = self.log_end_offset
        self.log_end_offset += count
        return base

    def published(self, base: int, end: int, nbytes: int, max_timestamp: int) -> None:
        """A commit's batches and marker [base, end) are durable (a log led
        elsewhere is reread when it is opened: nothing to do)."""
        if self.deleted or self.fenced:
            return
        self.log_end_offset = max(self.log_end_offset, end)
        self.size_bytes += nbytes
        self.running_max_timestamp = max(self.running_max_timestamp, max_timestamp)
        self.advance_high_watermark(end)

    # ------------------------------------------- pgstore.log_notices.LogEnd
    def noticed(self, notice: LogEnd) -> None:
        """Another change (another gateway's commit, or this one's) added
        [base, end) to this log; the notice arrives after it committed.

        On the leader: a notice below the high watermark is old news (never
        moves anything back). One that starts at this gateway's log end
        (every offset it assigned landed before it) moves the log end and
        the high watermark there at once: the tail restarts empty at the new
        end (the batches are read from PostgreSQL) and waiting long-polls
        wake. One that starts below (it overlaps offsets this gateway
        assigned) is either this gateway's own commit, published when
        durable, or one that took the offsets of appends in flight, which
        the fence refuses, so the row is reread. One that starts above (a
        notice missed) or arrives while the log is in doubt: the row is
        reread (``catch_up`` checks after each reread that it reached the
        notice). A log led elsewhere only remembers the end, for when it
        is opened."""
        self.noticed_end = max(self.noticed_end, notice.end)
        if self.deleted or self.fenced or notice.end <= self.high_watermark:
            return
        if self.appends.in_doubt:
            return  # the reread under way, then catch_up
        if notice.base == self.log_end_offset:
            self.log_end_offset = notice.end
            self.size_bytes += notice.nbytes
            self.running_max_timestamp = max(self.running_max_timestamp,
                                             notice.max_timestamp)
            self.notices_applied += 1
            self.advance_high_watermark(notice.end)
        elif notice.base > self.log_end_offset:
            self.appends.doubt()

    def catch_up(self) -> None:
        """After the row was (re)read as the truth: a notice heard meanwhile
        past what was read makes it read once more (at most once per
        notice: the reread then runs after that commit)."""
        if self.noticed_end > self.log_end_offset and not self.fenced and not self.deleted:
            self.noticed_end = self.log_end_offset
            self.appends.doubt()

    def resynced(self, row_end: int) -> None:
        """The row's log end as a resync read it (the listener reconnected:
        notices sent meanwhile are lost): past this gateway's, the row is
        reread."""
        self.noticed_end = max(self.noticed_end, row_end)
        if (not self.deleted and not self.fenced and not self.appends.in_doubt
                and row_end > self.log_end_offset):
            self.appends.doubt()

    def fence_epoch(self, change: PgChange, stopped: str = "") -> None:
        """Add to ``change`` the check that this gateway still leads the
        partition at its leader epoch (the row locked to the end); else the
        change writes nothing, the log is marked fenced and ``NotLeader``
        (``stopped``: what stops with it) is raised."""
        log_id, epoch = self.log_id, self.leader_epoch

        def refused() -> NotLeader:
            self.fenced = True
            return NotLeader(f"{self.name}: another gateway claimed the partition; this "
                             f"gateway's leader epoch {epoch} moved{stopped}")

        change.fence(self.sql.epoch_fence, log_id, epoch, refused=refused)

    def in_doubt(self) -> None:
        """A commit carrying offsets reserved here failed or its outcome is
        unknown: the partition row is reread before the next offsets."""
        self.appends.doubt()

    def reset_from(self, row: LogRow) -> None:
        """Take the row reread after a doubt as the truth (nothing is in flight)."""
        self.log_start_offset = max(self.log_start_offset, row.log_start_offset)
        self.log_end_offset = row.log_end_offset
        self.size_bytes = row.size_bytes
        self.running_max_timestamp = row.running_max_timestamp
        self.tail = InMemoryBatches()  # it may miss a batch whose outcome was unknown
        self.tail_end = row.log_end_offset
        self.high_watermark = row.log_end_offset
        self.wake_waiters()

    def set_tail_budget(self, nbytes: int) -> None:
        self.tail_share = nbytes
        self.tail.trim(nbytes)

    def release(self) -> None:
        """The topic is deleted: refuse every call, wake fetchers, free memory."""
        self.deleted = True
        self.tail = InMemoryBatches()
        self.wake_waiters()

    # --------------------------------------------------------------- read
    async def read(self, offset: int, max_bytes: int, min_one: bool = True) -> ReadResult:
        """Whole batches from the one holding ``offset``, up to ``max_bytes``
        (the first one whole with ``min_one``), none at or past the high
        watermark: from the tail, else with one query."""
        if self.deleted:
            raise UnknownPartition(f"partition {self._name} was deleted")
        self.tail_budget.read(self)
        hw, start = self.high_watermark, self.log_start_offset
        if offset < start or offset > self.log_end_offset:
            raise OffsetOutOfRange(f"offset {offset} is outside [{start}, {self.log_end_offset}]")
        if offset >= hw:
            return ReadResult([], hw, start)
        if offset >= self.tail.first_offset(default=hw):
            return ReadResult(self.tail.slice(offset, hw, max_bytes, min_one), hw, start)
        cap = read_cap(max_bytes, self.mean_batch_bytes)
        async with self.context.pool.acquire() as conn:
            rows = await conn.fetch(self.sql.read, self.log_id, offset, hw, max_bytes,
                                    min_one, cap)
        return ReadResult([_patched(row) for row in rows], hw, self.log_start_offset)

    # ---------------------------------------------------------- long-poll
    def waiter(self) -> asyncio.Future[None]:
        future = asyncio.get_running_loop().create_future()
        self._waiters.add(future)
        return future

    def forget_waiter(self, future: asyncio.Future[None]) -> None:
        self._waiters.discard(future)

    def wake_waiters(self) -> None:
        waiters, self._waiters = self._waiters, set()
        for future in waiters:
            if not future.done():
                future.set_result(None)

    # ---------------------------------------------------- offsets by time
    async def offset_for_timestamp(self, target: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record stamped at or after ``target``."""
        hw = self.high_watermark
        async with self.context.pool.acquire() as conn:
            first = await conn.fetchval(self.sql.first_at_time, self.log_id, target)
            if first is None:
                return None
            offset = max(int(first), self.log_start_offset)
            while offset < hw:
                row = await conn.fetchrow(self.sql.batch_from, self.log_id, offset, hw, target)
                if row is None:
                    return None
                data = _patched(row)
                found = first_record_at_or_after(data, target, self.log_start_offset)
                if found is not None:
                    return found
                offset = batch_header.last_offset_of(data) + 1
        return None

    async def max_timestamp(self) -> tuple[int, int] | None:
        """(offset, timestamp) of the record with the largest timestamp."""
        if self.running_max_timestamp < 0 or self.high_watermark == self.log_start_offset:
            return None
        return await self.offset_for_timestamp(self.running_max_timestamp)

    # ------------------------------------------------------------ truncation
    async def delete_records(self, before: int) -> int:
        """DeleteRecords: the new log start offset (-1: the high watermark)."""
        return await self.truncation.delete_records(before)


def _patched(row: Any) -> bytes:
    """A stored batch, its base offset patched when the bytes carry another."""
    data: bytes = row["data"]
    if row["shifted"]:
        data = _INT64.pack(row["base_offset"]) + data[8:]
    return data
