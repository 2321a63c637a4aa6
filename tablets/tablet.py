"""PartitionTablet: one topic partition's log: record bytes in segment files,
indexed by keys in RocksDB. The tablet owns the partition's state, its
loading at start-up (``recovery``) and its meta record; the work on that
state is done by collaborators it holds.

State in memory (rebuilt from the store at start-up):

- ``log_start_offset``  first offset still readable (retention, DeleteRecords);
- ``log_end_offset``    next offset to assign (appends take offsets from here,
  in the order they arrive);
- ``high_watermark``    end of what is in the WAL; readers see nothing above
  it. Writes complete in submission order, so it only moves forward;
- the *tail*: the newest batches as bytes, so consumers at the head of the log
  are served without touching RocksDB (as many as its share of the node's
  budget holds: the newest one only unless the partition was read in the
  last minute, ``tablets.tail_budget``);
- the time index: (base offset, running max timestamp) each time the running
  max grows, for ListOffsets by timestamp and time-based retention;
- ``pending``: the open transactions' batches (blob key -> file entry);
- the log's virtual segments (``segments``: where Kafka would roll files),
  idempotent producers' states (``producers``), the segment files (``files``).

The collaborators, each given the tablet as a narrow Protocol of the state it
reads and writes:

- ``tablet.appends`` (``appends``): Produce: records checked, offsets taken
  in arrival order, the batch stored and acknowledged once in the WAL;
  transactional batches kept as pending blobs. The tablet's ``append`` is
  its method, bound once;
- ``tablet.reads`` (``log_reads``): Fetch (which never parses records),
  long-polls, lookups by timestamp;
- ``tablet.truncation`` (``truncation``): retention, DeleteRecords, idle
  producers' expiry;
- ``tablet.compaction`` (``compacted_log``): when a run is due, swapping its
  chunks in;
- ``tablet.transactions`` (``txn_log``): a commit's part of the log, aborts.

Compaction and truncation change the log below its head, one at a time
(``log_lock``). The tablet keeps the seam's ``PartitionLog`` methods,
delegating.
"""

from __future__ import annotations

import asyncio
import struct
from array import array
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TYPE_CHECKING

from . import keys
from .appends import Appends
from .compacted_log import CompactedLog
from .in_memory_batches import InMemoryBatches
from .log_reads import LogReads
from .producers import producer_states
from .recovery import load_state
from .rocks_store import Ops, RocksStore
from .seam import ReadResult
from .segment_files import PartitionFiles
from .segment_rules import Segment
from .segments import stored_segments
from .store import GroupCommitWriter
from .tablet_settings import TabletSettings
from .truncation import TruncatedLog
from .txn_log import TransactionLog

if TYPE_CHECKING:
    from uuid import UUID

    from .tail_budget import TailBudget

# log start offset, log end offset, bytes stored, where the next compaction
# starts, and the active segment (base offset, size, first and largest timestamps).
_META = struct.Struct(">qqqqqqqq")


class PartitionTablet:
    def __init__(
        self,
        store: RocksStore,
        writer: GroupCommitWriter,
        validators: Executor,
        topic_id: UUID,
        partition: int,
        settings: Callable[[], TabletSettings],
        tail_budget: TailBudget,
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
        self.tail_budget = tail_budget  # its share: 0 (the newest batch) until read
        self.reads = LogReads(store, self.files, self, tail_budget.share(self))
        self.producers = producer_states(store, self.prefix, settings().max_producers)
        self.segments = stored_segments(store, self.prefix)
        self.clean_end = 0  # where the next compaction's dirty section starts
        # Truncation and compaction swaps change the log below the head one
        # at a time.
        self.log_lock = asyncio.Lock()
        # Collaborators, each seeing the tablet as the narrow Protocol of the
        # state it reads and writes.
        self.truncation = TruncatedLog(self)  # retention, DeleteRecords, producers' expiry
        self.compaction = CompactedLog(self)  # when a run is due; swapping chunks in
        self.transactions = TransactionLog(self)  # a commit's part of the log, aborts
        self.appends = Appends(self)  # produce: checked, offsets taken, stored
        # The seam's PartitionLog.append, bound once: no delegating call per batch.
        self.append = self.appends.append

    # ------------------------------------------------------------------ load
    def load(self, migrate: bool = False) -> None:
        """Rebuild the in-memory state from the store (start-up); with
        ``migrate``, move a format-1 log into segment files first."""
        raw = self.store.get(self.meta_key)
        if raw is not None:
            (self.log_start_offset, self.log_end_offset, self.size_bytes, self.clean_end,
             *active) = _META.unpack(raw)
            self.segments.load(Segment(*active))
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
        self.tail_budget.read(self)
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
