"""The optimistic offset-range conflict check (txn.conflicts) at TxnOffsetCommit
and at EndTxn, EndTxn's retries, and the KAFKA-17754 guard against a delayed
EndTxn, over a real StorageEngine."""

from __future__ import annotations

import asyncio

import pytest

from kafka_gateway.groups.fences import member_tag
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
        assert not env.pending_offsets.is_pending(GROUP, "a", 0)
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


# ------------------------------------------- member-fenced commits (KIP-447)

A_MEMBER = member_tag(3, "consumer-a")  # generation 3
B_MEMBER = member_tag(3, "consumer-b")


async def open_txn(env: Env, tid: str, tp=("b", 0)) -> tuple[int, int]:
    """A new session of ``tid`` with an open transaction (a batch in ``tp``)
    and the group added."""
    pid, epoch = await env.txns.init_producer_id(tid, TIMEOUT_MS)
    await env.begin(pid, epoch, [tp], group=GROUP, tid=tid)
    await env.produce(pid, epoch, tp, [tid.encode()], seq=0, tid=tid)
    return pid, epoch


def test_member_tag_names_a_member_and_its_generation_only():
    assert member_tag(3, "m") == "3/m" and member_tag(0, "m") == "0/m"
    assert member_tag(-1, "m") == "" and member_tag(3, "") == ""


def test_a_member_fenced_unchanged_offset_passes_whoever_committed_it(tmp_path):
    """After a rebalance, B's transactions re-send the offset A's transactional
    id committed for a partition B took over and has no records of: with the
    group's generation and member, an empty range: it passes at
    TxnOffsetCommit and at EndTxn, also when A committed it after B's
    transaction began (the version moved). Without membership, the same
    commit is the hung worker's and conflicts."""

    async def phase(env: Env) -> None:
        pid, epoch = await open_txn(env, "A")
        await env.txns.txn_offset_commit("A", pid, epoch, GROUP, {("a", 0): OffsetCommit(7)},
                                         member=A_MEMBER)
        b_pid, b_epoch = await open_txn(env, "B")  # begins before A's commit
        await env.txns.end_txn("A", pid, epoch, True)
        # B's own partition a-1 moved on; a-0 (A's, idle) is sent unchanged.
        commits = {("a", 0): OffsetCommit(7), ("a", 1): OffsetCommit(4)}
        await env.txns.txn_offset_commit("B", b_pid, b_epoch, GROUP, commits, member=B_MEMBER)
        assert env.txns.describe("B").members == {GROUP: dict.fromkeys(commits, B_MEMBER)}
        await env.txns.end_txn("B", b_pid, b_epoch, True)
        assert env.txns.describe("B").state is TxnState.COMPLETE_COMMIT
        assert (env.offsets.committed(GROUP, "a", 0).offset,
                env.offsets.committed(GROUP, "a", 0).committer) == (7, "B")
        assert env.offsets.committed(GROUP, "a", 1).offset == 4
        # Again, once the version of a-0 moved after B began (A's commit is
        # newer than B's transaction): still an empty range.
        b_pid, b_epoch = await open_txn(env, "B")
        pid, epoch = await open_txn(env, "A")
        await env.txns.txn_offset_commit("A", pid, epoch, GROUP, {("a", 0): OffsetCommit(7)},
                                         member=A_MEMBER)
        await env.txns.end_txn("A", pid, epoch, True)
        await env.txns.txn_offset_commit("B", b_pid, b_epoch, GROUP, {("a", 0): OffsetCommit(7)},
                                         member=B_MEMBER)
        await env.txns.end_txn("B", b_pid, b_epoch, True)
        assert env.txns.stats.conflicts == 0
        # Without membership (generation -1: assign(), the Spark reshard) the
        # rule stays strict: another id's offset, re-sent unchanged, conflicts.
        pid, epoch = await open_txn(env, "A")
        with pytest.raises(TxnConflict):
            await env.txns.txn_offset_commit("A", pid, epoch, GROUP, {("a", 0): OffsetCommit(7)})
        await env.txns.end_txn("A", pid, epoch, False)
        assert env.txns.stats.conflicts == 1

    run(tmp_path, phase)


def test_member_fenced_unchanged_offset_passes_end_txn_after_another_commit(tmp_path):
    """The EndTxn re-check remembers which staged offsets were member-fenced:
    another id's unchanged commit of the same offset between B's
    TxnOffsetCommit and its EndTxn moves the version, and B still commits.
    A commit that carried no membership is re-checked strictly."""

    async def phase(env: Env) -> None:
        await env.offsets.commit(GROUP, {("a", 0): OffsetCommit(5)}, env.clock())
        b_pid, b_epoch = await open_txn(env, "B")
        await env.txns.txn_offset_commit("B", b_pid, b_epoch, GROUP, {("a", 0): OffsetCommit(5)},
                                         member=B_MEMBER)
        c_pid, c_epoch = await open_txn(env, "C")
        await env.txns.txn_offset_commit("C", c_pid, c_epoch, GROUP, {("a", 0): OffsetCommit(5)},
                                         member=A_MEMBER)
        await env.txns.end_txn("C", c_pid, c_epoch, True)
        await env.txns.end_txn("B", b_pid, b_epoch, True)
        assert env.txns.stats.conflicts == 0
        assert env.offsets.committed(GROUP, "a", 0).committer == "B"
        # The same staged without membership: C's unchanged commit is newer
        # than B's transaction, and B is aborted at EndTxn (rule 1).
        b_pid, b_epoch = await open_txn(env, "B")
        await env.txns.txn_offset_commit("B", b_pid, b_epoch, GROUP, {("a", 0): OffsetCommit(6)})
        c_pid, c_epoch = await open_txn(env, "C")
        await env.txns.txn_offset_commit("C", c_pid, c_epoch, GROUP, {("a", 0): OffsetCommit(5)},
                                         member=A_MEMBER)
        await env.txns.end_txn("C", c_pid, c_epoch, True)
        with pytest.raises(TxnConflict):
            await env.txns.end_txn("B", b_pid, b_epoch, True)
        env.assert_aborted("B", ("b", 0))
        assert env.txns.stats.conflicts == 1

    run(tmp_path, phase)


def test_a_member_fenced_offset_below_the_committed_one_conflicts(tmp_path):
    """Membership excuses an unchanged offset only: an offset below the
    committed one (another member processed past it) conflicts at
    TxnOffsetCommit, and at EndTxn when the other commit comes in between."""

    async def phase(env: Env) -> None:
        await env.offsets.commit(GROUP, {("a", 0): OffsetCommit(9)}, env.clock())
        pid, epoch = await open_txn(env, "B")
        with pytest.raises(TxnConflict):
            await env.txns.txn_offset_commit("B", pid, epoch, GROUP, {("a", 0): OffsetCommit(8)},
                                             member=B_MEMBER)
        await env.txns.end_txn("B", pid, epoch, False)
        # B stages 9 unchanged (passes); A commits 12 before B's EndTxn.
        pid, epoch = await open_txn(env, "B")
        await env.txns.txn_offset_commit("B", pid, epoch, GROUP, {("a", 0): OffsetCommit(9)},
                                         member=B_MEMBER)
        a_pid, a_epoch = await open_txn(env, "A")
        await env.txns.txn_offset_commit("A", a_pid, a_epoch, GROUP,
                                         {("a", 0): OffsetCommit(12)}, member=A_MEMBER)
        await env.txns.end_txn("A", a_pid, a_epoch, True)
        with pytest.raises(TxnConflict):
            await env.txns.end_txn("B", pid, epoch, True)
        env.assert_aborted("B", ("b", 0))
        assert env.offsets.committed(GROUP, "a", 0).offset == 12
        assert env.txns.stats.conflicts == 2

    run(tmp_path, phase)


def test_two_producers_of_one_member_may_not_both_claim_a_range(tmp_path):
    """The exception to the exception: an unchanged offset that the same member
    (same member id and generation) committed through another transactional
    id after this transaction began is the end of a range both claim (two
    producers sharing one consumer's group metadata): it conflicts, when it
    is sent after the other's commit and when that commit comes in between."""

    async def phase(env: Env) -> None:
        for late_offsets in (True, False):
            tp = ("a", 0) if late_offsets else ("a", 1)
            a_pid, a_epoch = await open_txn(env, "A")
            b_pid, b_epoch = await open_txn(env, "B")
            await env.txns.txn_offset_commit("A", a_pid, a_epoch, GROUP, {tp: OffsetCommit(5)},
                                             member=A_MEMBER)
            if not late_offsets:  # B stages [0, 5) too, before A commits
                await env.txns.txn_offset_commit("B", b_pid, b_epoch, GROUP,
                                                 {tp: OffsetCommit(5)}, member=A_MEMBER)
            await env.txns.end_txn("A", a_pid, a_epoch, True)
            assert env.offsets.committed(GROUP, *tp).member == A_MEMBER
            with pytest.raises(TxnConflict):
                if late_offsets:
                    await env.txns.txn_offset_commit("B", b_pid, b_epoch, GROUP,
                                                     {tp: OffsetCommit(5)}, member=A_MEMBER)
                else:
                    await env.txns.end_txn("B", b_pid, b_epoch, True)
            await env.txns.end_txn("B", b_pid, b_epoch, False)
            assert [v for _, v in await env.record_values(("b", 0))].count(b"B") == 0
        assert env.txns.stats.conflicts == 2
        # Begun after A's commit, B re-sends it unchanged: an empty range.
        b_pid, b_epoch = await open_txn(env, "B")
        await env.txns.txn_offset_commit("B", b_pid, b_epoch, GROUP, {("a", 0): OffsetCommit(5)},
                                         member=A_MEMBER)
        await env.txns.end_txn("B", b_pid, b_epoch, True)
        assert env.txns.stats.conflicts == 2

    run(tmp_path, phase)


def test_member_fenced_offsets_survive_a_restart_and_old_states_decode(tmp_path):
    """Which staged offsets were member-fenced is stored with the transaction's
    state, so the EndTxn re-check after a restart applies the same rule; a
    state written before (no "members") decodes with none."""
    from txn.state import TxnMetadata

    async def staged(env: Env) -> None:
        await env.offsets.commit(GROUP, {("a", 0): OffsetCommit(5)}, env.clock())
        pid, epoch = await open_txn(env, "C")
        await env.txns.txn_offset_commit("C", pid, epoch, GROUP, {("a", 0): OffsetCommit(5)},
                                         member=B_MEMBER)
        # The predecessor's unchanged commit after C began: C may pass it
        # while the gateway knows whose it is.
        await env.offsets.commit(GROUP, {("a", 0): OffsetCommit(5)}, env.clock(), A_MEMBER)
        pid, epoch = await open_txn(env, "B")
        await env.txns.txn_offset_commit("B", pid, epoch, GROUP, {("a", 0): OffsetCommit(5)},
                                         member=B_MEMBER)

    async def committed(env: Env) -> None:
        # The member of a commit is kept in memory, as membership is: after
        # the restart the commit after C began is nobody's known member's,
        # and C conflicts (stricter, never looser).
        c = env.txns.describe("C")
        with pytest.raises(TxnConflict):
            await env.txns.end_txn("C", c.producer_id, c.epoch, True, env.connect())
        # B's offset was committed (by a plain commit, not B's) before B
        # began: member-fenced, B still commits after the restart, where a
        # commit without membership would conflict (rule 2).
        meta = env.txns.describe("B")
        assert meta.members == {GROUP: {("a", 0): B_MEMBER}}
        await env.txns.end_txn("B", meta.producer_id, meta.epoch, True, env.connect())
        assert env.offsets.committed(GROUP, "a", 0).committer == "B"
        import json
        old = json.loads(meta.encode())
        del old["members"]
        decoded = TxnMetadata.decode("B", json.dumps(old).encode())
        assert decoded.members == {} and decoded.offsets == meta.offsets

    run(tmp_path, staged, committed)


def test_the_members_own_auto_commit_is_not_a_rival(tmp_path):
    """enable.auto.commit left on in an EOS loop: the consumer's plain
    OffsetCommit lands between the transaction's first request and its
    TxnOffsetCommit, or between TxnOffsetCommit and EndTxn. Kafka lets both
    land, and so does the gateway when the plain commit came from the same
    member in the same generation as the member-fenced TxnOffsetCommit.
    Another member's plain commit, or the same member's in an older
    generation, is a rival (rule 1); so is any after a restart (the member is
    kept in memory only)."""

    async def first(env: Env) -> None:
        await env.offsets.commit(GROUP, {("a", 0): OffsetCommit(5)}, env.clock())
        pid, epoch = await open_txn(env, "B")
        # librdkafka's auto-commit: the stored offsets, the end of the batch.
        await env.offsets.commit(GROUP, {("a", 0): OffsetCommit(9)}, env.clock(), B_MEMBER)
        await env.txns.txn_offset_commit("B", pid, epoch, GROUP, {("a", 0): OffsetCommit(9)},
                                         member=B_MEMBER)
        await env.offsets.commit(GROUP, {("a", 0): OffsetCommit(8)}, env.clock(), B_MEMBER)
        await env.txns.end_txn("B", pid, epoch, True)
        assert (env.offsets.committed(GROUP, "a", 0).offset,
                env.offsets.committed(GROUP, "a", 0).committer) == (9, "B")
        assert env.txns.stats.conflicts == 0
        for rival in (A_MEMBER, member_tag(2, "consumer-b"), ""):
            pid, epoch = await open_txn(env, "B")
            await env.offsets.commit(GROUP, {("a", 0): OffsetCommit(10)}, env.clock(), rival)
            with pytest.raises(TxnConflict):
                await env.txns.txn_offset_commit("B", pid, epoch, GROUP,
                                                 {("a", 0): OffsetCommit(11)}, member=B_MEMBER)
            await env.txns.end_txn("B", pid, epoch, False)
        assert env.txns.stats.conflicts == 3
        pid, epoch = await open_txn(env, "B")
        await env.offsets.commit(GROUP, {("a", 0): OffsetCommit(12)}, env.clock(), B_MEMBER)

    async def after_restart(env: Env) -> None:
        meta = env.txns.describe("B")
        with pytest.raises(TxnConflict):
            await env.txns.txn_offset_commit("B", meta.producer_id, meta.epoch, GROUP,
                                             {("a", 0): OffsetCommit(13)}, member=B_MEMBER)

    run(tmp_path, first, after_restart)


def test_the_committer_survives_a_restart(tmp_path):
    """A committer is persisted."""

    async def first(env: Env) -> None:
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        await env.begin(pid, epoch, [("a", 0)], group=GROUP)
        await env.txns.txn_offset_commit(TID, pid, epoch, GROUP, {("a", 0): OffsetCommit(4)})
        await env.txns.end_txn(TID, pid, epoch, True)

    async def committer_kept(env: Env) -> None:
        committed = env.offsets.committed(GROUP, "a", 0)
        assert (committed.offset, committed.committer) == (4, TID)

    run(tmp_path, first, committer_kept, committer_kept)


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
        assert not env.pending_offsets.is_pending(GROUP, "a", 0)
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
