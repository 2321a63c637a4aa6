"""The transaction coordinator (txn.TransactionCoordinator) over a real
StorageEngine: producer ids and epochs, one-write commits, aborts, the
transactional Produce's checks, pending offsets. Conflicts and EndTxn's
guards: test_txn_conflicts.py; timeouts and restarts: test_txn_recovery.py."""

from __future__ import annotations

import pytest

from tablets import keys, log_entry
from tablets.consumer_offsets import OffsetCommit
from tablets.records import record_timestamps
from testkit.batches import make_batch
from testkit.compaction import as_batches
from testkit.txn import GROUP, PARTITIONS, TID, TIMEOUT_MS, Env, batch_values, run
from txn import TxnSettings, TxnState
from txn.errors import (
    InvalidProducerIdMapping,
    InvalidTransactionTimeout,
    InvalidTxnState,
    ProducerFenced,
    TransactionalIdNotFound,
)
from txn.sessions import EPOCH_EXHAUSTED

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
        assert env.blobs() and env.pending_offsets.is_pending(GROUP, "a", 0)
        assert await env.txns.init_producer_id(TID, TIMEOUT_MS) == (pid, 1)
        meta = env.txns.describe(TID)
        assert (meta.state, meta.epoch, env.txns.open_count) == (TxnState.EMPTY, 1, 0)
        assert env.blobs() == []
        assert not env.pending_offsets.is_pending(GROUP, "a", 0)
        assert env.offsets.committed(GROUP, "a", 0) is None
        for tp in PARTITIONS:
            assert await env.log(tp) == []
        with pytest.raises(ProducerFenced):
            env.txns.sink_for(TID, pid, 0, "a", 0)
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


def test_a_fenced_session_cannot_bump_its_way_back(tmp_path):
    """Only a bump the current session asked for may be retried by it. A
    session fenced by a new one (InitProducerId without an epoch) or by its
    transaction's timeout gets PRODUCER_FENCED for InitProducerId with its
    old epoch, not the new epoch."""

    async def phase(env: Env) -> None:
        pid, _ = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        assert await env.txns.init_producer_id(TID, TIMEOUT_MS) == (pid, 1)  # a new session
        with pytest.raises(ProducerFenced):
            await env.txns.init_producer_id(TID, TIMEOUT_MS, pid, 0)
        await env.begin(pid, 1)
        env.clock.now += TIMEOUT_MS + 1
        await env.txns.expire()  # the open transaction times out: epoch 2
        assert env.txns.describe(TID).epoch == 2
        with pytest.raises(ProducerFenced):
            await env.txns.init_producer_id(TID, TIMEOUT_MS, pid, 1)
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
            env.txns.sink_for(TID, pid, EPOCH_EXHAUSTED, "a", 0)
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
        pending = env.pending_offsets
        assert pending.is_pending(GROUP, "a", 0) and pending.is_pending(GROUP, "b", 1)
        assert not env.pending_offsets.is_pending(GROUP, "a", 1)

        stats = env.engine.store.stats
        changes, writes = stats.changes, stats.writes
        await env.txns.end_txn(TID, pid, epoch, True)
        assert (stats.changes - changes, stats.writes - writes) == (1, 1)

        meta = env.txns.describe(TID)
        assert meta.state is TxnState.COMPLETE_COMMIT and env.txns.open_count == 0
        assert env.txns.stats.commits == 1
        assert len(env.blobs()) == 0  # their entries moved into the logs: never copied
        for tp in PARTITIONS:
            tablet = env.engine.partition(*tp)
            assert await env.log(tp) == [(0, False, 1), (1, False, 2), (3, True, 1)]
            assert tablet.high_watermark == tablet.last_stable_offset == 4
            assert [o for o, _ in await env.record_values(tp)] == [0, 1, 2]
            entries = list(env.engine.store.scan(*_log_range(tablet)))
            # The batches' bytes stay where they were produced (base offset 0,
            # ``SHIFTED``); the marker was written at commit.
            assert [log_entry.locate(v)[3] for _, v in entries] == [True, True, False]
        assert env.offsets.committed(GROUP, "a", 0).offset == 10
        assert env.offsets.committed(GROUP, "a", 0).metadata == "m"
        assert env.offsets.committed(GROUP, "b", 1).offset == 7
        assert not env.pending_offsets.is_pending(GROUP, "a", 0)

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
        batches = as_batches(read.batches)
        values = [batch_values(b) for b in batches]
        assert values == [[b"plain-0", b"plain-1"], [b"plain-2"], [b"t-0", b"t-1", b"t-2"],
                          [b"t-3"], None]
        assert [o for b in batches[:-1] for o, _ in record_timestamps(b)] == list(range(7))

    run(tmp_path, first, after_restart)


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
        assert [batch_values(b) for b in as_batches(read.batches)] == [[b"x" * 5000, b"y"], None]

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
        assert not env.pending_offsets.is_pending(GROUP, "a", 0)
        # The next transaction of the same producer continues its sequences.
        await env.begin(pid, epoch, [("a", 0)])
        await env.produce(pid, epoch, ("a", 0), [b"z"])
        await env.txns.end_txn(TID, pid, epoch, True)
        assert await env.record_values(("a", 0)) == [(0, b"z")]

    run(tmp_path, phase)


# ----------------------------------------------------------- transactional produce


def test_transactional_produce_needs_its_open_transaction_and_partition(tmp_path):
    async def phase(env: Env) -> None:
        with pytest.raises(InvalidProducerIdMapping):
            env.txns.sink_for(TID, 12345, 0, "a", 0)
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        with pytest.raises(InvalidTxnState):  # no transaction open
            env.txns.sink_for(TID, pid, epoch, "a", 0)
        await env.begin(pid, epoch, [("a", 0)])
        with pytest.raises(InvalidTxnState):  # not added
            env.txns.sink_for(TID, pid, epoch, "a", 1)
        with pytest.raises(ProducerFenced):
            env.txns.sink_for(TID, pid, epoch + 1, "a", 0)
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
        assert env.pending_offsets.is_pending(GROUP, "a", 1)
        assert env.offsets.committed(GROUP, "a", 1) is None
        await env.txns.end_txn(TID, pid, epoch, True)
        assert env.offsets.committed(GROUP, "a", 1).offset == 6
        assert not env.pending_offsets.is_pending(GROUP, "a", 1)
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
        assert not env.pending_offsets.is_pending(GROUP, "a", 0)
        assert env.pending_offsets.is_pending(GROUP, "a", 1)
        await env.txns.end_txn("t2", p2, e2, True)
        assert not env.pending_offsets.is_pending(GROUP, "a", 1)

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
