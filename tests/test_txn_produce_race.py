"""A transactional Produce racing its transaction's end (issue 18, item 2).

A compressed batch's records are checked on a worker thread after the
Produce took its transaction's sink. Here those checks are held
(``HeldChecks``) while the transaction ends (EndTxn(abort), a timeout, a new
session's InitProducerId, EndTxn(commit)), then released. A batch whose
transaction ended first stores nothing (no blob, no producer sequence, no
memory budget) and gets the error a new batch would; a commit waits for it,
so an acknowledged batch is always published. Wire-level versions of these
races, through the real Produce handler: test_txn_produce_race_wire.py.
"""

from __future__ import annotations

import asyncio

import pytest

from tablets import batch as batch_header
from tablets.consumer_offsets import OffsetCommit
from tablets.errors import InvalidRecordBatch
from tablets.producers import producer_key
from testkit.batches import GZIP, make_batch
from testkit.txn import GROUP, TID, TIMEOUT_MS, Clock, Env, HeldChecks, HeldWrites, run
from txn import TxnState
from txn.errors import ConcurrentTransactions, InvalidTxnState, ProducerFenced

A0 = ("a", 0)


def compressed(pid: int, epoch: int, seq: int, values: list[bytes]) -> bytes:
    """A transactional batch checked on a worker thread (compressed)."""
    return make_batch(values, producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                      attributes=batch_header.ATTR_TRANSACTIONAL, codec=GZIP)


def append(env: Env, pid: int, epoch: int, batch: bytes,
           tp: tuple[str, int] = A0) -> asyncio.Future:
    """A transactional append as the Produce handler makes it: not awaited."""
    sink = env.txns.sink_for(TID, pid, epoch, *tp)
    return env.engine.partition(*tp).append(batch, env.clock(), sink)


async def until_committing(env: Env, pid: int, epoch: int) -> None:
    """Yield until the transaction's commit waits for its in-flight batches:
    a new batch is then refused."""
    for _ in range(1000):
        try:
            env.txns.sink_for(TID, pid, epoch, *A0)
        except ConcurrentTransactions:
            return
        await asyncio.sleep(0)
    raise AssertionError("the commit never began to wait for the in-flight batches")


def assert_nothing_pending(env: Env) -> None:
    assert env.txns.budget.used == 0, "memory budget not given back"
    assert env.txns.pending_bytes == 0


def assert_no_sequence(env: Env, pid: int, tp: tuple[str, int] = A0) -> None:
    """No sequence of ``pid`` staged in ``tp``, in memory or in the store."""
    tablet = env.engine.partition(*tp)
    assert tablet.producers.get(pid) is None
    assert env.engine.store.get(producer_key(tablet.prefix, pid)) is None


@pytest.mark.parametrize("end", ["abort", "timeout", "fence"])
def test_a_batch_whose_transaction_ended_while_it_was_checked_stores_nothing(tmp_path, end):
    clock = Clock()

    async def phase(env: Env) -> None:
        held = HeldChecks.install(env.engine.partition(*A0))
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        await env.begin(pid, epoch, [A0])
        late = append(env, pid, epoch, compressed(pid, epoch, 0, [b"late-0", b"late-1"]))
        # An uncompressed batch behind it is checked at once but waits its turn.
        behind = append(env, pid, epoch, make_batch(
            [b"behind"], producer_id=pid, producer_epoch=epoch, base_sequence=2,
            attributes=batch_header.ATTR_TRANSACTIONAL))
        assert len(held.held) == 1 and not late.done() and not behind.done()

        if end == "abort":
            await env.txns.end_txn(TID, pid, epoch, False)
            error: type[Exception] = InvalidTxnState
        elif end == "timeout":
            clock.now += TIMEOUT_MS + 1
            await env.txns.expire()
            assert env.txns.stats.timeouts == 1
            error = ProducerFenced
        else:
            await env.txns.init_producer_id(TID, TIMEOUT_MS)  # a new session
            error = ProducerFenced
        meta = env.txns.describe(TID)
        assert meta.state in (TxnState.COMPLETE_ABORT, TxnState.EMPTY)
        assert meta.epoch == (epoch if end == "abort" else epoch + 1)

        assert held.release() == 1
        for batch in (late, behind):
            with pytest.raises(error):
                await batch
        assert env.blobs() == []
        assert_nothing_pending(env)
        assert_no_sequence(env, pid)
        assert await env.log(A0) == []

        # The producer goes on (the same epoch after its abort, the new one
        # after a fence): its next transaction starts at sequence 0 again,
        # which only passes because nothing of the late batch was staged.
        pid, epoch = meta.producer_id, meta.epoch
        await env.begin(pid, epoch, [A0])
        assert await env.produce(pid, epoch, A0, [b"next"], seq=0) == -1
        await env.txns.end_txn(TID, pid, epoch, True)
        assert await env.record_values(A0) == [(0, b"next")]
        # The committed batch moved into the log; the late one stored nothing.
        assert env.blobs() == [] and env.stored_bytes(A0) == env.engine.partition(*A0).size_bytes
        assert_nothing_pending(env)

    run(tmp_path, phase, clock=clock)


def test_a_late_batch_cannot_land_in_the_next_transaction(tmp_path):
    """Aborted, then the same producer (same epoch) opens its next transaction
    before the late batch's check ends: the batch belongs to the aborted one
    and stores nothing in either."""

    async def phase(env: Env) -> None:
        held = HeldChecks.install(env.engine.partition(*A0))
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        await env.begin(pid, epoch, [A0])
        late = append(env, pid, epoch, compressed(pid, epoch, 0, [b"late"]))
        await env.txns.end_txn(TID, pid, epoch, False)
        await env.begin(pid, epoch, [("b", 0)])
        assert await env.produce(pid, epoch, ("b", 0), [b"next"], seq=0) == -1
        held.release()
        with pytest.raises(InvalidTxnState):
            await late
        assert_no_sequence(env, pid)
        await env.txns.end_txn(TID, pid, epoch, True)
        assert await env.log(A0) == []
        assert await env.record_values(("b", 0)) == [(0, b"next")]
        assert env.blobs() == [] and env.stored_bytes(A0) == 0
        assert_nothing_pending(env)

    run(tmp_path, phase)


def test_a_commit_waits_for_the_batches_still_being_checked(tmp_path):
    async def phase(env: Env) -> None:
        held = HeldChecks.install(env.engine.partition(*A0))
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        await env.begin(pid, epoch, [A0, ("b", 0)])
        assert await env.produce(pid, epoch, ("b", 0), [b"stored"]) == -1
        late = append(env, pid, epoch, compressed(pid, epoch, 0, [b"a0", b"a1"]))
        commit = asyncio.create_task(env.txns.end_txn(TID, pid, epoch, True))
        await until_committing(env, pid, epoch)
        assert not commit.done() and not late.done()
        assert env.txns.describe(TID).state is TxnState.ONGOING
        assert await env.log(A0) == [] and await env.log(("b", 0)) == []

        assert held.release() == 1
        assert (await late).base_offset == -1  # acknowledged ...
        await asyncio.wait_for(commit, 10)
        assert env.txns.describe(TID).state is TxnState.COMPLETE_COMMIT
        # ... and published with its transaction
        assert await env.log(A0) == [(0, False, 2), (2, True, 1)]
        assert await env.record_values(A0) == [(0, b"a0"), (1, b"a1")]
        assert await env.record_values(("b", 0)) == [(0, b"stored")]
        assert env.blobs() == []  # both moved into their logs
        assert env.stored_bytes(A0) == env.engine.partition(*A0).size_bytes
        assert_nothing_pending(env)
        # The transaction is over: a batch of it now is refused.
        with pytest.raises(InvalidTxnState):
            env.txns.sink_for(TID, pid, epoch, *A0)

    run(tmp_path, phase)


def test_a_batch_failing_its_check_does_not_hold_the_commit(tmp_path):
    """A batch refused by its check settles too: the commit goes on without it."""

    async def phase(env: Env) -> None:
        held = HeldChecks.install(env.engine.partition(*A0))
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        await env.begin(pid, epoch, [A0])
        undecodable = batch_header.build_batch(b"not gzip at all", record_count=1, base_timestamp=0,
                                     max_timestamp=0, producer_id=pid,
                                     producer_epoch=epoch, base_sequence=0,
                                     attributes=batch_header.ATTR_TRANSACTIONAL | GZIP)
        bad = append(env, pid, epoch, undecodable)
        commit = asyncio.create_task(env.txns.end_txn(TID, pid, epoch, True))
        await until_committing(env, pid, epoch)
        held.release()
        with pytest.raises(InvalidRecordBatch):
            await bad
        await asyncio.wait_for(commit, 10)
        assert await env.log(A0) == [(0, True, 1)]  # the marker alone
        assert env.blobs() == []
        assert_no_sequence(env, pid)
        assert_nothing_pending(env)

    run(tmp_path, phase)


def test_a_cancelled_commit_leaves_the_transaction_open_and_usable(tmp_path):
    async def phase(env: Env) -> None:
        held = HeldChecks.install(env.engine.partition(*A0))
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        await env.begin(pid, epoch, [A0])
        first = append(env, pid, epoch, compressed(pid, epoch, 0, [b"first"]))
        commit = asyncio.create_task(env.txns.end_txn(TID, pid, epoch, True))
        await until_committing(env, pid, epoch)
        commit.cancel()  # its client went away
        with pytest.raises(asyncio.CancelledError):
            await commit
        assert env.txns.describe(TID).state is TxnState.ONGOING
        # Not wedged: batches are taken again, and the retried commit lands.
        second = append(env, pid, epoch, compressed(pid, epoch, 1, [b"second"]))
        assert held.release() == 2
        assert (await first).base_offset == (await second).base_offset == -1
        await env.txns.end_txn(TID, pid, epoch, True)
        assert await env.record_values(A0) == [(0, b"first"), (1, b"second")]
        assert_nothing_pending(env)

    run(tmp_path, phase)


@pytest.mark.parametrize("commit", [True, False])
def test_an_end_txn_cancelled_after_it_was_staged_still_publishes(tmp_path, commit):
    """The client goes away while its EndTxn's write is on its way to the
    store: the write lands, and what it ends is still published and gives
    back its memory and its pending offsets (else the group's offsets would
    stay UNSTABLE_OFFSET_COMMIT and the budget taken until a restart)."""

    async def phase(env: Env) -> None:
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        await env.begin(pid, epoch, [A0], group=GROUP)
        assert await env.produce(pid, epoch, A0, [b"v"]) == -1
        await env.txns.txn_offset_commit(TID, pid, epoch, GROUP, {A0: OffsetCommit(7)})
        assert env.txns.budget.used > 0 and env.pending_offsets.is_pending(GROUP, *A0)
        writes = env.txns.writer = HeldWrites(env.txns.writer)
        end = asyncio.create_task(env.txns.end_txn(TID, pid, epoch, commit))
        for _ in range(1000):
            if writes.held:
                break
            await asyncio.sleep(0)
        assert len(writes.held) == 1, "EndTxn never staged its write"
        end.cancel()
        with pytest.raises(asyncio.CancelledError):
            await end
        assert await writes.release() == 1
        await asyncio.sleep(0)  # the write's callbacks
        assert_nothing_pending(env)
        assert not env.pending_offsets.is_pending(GROUP, *A0)
        if commit:
            assert await env.record_values(A0) == [(0, b"v")]
            assert env.engine.partition(*A0).high_watermark == 2
            assert env.offsets.committed(GROUP, *A0).offset == 7
        else:
            assert await env.log(A0) == [] and env.blobs() == []
            assert env.offsets.committed(GROUP, *A0) is None

    run(tmp_path, phase)
