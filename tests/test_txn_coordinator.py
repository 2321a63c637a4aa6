"""The transaction coordinator (txn.TransactionCoordinator) over a real
StorageEngine: producer ids and epochs, one-write commits, aborts, pending
offsets, the offset-range conflict check, the KAFKA-17754 guard, timeouts
(on a fake clock) and recovery after the engine is closed and reopened."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from kafka_gateway.codec import read_uvarint
from tablets import StorageEngine, keys, log_entry
from tablets import batch as rb
from tablets.consumer_offsets import OffsetCommit
from tablets.records import record_timestamps
from testkit.batches import make_batch
from txn import TransactionCoordinator, TxnSettings, TxnState
from txn.coordinator import EPOCH_EXHAUSTED
from txn.errors import (
    InvalidProducerIdMapping,
    InvalidTransactionTimeout,
    InvalidTxnState,
    ProducerFenced,
    TransactionalIdNotFound,
    TxnConflict,
)

TID = "tx"
GROUP = "g"
TIMEOUT_MS = 60_000
PARTITIONS = [("a", 0), ("a", 1), ("b", 0), ("b", 1)]


class Clock:
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
    def offsets(self):
        return self.engine.consumer_offsets

    def connect(self) -> int:
        self.newest[0] += 1
        return self.newest[0]

    async def produce(self, pid: int, epoch: int, tp: tuple[str, int], values: list[bytes],
                      connection: int = -1, seq: int | None = None) -> int:
        """A transactional batch through the coordinator's sink: its base offset."""
        key = (pid, *tp)
        first = self.seqs.get(key, 0) if seq is None else seq
        batch = make_batch(values, producer_id=pid, producer_epoch=epoch, base_sequence=first,
                           attributes=rb.ATTR_TRANSACTIONAL)
        sink = self.txns.sink_for(pid, epoch, *tp, connection)
        result = await self.engine.partition(*tp).append(batch, self.clock(), sink)
        self.seqs[key] = max(self.seqs.get(key, 0), first + len(values))
        return result.base_offset

    async def begin(self, pid: int, epoch: int, partitions=PARTITIONS, group: str | None = None,
                    connection: int = -1, tid: str = TID) -> None:
        await self.txns.add_partitions(tid, pid, epoch, partitions, connection)
        if group is not None:
            await self.txns.add_offsets(tid, pid, epoch, group, connection)

    def blobs(self) -> list[bytes]:
        return [k for k, _ in self.engine.store.scan(keys.TXN_BLOB, keys.TXN_BLOB + b"\xff")]

    async def log(self, tp: tuple[str, int]) -> list[tuple[int, bool, int]]:
        """(base offset, is control, record count) of every batch in a partition,
        each CRC-checked."""
        tablet = self.engine.partition(*tp)
        read = await tablet.read(tablet.log_start_offset, 1 << 30)
        out = []
        for data in read.batches:
            [header] = rb.parse_batches(data)
            out.append((rb.base_offset_of(data), header.is_control, header.record_count))
        return out


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


# ------------------------------------------------------------ InitProducerId


def test_idempotent_producers_get_fresh_ids_forever(tmp_path):
    seen: list[int] = []

    async def phase(env: Env) -> None:
        for _ in range(3):
            pid, epoch = await env.txns.init_producer_id(None, 0)
            assert epoch == 0
            seen.append(pid)

    run(tmp_path, phase, phase)
    assert len(set(seen)) == 6 and seen == sorted(seen)


def test_transactional_init_bumps_the_epoch_and_fences_the_old_session(tmp_path):
    async def phase(env: Env) -> None:
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        assert epoch == 0
        assert await env.txns.init_producer_id(TID, TIMEOUT_MS) == (pid, 1)
        other, _ = await env.txns.init_producer_id("other", TIMEOUT_MS)
        idempotent, _ = await env.txns.init_producer_id(None, 0)
        assert len({pid, other, idempotent}) == 3
        with pytest.raises(ProducerFenced):
            await env.begin(pid, 0)
        with pytest.raises(InvalidProducerIdMapping):
            await env.begin(other, 0)  # another transactional id's producer
        await env.begin(pid, 1)
        assert env.txns.describe(TID).state is TxnState.ONGOING

    run(tmp_path, phase)


def test_init_aborts_the_open_transaction(tmp_path):
    async def phase(env: Env) -> None:
        pid, _ = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        await env.begin(pid, 0, group=GROUP)
        for tp in PARTITIONS:
            assert await env.produce(pid, 0, tp, [b"zombie"]) == -1
        await env.txns.txn_offset_commit(TID, pid, 0, GROUP, {("a", 0): OffsetCommit(5)})
        assert env.blobs() and env.offsets.is_pending(GROUP, "a", 0)
        assert await env.txns.init_producer_id(TID, TIMEOUT_MS) == (pid, 1)
        meta = env.txns.describe(TID)
        assert (meta.state, meta.epoch, env.txns.open_count) == (TxnState.EMPTY, 1, 0)
        assert env.blobs() == []
        assert not env.offsets.is_pending(GROUP, "a", 0)
        assert env.offsets.committed(GROUP, "a", 0) is None
        for tp in PARTITIONS:
            assert await env.log(tp) == []
        with pytest.raises(ProducerFenced):
            env.txns.sink_for(pid, 0, "a", 0)
        with pytest.raises(ProducerFenced):
            await env.txns.end_txn(TID, pid, 0, True)

    run(tmp_path, phase)


def test_kip_360_bump_retry_and_fencing(tmp_path):
    async def phase(env: Env) -> None:
        pid, _ = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        # The current session bumps its own epoch (after an abortable error).
        assert await env.txns.init_producer_id(TID, TIMEOUT_MS, pid, 0) == (pid, 1)
        # Its retry (it never saw the answer) gets the same answer, no new bump.
        assert await env.txns.init_producer_id(TID, TIMEOUT_MS, pid, 0) == (pid, 1)
        assert env.txns.describe(TID).epoch == 1
        assert await env.txns.init_producer_id(TID, TIMEOUT_MS, pid, 1) == (pid, 2)
        with pytest.raises(ProducerFenced):  # two bumps behind: a zombie
            await env.txns.init_producer_id(TID, TIMEOUT_MS, pid, 0)
        with pytest.raises(ProducerFenced):
            await env.txns.init_producer_id(TID, TIMEOUT_MS, pid + 100, 2)
        assert env.txns.describe(TID).epoch == 2

    run(tmp_path, phase)


def test_an_exhausted_epoch_moves_to_a_new_producer_id(tmp_path):
    async def phase(env: Env) -> None:
        pid, _ = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        env.txns.describe(TID).epoch = EPOCH_EXHAUSTED - 1
        assert await env.txns.init_producer_id(TID, TIMEOUT_MS) == (pid, EPOCH_EXHAUSTED)
        new_pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS, pid, EPOCH_EXHAUSTED)
        assert new_pid != pid and epoch == 0
        # A retry of that rotation, with the old id and its exhausted epoch.
        assert await env.txns.init_producer_id(
            TID, TIMEOUT_MS, pid, EPOCH_EXHAUSTED) == (new_pid, 0)
        with pytest.raises(InvalidProducerIdMapping):
            await env.begin(pid, EPOCH_EXHAUSTED)
        with pytest.raises(InvalidProducerIdMapping):
            env.txns.sink_for(pid, EPOCH_EXHAUSTED, "a", 0)
        await env.begin(new_pid, 0)
        assert await env.produce(new_pid, 0, ("a", 0), [b"x"]) == -1
        await env.txns.end_txn(TID, new_pid, 0, True)
        assert await env.log(("a", 0)) == [(0, False, 1), (1, True, 1)]

    run(tmp_path, phase)


def test_transaction_timeout_bounds(tmp_path):
    async def phase(env: Env) -> None:
        for bad in (0, -1, 900_001):
            with pytest.raises(InvalidTransactionTimeout):
                await env.txns.init_producer_id(TID, bad)
        assert TID not in env.txns.txns
        await env.txns.init_producer_id(TID, 900_000)
        assert env.txns.describe(TID).timeout_ms == 900_000
        with pytest.raises(InvalidTransactionTimeout):
            await env.txns.init_producer_id(TID, 900_001)
        assert env.txns.describe(TID).epoch == 0  # nothing changed
        assert await env.txns.init_producer_id(None, 0)  # no timeout check without an id

    run(tmp_path, phase)


# ------------------------------------------------------------------- commit


def test_commit_is_one_write_of_references_marker_offsets_and_state(tmp_path):
    async def phase(env: Env) -> None:
        await env.offsets.commit(GROUP, {("a", 0): OffsetCommit(3)}, env.clock())
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        await env.begin(pid, epoch, group=GROUP)
        for n, tp in enumerate(PARTITIONS):
            for k in range(2):
                assert await env.produce(pid, epoch, tp, [b"%d-%d-%d" % (n, k, i)
                                                         for i in range(k + 1)]) == -1
        await env.txns.txn_offset_commit(TID, pid, epoch, GROUP, {
            ("a", 0): OffsetCommit(10, 0, "m"), ("b", 1): OffsetCommit(7)})
        assert len(env.blobs()) == 8
        for tp in PARTITIONS:
            assert env.engine.partition(*tp).high_watermark == 0
            assert await env.log(tp) == []
        assert env.offsets.committed(GROUP, "a", 0).offset == 3
        assert env.offsets.is_pending(GROUP, "a", 0) and env.offsets.is_pending(GROUP, "b", 1)
        assert not env.offsets.is_pending(GROUP, "a", 1)

        stats = env.engine.store.stats
        changes, writes = stats.changes, stats.writes
        await env.txns.end_txn(TID, pid, epoch, True)
        assert (stats.changes - changes, stats.writes - writes) == (1, 1)

        meta = env.txns.describe(TID)
        assert meta.state is TxnState.COMPLETE_COMMIT and env.txns.open_count == 0
        assert env.txns.stats.commits == 1
        assert len(env.blobs()) == 8  # the log references them: never copied
        for tp in PARTITIONS:
            tablet = env.engine.partition(*tp)
            assert await env.log(tp) == [(0, False, 1), (1, False, 2), (3, True, 1)]
            assert tablet.high_watermark == tablet.last_stable_offset == 4
            assert [o for o, _ in await _record_values(env, tp)] == [0, 1, 2]
            entries = list(env.engine.store.scan(*_log_range(tablet)))
            assert [log_entry.is_reference(v) for _, v in entries] == [True, True, False]
        assert env.offsets.committed(GROUP, "a", 0).offset == 10
        assert env.offsets.committed(GROUP, "a", 0).metadata == "m"
        assert env.offsets.committed(GROUP, "b", 1).offset == 7
        assert not env.offsets.is_pending(GROUP, "a", 0)

    run(tmp_path, phase)


def _log_range(tablet) -> tuple[bytes, bytes]:
    start = keys.LOG + tablet.prefix
    return start, start + b"\xff" * 8


def test_committed_batches_keep_their_records_and_follow_earlier_data(tmp_path):
    async def first(env: Env) -> None:
        tablet = env.engine.partition("a", 0)
        await tablet.append(make_batch([b"plain-0", b"plain-1"]), env.clock())
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        await env.begin(pid, epoch, [("a", 0)])
        await env.produce(pid, epoch, ("a", 0), [b"t-0", b"t-1", b"t-2"])
        await tablet.append(make_batch([b"plain-2"]), env.clock())  # lands before the commit
        await env.produce(pid, epoch, ("a", 0), [b"t-3"])
        await env.txns.end_txn(TID, pid, epoch, True)
        assert await env.log(("a", 0)) == [(0, False, 2), (2, False, 1), (3, False, 3),
                                          (6, False, 1), (7, True, 1)]

    async def after_restart(env: Env) -> None:  # read through the store, not the tail
        read = await env.engine.partition("a", 0).read(0, 1 << 20)
        values = [_values(b) for b in read.batches]
        assert values == [[b"plain-0", b"plain-1"], [b"plain-2"], [b"t-0", b"t-1", b"t-2"],
                          [b"t-3"], None]
        assert [o for b in read.batches[:-1] for o, _ in record_timestamps(b)] == list(range(7))

    run(tmp_path, first, after_restart)


def _values(batch: bytes) -> list[bytes] | None:
    """The values of an uncompressed batch built by testkit (None for a marker)."""
    if rb.parse_batches(batch)[0].is_control:
        return None
    out, pos = [], rb.HEADER_SIZE

    def varint(at: int) -> tuple[int, int]:
        raw, at = read_uvarint(batch, at)
        return (raw >> 1) ^ -(raw & 1), at

    for _ in range(rb.record_count_of(batch)):
        length, pos = varint(pos)
        end = pos + length
        pos += 1  # attributes
        _, pos = varint(pos)  # timestamp delta
        _, pos = varint(pos)  # offset delta
        key_len, pos = varint(pos)
        pos += max(key_len, 0)
        value_len, pos = varint(pos)
        out.append(batch[pos:pos + value_len])
        pos = end
    return out


def test_commit_bytes_do_not_depend_on_the_transaction_size(tmp_path):
    written: dict[int, int] = {}

    async def phase(env: Env) -> None:
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        # A first commit indexes the batches' and the marker's timestamps: the
        # ones measured then add nothing to the time index.
        await env.begin(pid, epoch, group=GROUP)
        for tp in PARTITIONS:
            await env.produce(pid, epoch, tp, [b"warm-up"])
        await env.txns.end_txn(TID, pid, epoch, True)
        for size in (1 << 10, 1 << 20):  # 4 batches of 256 B, then of 256 KiB
            await env.begin(pid, epoch, group=GROUP)
            for tp in PARTITIONS:
                await env.produce(pid, epoch, tp, [b"v" * (size // 4 - 100)])
            before = env.engine.store.stats.bytes
            await env.txns.end_txn(TID, pid, epoch, True)
            written[size] = env.engine.store.stats.bytes - before

    run(tmp_path, phase, settings=TxnSettings(pending_memory_bytes=0))
    small, large = written[1 << 10], written[1 << 20]
    assert small < 2000 and abs(large - small) <= 16, written


def test_a_commit_held_out_of_memory_is_read_from_the_store(tmp_path):
    async def phase(env: Env) -> None:
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        await env.begin(pid, epoch, [("a", 0)])
        await env.produce(pid, epoch, ("a", 0), [b"x" * 5000, b"y"])
        assert env.txns.budget.used == 0
        await env.txns.end_txn(TID, pid, epoch, True)
        read = await env.engine.partition("a", 0).read(0, 1 << 20)
        assert [_values(b) for b in read.batches] == [[b"x" * 5000, b"y"], None]

    run(tmp_path, phase, settings=TxnSettings(pending_memory_bytes=100))


# -------------------------------------------------------------------- abort


def test_abort_deletes_the_blobs_and_publishes_nothing(tmp_path):
    async def phase(env: Env) -> None:
        await env.offsets.commit(GROUP, {("a", 0): OffsetCommit(3)}, env.clock())
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        await env.begin(pid, epoch, group=GROUP)
        for tp in PARTITIONS:
            await env.produce(pid, epoch, tp, [b"x", b"y"])
        await env.txns.txn_offset_commit(TID, pid, epoch, GROUP, {("a", 0): OffsetCommit(10)})
        assert len(env.blobs()) == 4 and env.txns.pending_bytes > 0
        stats = env.engine.store.stats
        changes = stats.changes
        await env.txns.end_txn(TID, pid, epoch, False)
        assert stats.changes - changes == 1
        assert env.blobs() == []
        assert env.txns.describe(TID).state is TxnState.COMPLETE_ABORT
        assert env.txns.stats.aborts == 1 and env.txns.pending_bytes == 0
        assert env.txns.budget.used == 0
        for tp in PARTITIONS:
            tablet = env.engine.partition(*tp)
            assert (tablet.log_end_offset, tablet.high_watermark) == (0, 0)
        assert env.offsets.committed(GROUP, "a", 0).offset == 3
        assert not env.offsets.is_pending(GROUP, "a", 0)
        # The next transaction of the same producer continues its sequences.
        await env.begin(pid, epoch, [("a", 0)])
        await env.produce(pid, epoch, ("a", 0), [b"z"])
        await env.txns.end_txn(TID, pid, epoch, True)
        assert await _record_values(env, ("a", 0)) == [(0, b"z")]

    run(tmp_path, phase)


# ----------------------------------------------------------- transactional produce


def test_transactional_produce_needs_its_open_transaction_and_partition(tmp_path):
    async def phase(env: Env) -> None:
        with pytest.raises(InvalidProducerIdMapping):
            env.txns.sink_for(12345, 0, "a", 0)
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        with pytest.raises(InvalidTxnState):  # no transaction open
            env.txns.sink_for(pid, epoch, "a", 0)
        await env.begin(pid, epoch, [("a", 0)])
        with pytest.raises(InvalidTxnState):  # not added
            env.txns.sink_for(pid, epoch, "a", 1)
        with pytest.raises(ProducerFenced):
            env.txns.sink_for(pid, epoch + 1, "a", 0)
        assert await env.produce(pid, epoch, ("a", 0), [b"x"]) == -1
        # A retry of the same batch is a duplicate: stored once.
        assert await env.produce(pid, epoch, ("a", 0), [b"x"], seq=0) == -1
        assert len(env.blobs()) == 1
        await env.txns.end_txn(TID, pid, epoch, True)
        assert await env.log(("a", 0)) == [(0, False, 1), (1, True, 1)]

    run(tmp_path, phase)


# ------------------------------------------------------------------- offsets


def test_txn_offset_commit_needs_the_group_added(tmp_path):
    async def phase(env: Env) -> None:
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        with pytest.raises(InvalidTxnState):
            await env.txns.txn_offset_commit(TID, pid, epoch, GROUP, {("a", 0): OffsetCommit(1)})
        await env.begin(pid, epoch, [("a", 0)])
        with pytest.raises(InvalidTxnState):
            await env.txns.txn_offset_commit(TID, pid, epoch, GROUP, {("a", 0): OffsetCommit(1)})
        with pytest.raises(ProducerFenced):
            await env.txns.txn_offset_commit(TID, pid, epoch + 1, GROUP,
                                             {("a", 0): OffsetCommit(1)})

    run(tmp_path, phase)


def test_an_offsets_only_transaction_commits_its_offsets(tmp_path):
    async def phase(env: Env) -> None:
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        await env.txns.add_offsets(TID, pid, epoch, GROUP)
        assert env.txns.describe(TID).state is TxnState.ONGOING
        await env.txns.txn_offset_commit(TID, pid, epoch, GROUP, {("a", 1): OffsetCommit(4)})
        await env.txns.txn_offset_commit(TID, pid, epoch, GROUP, {("a", 1): OffsetCommit(6)})
        assert env.offsets.is_pending(GROUP, "a", 1)
        assert env.offsets.committed(GROUP, "a", 1) is None
        await env.txns.end_txn(TID, pid, epoch, True)
        assert env.offsets.committed(GROUP, "a", 1).offset == 6
        assert not env.offsets.is_pending(GROUP, "a", 1)
        for tp in PARTITIONS:
            assert await env.log(tp) == []  # no partition: no marker

    run(tmp_path, phase)


def test_pending_offsets_of_two_transactions_are_counted_apart(tmp_path):
    async def phase(env: Env) -> None:
        p1, e1 = await env.txns.init_producer_id("t1", TIMEOUT_MS)
        p2, e2 = await env.txns.init_producer_id("t2", TIMEOUT_MS)
        for tid, pid, epoch, tp in (("t1", p1, e1, ("a", 0)), ("t2", p2, e2, ("a", 1))):
            await env.txns.add_offsets(tid, pid, epoch, GROUP)
            await env.txns.txn_offset_commit(tid, pid, epoch, GROUP, {tp: OffsetCommit(5)})
        await env.txns.end_txn("t1", p1, e1, False)
        assert not env.offsets.is_pending(GROUP, "a", 0)
        assert env.offsets.is_pending(GROUP, "a", 1)
        await env.txns.end_txn("t2", p2, e2, True)
        assert not env.offsets.is_pending(GROUP, "a", 1)

    run(tmp_path, phase)


# ----------------------------------------------------------------- conflicts


async def _two_transactions(env: Env, tp=("a", 0)) -> tuple[tuple[int, int], tuple[int, int]]:
    """t1 and t2, each open with one batch in ``tp`` and the group added."""
    ids = []
    for tid in ("t1", "t2"):
        pid, epoch = await env.txns.init_producer_id(tid, TIMEOUT_MS)
        await env.begin(pid, epoch, [tp], group=GROUP, tid=tid)
        await env.produce(pid, epoch, tp, [tid.encode()])
        ids.append((pid, epoch))
    return ids[0], ids[1]


async def _assert_nothing_of(env: Env, tid: str, tp=("a", 0)) -> None:
    """The transaction aborted and its blobs are gone."""
    meta = env.txns.describe(tid)
    assert meta.state is TxnState.COMPLETE_ABORT
    start, end = keys.blob_range(env.engine.partition(*tp).prefix, meta.instance)
    assert not [key for key in env.blobs() if start <= key < end]


def test_conflict_at_txn_offset_commit_when_the_version_moved(tmp_path):
    async def phase(env: Env) -> None:
        await env.offsets.commit(GROUP, {("a", 0): OffsetCommit(3)}, env.clock())
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        await env.begin(pid, epoch, [("a", 0)], group=GROUP)
        await env.produce(pid, epoch, ("a", 0), [b"late"])
        await env.offsets.commit(GROUP, {("a", 0): OffsetCommit(8)}, env.clock())  # a rival
        with pytest.raises(TxnConflict):
            await env.txns.txn_offset_commit(TID, pid, epoch, GROUP, {("a", 0): OffsetCommit(9)})
        assert env.txns.stats.conflicts == 1
        assert not env.offsets.is_pending(GROUP, "a", 0)
        # Doomed: even an offset that would pass now is refused, and the commit aborts.
        with pytest.raises(TxnConflict):
            await env.txns.txn_offset_commit(TID, pid, epoch, GROUP, {("a", 1): OffsetCommit(1)})
        with pytest.raises(TxnConflict):
            await env.txns.end_txn(TID, pid, epoch, True)
        assert env.txns.stats.conflicts == 1  # one transaction, one conflict
        await _assert_nothing_of(env, TID)
        assert await env.log(("a", 0)) == []
        assert env.offsets.committed(GROUP, "a", 0).offset == 8
        # The client aborts (a retry of the outcome) and goes on.
        await env.txns.end_txn(TID, pid, epoch, False)
        with pytest.raises(InvalidTxnState):
            await env.txns.end_txn(TID, pid, epoch, True)

    run(tmp_path, phase)


def test_conflict_when_the_new_offset_does_not_move_past_the_committed_one(tmp_path):
    async def phase(env: Env) -> None:
        await env.offsets.commit(GROUP, {("a", 0): OffsetCommit(10)}, env.clock())
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        for offset in (10, 4):
            await env.begin(pid, epoch, [("a", 0)], group=GROUP)
            await env.produce(pid, epoch, ("a", 0), [b"again"])
            with pytest.raises(TxnConflict):
                await env.txns.txn_offset_commit(TID, pid, epoch, GROUP,
                                                 {("a", 0): OffsetCommit(offset)})
            with pytest.raises(TxnConflict):
                await env.txns.end_txn(TID, pid, epoch, True)
            await _assert_nothing_of(env, TID)
        assert env.txns.stats.conflicts == 2
        await env.begin(pid, epoch, [("a", 0)], group=GROUP)
        await env.txns.txn_offset_commit(TID, pid, epoch, GROUP, {("a", 0): OffsetCommit(11)})
        await env.txns.end_txn(TID, pid, epoch, True)
        assert env.offsets.committed(GROUP, "a", 0).offset == 11

    run(tmp_path, phase)


def test_conflict_at_end_txn_exactly_one_of_two_wins(tmp_path):
    async def phase(env: Env) -> None:
        (p1, e1), (p2, e2) = await _two_transactions(env)
        for tid, pid, epoch in (("t1", p1, e1), ("t2", p2, e2)):
            await env.txns.txn_offset_commit(tid, pid, epoch, GROUP, {("a", 0): OffsetCommit(5)})
        await env.txns.end_txn("t1", p1, e1, True)
        changes = env.engine.store.stats.changes
        with pytest.raises(TxnConflict):
            await env.txns.end_txn("t2", p2, e2, True)
        assert env.engine.store.stats.changes - changes == 1  # the abort, in one write
        await _assert_nothing_of(env, "t2")
        assert [v for _, v in await _record_values(env, ("a", 0))] == [b"t1"]
        assert env.offsets.committed(GROUP, "a", 0).offset == 5
        assert not env.offsets.is_pending(GROUP, "a", 0)
        assert env.txns.stats.conflicts == 1

    run(tmp_path, phase)


def test_conflict_at_end_txn_with_a_plain_commit_after_txn_offset_commit(tmp_path):
    async def phase(env: Env) -> None:
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        await env.begin(pid, epoch, [("a", 0)], group=GROUP)
        await env.produce(pid, epoch, ("a", 0), [b"late"])
        await env.txns.txn_offset_commit(TID, pid, epoch, GROUP, {("a", 0): OffsetCommit(5)})
        await env.offsets.commit(GROUP, {("a", 0): OffsetCommit(5)}, env.clock())  # the successor
        with pytest.raises(TxnConflict):
            await env.txns.end_txn(TID, pid, epoch, True)
        await _assert_nothing_of(env, TID)
        assert await env.log(("a", 0)) == []
        assert env.offsets.committed(GROUP, "a", 0).offset == 5

    run(tmp_path, phase)


def test_concurrent_end_txns_over_one_range_exactly_one_wins(tmp_path):
    async def phase(env: Env) -> None:
        (p1, e1), (p2, e2) = await _two_transactions(env)
        for tid, pid, epoch in (("t1", p1, e1), ("t2", p2, e2)):
            await env.txns.txn_offset_commit(tid, pid, epoch, GROUP, {("a", 0): OffsetCommit(5)})
        outcomes = await asyncio.gather(env.txns.end_txn("t1", p1, e1, True),
                                        env.txns.end_txn("t2", p2, e2, True),
                                        return_exceptions=True)
        assert outcomes[0] is None and isinstance(outcomes[1], TxnConflict), outcomes
        assert [v for _, v in await _record_values(env, ("a", 0))] == [b"t1"]
        assert env.txns.describe("t2").state is TxnState.COMPLETE_ABORT

    run(tmp_path, phase)


def test_disjoint_partitions_do_not_conflict(tmp_path):
    async def phase(env: Env) -> None:
        (p1, e1), (p2, e2) = await _two_transactions(env)
        await env.txns.txn_offset_commit("t1", p1, e1, GROUP, {("b", 0): OffsetCommit(5)})
        await env.txns.txn_offset_commit("t2", p2, e2, GROUP, {("b", 1): OffsetCommit(5)})
        await env.txns.end_txn("t1", p1, e1, True)
        await env.txns.end_txn("t2", p2, e2, True)
        assert [v for _, v in await _record_values(env, ("a", 0))] == [b"t1", b"t2"]
        assert env.txns.stats.conflicts == 0

    run(tmp_path, phase)


async def _record_values(env: Env, tp) -> list[tuple[int, bytes]]:
    read = await env.engine.partition(*tp).read(0, 1 << 30)
    out = []
    for batch in read.batches:
        values = _values(batch)
        if values is not None:
            out.extend(zip(range(rb.base_offset_of(batch), 1 << 62), values, strict=False))
    return out


# ------------------------------------------------------ EndTxn retries / guard


def test_end_txn_retries_and_states(tmp_path):
    async def phase(env: Env) -> None:
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        for commit in (True, False):
            with pytest.raises(InvalidTxnState):  # Empty: nothing to end
                await env.txns.end_txn(TID, pid, epoch, commit)
        await env.begin(pid, epoch, [("a", 0)])
        await env.produce(pid, epoch, ("a", 0), [b"x"])
        await env.txns.end_txn(TID, pid, epoch, True)
        await env.txns.end_txn(TID, pid, epoch, True)  # a retry: ok, nothing again
        with pytest.raises(InvalidTxnState):
            await env.txns.end_txn(TID, pid, epoch, False)
        assert await env.log(("a", 0)) == [(0, False, 1), (1, True, 1)]
        assert env.txns.stats.commits == 1
        await env.begin(pid, epoch, [("a", 0)])
        await env.txns.end_txn(TID, pid, epoch, False)
        await env.txns.end_txn(TID, pid, epoch, False)
        with pytest.raises(InvalidTxnState):
            await env.txns.end_txn(TID, pid, epoch, True)
        with pytest.raises(InvalidProducerIdMapping):
            await env.txns.end_txn("nobody", pid, epoch, True)

    run(tmp_path, phase)


def test_a_delayed_end_txn_cannot_end_a_later_transaction(tmp_path):
    async def phase(env: Env) -> None:
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        old = env.connect()  # carried the first transaction's EndTxn, then went quiet
        await env.begin(pid, epoch, [("a", 0)], connection=old)
        await env.produce(pid, epoch, ("a", 0), [b"first"], connection=old)
        bystander = env.connect()  # open all along, carries nothing of the next one
        current = env.connect()  # the client retried there, and goes on there
        await env.txns.end_txn(TID, pid, epoch, True, current)
        await env.begin(pid, epoch, [("a", 0)], connection=current)
        await env.produce(pid, epoch, ("a", 0), [b"second"], connection=current)
        for connection in (old, bystander):
            for commit in (True, False):
                with pytest.raises(InvalidTxnState):
                    await env.txns.end_txn(TID, pid, epoch, commit, connection)
        assert env.txns.stats.stale_end_txn == 4
        assert env.txns.describe(TID).state is TxnState.ONGOING
        await env.txns.end_txn(TID, pid, epoch, True, current)  # a touching connection
        assert [v for _, v in await _record_values(env, ("a", 0))] == [b"first", b"second"]

    run(tmp_path, phase)


def test_end_txn_from_a_connection_opened_after_the_transaction_began(tmp_path):
    """librdkafka keeps its coordinator connection apart from the one it
    produces on, and reconnects it at once when it drops: a transaction's
    EndTxn may come on a connection that carried none of its requests and
    existed before its last Produce."""

    async def phase(env: Env) -> None:
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        coordinator, broker = env.connect(), env.connect()
        await env.begin(pid, epoch, [("a", 0)], connection=coordinator)
        reconnected = env.connect()  # the coordinator connection dropped
        await env.produce(pid, epoch, ("a", 0), [b"x"], connection=broker)
        await env.produce(pid, epoch, ("a", 0), [b"y"], connection=broker)
        await env.txns.end_txn(TID, pid, epoch, True, reconnected)
        assert env.txns.describe(TID).state is TxnState.COMPLETE_COMMIT
        assert env.txns.stats.stale_end_txn == 0

    run(tmp_path, phase)


# ------------------------------------------------------------------ timeouts


def test_a_timed_out_transaction_is_aborted_and_its_epoch_bumped(tmp_path):
    clock = Clock()

    async def phase(env: Env) -> None:
        pid, epoch = await env.txns.init_producer_id(TID, 1_000)
        await env.begin(pid, epoch, [("a", 0)], group=GROUP)
        await env.produce(pid, epoch, ("a", 0), [b"slow"])
        await env.txns.txn_offset_commit(TID, pid, epoch, GROUP, {("a", 0): OffsetCommit(1)})
        clock.now += 1_000
        await env.txns.expire()
        assert env.txns.describe(TID).state is TxnState.ONGOING  # not past the timeout yet
        clock.now += 1
        await env.txns.expire()
        meta = env.txns.describe(TID)
        assert (meta.state, meta.producer_id, meta.epoch) == (TxnState.COMPLETE_ABORT, pid,
                                                               epoch + 1)
        assert env.txns.stats.timeouts == 1 and env.txns.open_count == 0
        assert env.blobs() == [] and not env.offsets.is_pending(GROUP, "a", 0)
        for commit in (True, False):
            with pytest.raises(ProducerFenced):
                await env.txns.end_txn(TID, pid, epoch, commit)
        with pytest.raises(ProducerFenced):
            env.txns.sink_for(pid, epoch, "a", 0)
        assert await env.log(("a", 0)) == []
        assert env.offsets.committed(GROUP, "a", 0) is None

    run(tmp_path, phase, clock=clock)


def test_idle_transactional_ids_expire(tmp_path):
    clock = Clock()

    async def phase(env: Env) -> None:
        settings = env.txns.settings
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        await env.begin(pid, epoch, [("a", 0)])
        clock.now += settings.id_expiration_ms + 1
        await env.txns.expire()  # open: it times out, it is not forgotten
        assert env.txns.describe(TID).state is TxnState.COMPLETE_ABORT
        clock.now += settings.id_expiration_ms + 1
        await env.txns.expire()
        with pytest.raises(TransactionalIdNotFound):
            env.txns.describe(TID)
        assert env.txns.list() == []

    async def after_restart(env: Env) -> None:
        assert env.txns.list() == []
        assert (await env.txns.init_producer_id(TID, TIMEOUT_MS))[1] == 0

    run(tmp_path, phase, after_restart, clock=clock)


def test_an_id_used_while_its_expiry_is_written_is_not_forgotten(tmp_path):
    clock = Clock()
    epochs: list[int] = []

    async def phase(env: Env) -> None:
        await env.txns.init_producer_id(TID, TIMEOUT_MS)
        clock.now += env.txns.settings.id_expiration_ms + 1
        expiry = asyncio.create_task(env.txns.expire())
        await asyncio.sleep(0)  # its deletion is on its way to the store
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        await expiry
        assert env.txns.describe(TID).epoch == epoch == 1
        await env.begin(pid, epoch, [("a", 0)])
        epochs.append(epoch)

    async def after_restart(env: Env) -> None:
        meta = env.txns.describe(TID)
        assert (meta.epoch, meta.state) == (epochs[0], TxnState.ONGOING)

    run(tmp_path, phase, after_restart, clock=clock)


# ------------------------------------------------------------------ recovery


def test_an_open_transaction_survives_a_restart_and_commits(tmp_path):
    ids: list[int] = []

    async def first(env: Env) -> None:
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        ids.extend((pid, epoch))
        await env.begin(pid, epoch, PARTITIONS, group=GROUP)
        for tp in PARTITIONS:
            await env.produce(pid, epoch, tp, [b"one", b"two"])
            await env.produce(pid, epoch, tp, [b"three"])
        await env.txns.txn_offset_commit(TID, pid, epoch, GROUP, {("b", 0): OffsetCommit(9)})

    async def recovered(env: Env) -> None:
        pid, epoch = ids
        meta = env.txns.describe(TID)
        assert meta.state is TxnState.ONGOING and env.txns.open_count == 1
        assert meta.partitions == set(PARTITIONS)
        assert len(env.blobs()) == 8
        assert env.offsets.is_pending(GROUP, "b", 0)
        assert env.txns.pending_bytes > 0
        # Its sequences are known too: the next batch continues them.
        await env.produce(pid, epoch, ("a", 0), [b"four"], seq=3)
        await env.txns.end_txn(TID, pid, epoch, True, env.connect())
        assert [v for _, v in await _record_values(env, ("a", 0))] == [
            b"one", b"two", b"three", b"four"]
        assert await env.log(("b", 1)) == [(0, False, 2), (2, False, 1), (3, True, 1)]
        assert env.offsets.committed(GROUP, "b", 0).offset == 9
        assert not env.offsets.is_pending(GROUP, "b", 0)

    async def completed(env: Env) -> None:
        pid, epoch = ids
        assert env.txns.describe(TID).state is TxnState.COMPLETE_COMMIT
        await env.txns.end_txn(TID, pid, epoch, True)  # a retry after the restart
        with pytest.raises(InvalidTxnState):
            await env.txns.end_txn(TID, pid, epoch, False)
        assert await env.log(("a", 1)) == [(0, False, 2), (2, False, 1), (3, True, 1)]
        assert await env.txns.init_producer_id(TID, TIMEOUT_MS) == (pid, epoch + 1)

    run(tmp_path, first, recovered, completed)


def test_an_open_transaction_survives_a_restart_and_aborts(tmp_path):
    ids: list[int] = []

    async def first(env: Env) -> None:
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        ids.extend((pid, epoch))
        await env.begin(pid, epoch, [("a", 0)])
        await env.produce(pid, epoch, ("a", 0), [b"x"])

    async def recovered(env: Env) -> None:
        await env.txns.end_txn(TID, *ids, False, env.connect())
        assert env.blobs() == []

    async def later(env: Env) -> None:
        assert env.txns.describe(TID).state is TxnState.COMPLETE_ABORT
        assert env.txns.open_count == 0 and env.blobs() == []
        # Instance numbers are never reused: a new transaction's blobs are its own.
        pid, epoch = ids
        await env.begin(pid, epoch, [("a", 0)])
        # Sequences go on across transactions of one epoch, aborted ones too.
        await env.produce(pid, epoch, ("a", 0), [b"y"], seq=1)
        await env.txns.end_txn(TID, pid, epoch, True)
        assert [v for _, v in await _record_values(env, ("a", 0))] == [b"y"]

    run(tmp_path, first, recovered, later)


def test_producer_ids_are_not_reused_after_a_restart(tmp_path):
    seen: list[int] = []

    async def phase(env: Env) -> None:
        seen.append((await env.txns.init_producer_id(f"t{len(seen)}", TIMEOUT_MS))[0])
        seen.append((await env.txns.init_producer_id(None, 0))[0])

    run(tmp_path, phase, phase, phase)
    assert len(set(seen)) == 6


# ------------------------------------------------------------ truncation, topics


def test_truncation_deletes_the_blobs_committed_batches_reference(tmp_path):
    async def phase(env: Env) -> None:
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        await env.begin(pid, epoch, [("a", 0)])
        await env.produce(pid, epoch, ("a", 0), [b"x", b"y"])
        await env.produce(pid, epoch, ("a", 0), [b"z"])
        await env.txns.end_txn(TID, pid, epoch, True)
        tablet = env.engine.partition("a", 0)
        assert len(env.blobs()) == 2
        assert await tablet.delete_records(2) == 2  # the first batch (0-1) goes
        assert len(env.blobs()) == 1
        assert await tablet.delete_records(-1) == 4
        assert env.blobs() == []

    run(tmp_path, phase)


def test_describe_and_list(tmp_path):
    async def phase(env: Env) -> None:
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        other, _ = await env.txns.init_producer_id("other", TIMEOUT_MS)
        await env.begin(pid, epoch, [("a", 0), ("b", 1)])
        meta = env.txns.describe(TID)
        assert meta.started_ms == env.clock() and meta.timeout_ms == TIMEOUT_MS
        assert {m.transactional_id for m in env.txns.list()} == {TID, "other"}
        assert [m.transactional_id for m in env.txns.list({TxnState.ONGOING})] == [TID]
        assert [m.transactional_id for m in env.txns.list(None, {other})] == ["other"]
        assert env.txns.list({TxnState.COMPLETE_COMMIT}) == []
        with pytest.raises(TransactionalIdNotFound):
            env.txns.describe("nobody")

    run(tmp_path, phase)


def test_a_topic_deleted_and_recreated_under_an_open_transaction(tmp_path):
    async def phase(env: Env) -> None:
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        await env.begin(pid, epoch, [("a", 0), ("b", 0)])
        await env.produce(pid, epoch, ("a", 0), [b"gone"])
        await env.produce(pid, epoch, ("b", 0), [b"kept"])
        await env.engine.delete_topic("a")
        await env.engine.create_topic("a", 2, {})
        await env.txns.end_txn(TID, pid, epoch, True)
        assert await _record_values(env, ("a", 0)) == []  # the old topic's data went with it
        assert await _record_values(env, ("b", 0)) == [(0, b"kept")]

    async def after_restart(env: Env) -> None:  # every log entry still resolves
        assert await _record_values(env, ("a", 0)) == []
        assert await _record_values(env, ("b", 0)) == [(0, b"kept")]

    run(tmp_path, phase, after_restart)


def test_log_append_time_topics_stamp_transactional_batches(tmp_path):
    async def phase(env: Env) -> None:
        await env.engine.create_topic("lat", 1, {"message.timestamp.type": "LogAppendTime"})
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        await env.begin(pid, epoch, [("lat", 0)])
        batch = make_batch([b"x", b"y"], base_timestamp=5, producer_id=pid,
                           producer_epoch=epoch, base_sequence=0,
                           attributes=rb.ATTR_TRANSACTIONAL)
        sink = env.txns.sink_for(pid, epoch, "lat", 0)
        produced_at = env.clock()
        result = await env.engine.partition("lat", 0).append(batch, produced_at, sink)
        assert (result.base_offset, result.log_append_time) == (-1, produced_at)
        env.clock.now += 1000
        await env.txns.end_txn(TID, pid, epoch, True)
        read = await env.engine.partition("lat", 0).read(0, 1 << 20)
        [header] = rb.parse_batches(read.batches[0])  # the CRC still holds
        assert header.attributes & rb.ATTR_TIMESTAMP_TYPE
        assert header.max_timestamp == produced_at
        assert await env.engine.partition("lat", 0).offset_for_timestamp(produced_at) == (
            0, produced_at)

    run(tmp_path, phase)
