"""The optimistic offset-range conflict check (txn.conflicts) at TxnOffsetCommit
and at EndTxn, EndTxn's retries, and the KAFKA-17754 guard against a delayed
EndTxn, over a real StorageEngine."""

from __future__ import annotations

import asyncio

import pytest

from tablets.consumer_offsets import OffsetCommit
from testkit.txn import GROUP, TID, TIMEOUT_MS, Env, run
from txn import TxnState
from txn.errors import InvalidProducerIdMapping, InvalidTxnState, TxnConflict

# ----------------------------------------------------------------- conflicts


async def two_transactions(env: Env, tp=("a", 0)) -> tuple[tuple[int, int], tuple[int, int]]:
    """t1 and t2, each open with one batch in ``tp`` and the group added."""
    ids = []
    for tid in ("t1", "t2"):
        pid, epoch = await env.txns.init_producer_id(tid, TIMEOUT_MS)
        await env.begin(pid, epoch, [tp], group=GROUP, tid=tid)
        await env.produce(pid, epoch, tp, [tid.encode()], tid=tid)
        ids.append((pid, epoch))
    return ids[0], ids[1]


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
        env.assert_aborted(TID)
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
            env.assert_aborted(TID)
        assert env.txns.stats.conflicts == 2
        await env.begin(pid, epoch, [("a", 0)], group=GROUP)
        await env.txns.txn_offset_commit(TID, pid, epoch, GROUP, {("a", 0): OffsetCommit(11)})
        await env.txns.end_txn(TID, pid, epoch, True)
        assert env.offsets.committed(GROUP, "a", 0).offset == 11

    run(tmp_path, phase)


def test_a_transaction_may_recommit_its_own_offset_but_not_anothers(tmp_path):
    """Clients send the position of every assigned partition, also of one with
    no new records: re-committing the offset its own transaction committed
    claims an empty range and passes. The same offset committed by another
    transactional id, or by a plain OffsetCommit, was processed by someone
    else: the hung worker's case, a conflict."""

    async def commit(tid: str, offsets: dict) -> None:
        pid, epoch = await env.txns.init_producer_id(tid, TIMEOUT_MS)
        await env.begin(pid, epoch, [("b", 0)], group=GROUP, tid=tid)
        # A new epoch each time: sequences start again at 0.
        await env.produce(pid, epoch, ("b", 0), [tid.encode()], seq=0, tid=tid)
        await env.txns.txn_offset_commit(tid, pid, epoch, GROUP, offsets)
        await env.txns.end_txn(tid, pid, epoch, True)

    async def phase(e: Env) -> None:
        nonlocal env
        env = e
        await commit("mine", {("a", 0): OffsetCommit(5), ("a", 1): OffsetCommit(7)})
        # New records on a-0 only; a-1 is sent unchanged: both land.
        await commit("mine", {("a", 0): OffsetCommit(9), ("a", 1): OffsetCommit(7)})
        assert env.offsets.committed(GROUP, "a", 1).committer == "mine"
        with pytest.raises(TxnConflict):  # another id re-sends the offset "mine" committed
            await commit("theirs", {("a", 1): OffsetCommit(7)})
        await env.offsets.commit(GROUP, {("a", 1): OffsetCommit(8)}, env.clock())
        with pytest.raises(TxnConflict):  # a plain commit is someone else's too
            await commit("mine", {("a", 1): OffsetCommit(8)})
        assert env.txns.stats.conflicts == 2

    env: Env
    run(tmp_path, phase)


def test_the_committer_survives_a_restart_and_old_stores_are_upgraded(tmp_path):
    """A committer is persisted; offsets written before committers were kept
    (format 1, no format key) are read and rewritten once at start-up."""
    from tablets import keys
    from tablets.consumer_offsets import _VALUE_V1
    from tablets.store import Ops

    async def first(env: Env) -> None:
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        await env.begin(pid, epoch, [("a", 0)], group=GROUP)
        await env.txns.txn_offset_commit(TID, pid, epoch, GROUP, {("a", 0): OffsetCommit(4)})
        await env.txns.end_txn(TID, pid, epoch, True)

    async def committer_kept(env: Env) -> None:
        assert env.offsets.committed(GROUP, "a", 0).committer == TID
        ops = Ops()  # make the store look like the previous format's
        ops.put(keys.consumer_offset_key(GROUP, "a", 0), _VALUE_V1.pack(4, -1, 99, 1))
        ops.put(keys.consumer_offset_key("old", "a", 1), _VALUE_V1.pack(6, -1, 123, 2) + b"m")
        ops.delete(keys.COUNTER + b"consumer.offsets.format")
        env.engine.store.write_now(ops)

    async def upgraded(env: Env) -> None:
        old = env.offsets.committed("old", "a", 1)
        assert (old.offset, old.metadata, old.commit_timestamp, old.committer) == (6, "m", 123, "")
        assert (env.offsets.committed(GROUP, "a", 0).offset,
                env.offsets.committed(GROUP, "a", 0).committer) == (4, "")

    run(tmp_path, first, committer_kept, upgraded, upgraded)


def test_conflict_at_end_txn_exactly_one_of_two_wins(tmp_path):
    async def phase(env: Env) -> None:
        (p1, e1), (p2, e2) = await two_transactions(env)
        for tid, pid, epoch in (("t1", p1, e1), ("t2", p2, e2)):
            await env.txns.txn_offset_commit(tid, pid, epoch, GROUP, {("a", 0): OffsetCommit(5)})
        await env.txns.end_txn("t1", p1, e1, True)
        changes = env.engine.store.stats.changes
        with pytest.raises(TxnConflict):
            await env.txns.end_txn("t2", p2, e2, True)
        assert env.engine.store.stats.changes - changes == 1  # the abort, in one write
        env.assert_aborted("t2")
        assert [v for _, v in await env.record_values(("a", 0))] == [b"t1"]
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
        env.assert_aborted(TID)
        assert await env.log(("a", 0)) == []
        assert env.offsets.committed(GROUP, "a", 0).offset == 5

    run(tmp_path, phase)


def test_concurrent_end_txns_over_one_range_exactly_one_wins(tmp_path):
    async def phase(env: Env) -> None:
        (p1, e1), (p2, e2) = await two_transactions(env)
        for tid, pid, epoch in (("t1", p1, e1), ("t2", p2, e2)):
            await env.txns.txn_offset_commit(tid, pid, epoch, GROUP, {("a", 0): OffsetCommit(5)})
        outcomes = await asyncio.gather(env.txns.end_txn("t1", p1, e1, True),
                                        env.txns.end_txn("t2", p2, e2, True),
                                        return_exceptions=True)
        assert outcomes[0] is None and isinstance(outcomes[1], TxnConflict), outcomes
        assert [v for _, v in await env.record_values(("a", 0))] == [b"t1"]
        assert env.txns.describe("t2").state is TxnState.COMPLETE_ABORT

    run(tmp_path, phase)


def test_disjoint_partitions_do_not_conflict(tmp_path):
    async def phase(env: Env) -> None:
        (p1, e1), (p2, e2) = await two_transactions(env)
        await env.txns.txn_offset_commit("t1", p1, e1, GROUP, {("b", 0): OffsetCommit(5)})
        await env.txns.txn_offset_commit("t2", p2, e2, GROUP, {("b", 1): OffsetCommit(5)})
        await env.txns.end_txn("t1", p1, e1, True)
        await env.txns.end_txn("t2", p2, e2, True)
        assert [v for _, v in await env.record_values(("a", 0))] == [b"t1", b"t2"]
        assert env.txns.stats.conflicts == 0

    run(tmp_path, phase)


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
        assert [v for _, v in await env.record_values(("a", 0))] == [b"first", b"second"]

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
