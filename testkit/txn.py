"""A transaction coordinator over a real storage engine, for the txn tests.

    run(tmp_path, first, after_restart, clock=Clock())

runs each phase on a freshly opened StorageEngine and TransactionCoordinator
over the same data directory (topics ``a`` and ``b``, 2 partitions each), so
a test can close and reopen the store between phases as a restart would.

    held = HeldChecks.install(tablet)   # its worker-thread record checks wait
    ...; held.release()                 # until the test lets them run
    txns.writer = HeldWrites(txns.writer)   # likewise the coordinator's writes
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Any

from tablets import StorageEngine, keys
from tablets import batch as batch_header
from tablets.consumer_offsets import ConsumerOffsets
from tablets.seam import AtomicChange, ChangeWriter
from tablets.tablet import PartitionTablet
from testkit.batches import decode_batches, make_batch
from testkit.compaction import as_batches
from txn import TransactionCoordinator, TxnSettings, TxnState
from txn.pending_offsets import PendingOffsets


class HeldChecks(Executor):
    """A tablet's validators executor whose record checks (compressed or large
    batches) run only when the test calls ``release``: what happens meanwhile
    is the race a slow check opens, made deterministic."""

    def __init__(self) -> None:
        self.held: list[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]] = []

    @classmethod
    def install(cls, tablet: PartitionTablet) -> HeldChecks:
        held = cls()
        tablet.validators = held
        return held

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        assert not kwargs
        future: Future[Any] = Future()
        self.held.append((future, fn, args))
        return future

    def release(self) -> int:
        """Run every held check now (on this thread); returns how many."""
        held, self.held = self.held, []
        for future, fn, args in held:
            try:
                future.set_result(fn(*args))
            except Exception as exc:
                future.set_exception(exc)
        return len(held)


class HeldWrites:
    """Stands for the coordinator's writer (``txns.writer = HeldWrites(...)``):
    its writes reach the store only when the test calls ``release``."""

    def __init__(self, writer: ChangeWriter) -> None:
        self.writer = writer
        self.held: list[tuple[AtomicChange, asyncio.Future[None]]] = []

    def begin(self) -> AtomicChange:
        return self.writer.begin()

    def commit(self, change: AtomicChange) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.held.append((change, future))
        return future

    async def release(self) -> int:
        """Write every held change, in order; returns how many."""
        held, self.held = self.held, []
        for ops, future in held:
            await self.writer.commit(ops)
            if not future.done():  # as the writer's: a cancelled waiter is skipped
                future.set_result(None)
        return len(held)


TID = "tx"
GROUP = "g"
TIMEOUT_MS = 60_000
PARTITIONS = [("a", 0), ("a", 1), ("b", 0), ("b", 1)]


class Clock:
    """Milliseconds that move only when a test moves them."""

    def __init__(self) -> None:
        self.now = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now


@dataclass
class Env:
    engine: StorageEngine
    txns: TransactionCoordinator
    clock: Clock
    newest: list[int]  # newest connection id, as the server would report it
    seqs: dict[tuple[int, str, int], int] = field(default_factory=dict)

    @property
    def offsets(self) -> ConsumerOffsets:
        assert self.engine.consumer_offsets is not None
        return self.engine.consumer_offsets

    @property
    def pending_offsets(self) -> PendingOffsets:
        """Offsets open transactions staged (OffsetFetch's require_stable)."""
        return self.txns.pending_offsets

    def connect(self) -> int:
        """A new client connection: the newest id."""
        self.newest[0] += 1
        return self.newest[0]

    async def produce(self, pid: int, epoch: int, tp: tuple[str, int], values: list[bytes],
                      connection: int = -1, seq: int | None = None, tid: str = TID) -> int:
        """A transactional batch of ``tid`` through the coordinator's sink: its
        base offset. Sequences continue per producer and partition unless
        ``seq`` is given."""
        key = (pid, *tp)
        first = self.seqs.get(key, 0) if seq is None else seq
        batch = make_batch(values, producer_id=pid, producer_epoch=epoch, base_sequence=first,
                           attributes=batch_header.ATTR_TRANSACTIONAL)
        sink = self.txns.sink_for(tid, pid, epoch, *tp, connection)
        result = await self.engine.partition(*tp).append(batch, self.clock(), sink)
        self.seqs[key] = max(self.seqs.get(key, 0), first + len(values))
        return result.base_offset

    async def begin(self, pid: int, epoch: int, partitions: list[tuple[str, int]] = PARTITIONS,
                    group: str | None = None, connection: int = -1, tid: str = TID) -> None:
        await self.txns.add_partitions(tid, pid, epoch, partitions, connection)
        if group is not None:
            await self.txns.add_offsets(tid, pid, epoch, group, connection)

    def blobs(self) -> list[bytes]:
        """Every pending transactional batch's key in the store (a commit
        moves them into the log, an abort deletes them)."""
        return [k for k, _ in self.engine.store.scan(keys.TXN_BLOB, keys.prefix_end(keys.TXN_BLOB))]

    def stored_bytes(self, tp: tuple[str, int]) -> int:
        """Bytes of batches a partition's segment files hold live (its log's
        and its pending transactions')."""
        return sum(f.live for f in self.engine.partition(*tp).files.files.values())

    async def log(self, tp: tuple[str, int]) -> list[tuple[int, bool, int]]:
        """(base offset, is control, record count) of every batch in a partition,
        each CRC-checked."""
        tablet = self.engine.partition(*tp)
        read = await tablet.read(tablet.log_start_offset, 1 << 30)
        out = []
        for data in as_batches(read.batches):
            [header] = batch_header.parse_batches(data)
            out.append((batch_header.base_offset_of(data), header.is_control, header.record_count))
        return out

    async def record_values(self, tp: tuple[str, int]) -> list[tuple[int, bytes]]:
        """(offset, value) of every data record of a partition."""
        read = await self.engine.partition(*tp).read(0, 1 << 30)
        out: list[tuple[int, bytes]] = []
        for batch in as_batches(read.batches):
            values = batch_values(batch)
            if values is not None:
                out.extend(enumerate(values, batch_header.base_offset_of(batch)))
        return out

    def assert_aborted(self, tid: str, tp: tuple[str, int] = ("a", 0)) -> None:
        """The transaction aborted and its blobs in ``tp`` are gone."""
        meta = self.txns.describe(tid)
        assert meta.state is TxnState.COMPLETE_ABORT
        start, end = keys.blob_range(self.engine.partition(*tp).prefix, meta.instance)
        assert not [key for key in self.blobs() if start <= key < end]


Phase = Callable[[Env], Awaitable[None]]


def run(tmp_path, *phases: Phase, settings: TxnSettings | None = None,
        clock: Clock | None = None) -> None:
    """Each phase on a freshly opened engine and coordinator over the same data."""
    clock = clock or Clock()

    async def main() -> None:
        for phase in phases:
            engine = StorageEngine(str(tmp_path / "data"))
            engine.start(asyncio.get_running_loop())
            newest = [-1]
            txns = TransactionCoordinator(engine, settings or TxnSettings(), clock,
                                          lambda newest=newest: newest[0])
            try:
                if not engine.topics:
                    for topic in ("a", "b"):
                        await engine.create_topic(topic, 2, {})
                txns.load()
                await asyncio.wait_for(phase(Env(engine, txns, clock, newest)), 60)
            finally:
                engine.close()

    asyncio.run(main())


def batch_values(batch: bytes) -> list[bytes] | None:
    """The values of a batch, in any codec (None for a control batch)."""
    if batch_header.parse_batches(batch)[0].is_control:
        return None
    [decoded] = decode_batches(batch)
    return [record["value"] for record in decoded["records"]]
