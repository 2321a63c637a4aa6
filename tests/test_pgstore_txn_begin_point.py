"""A transaction's begin point across gateways (issue 22, the exactly-once gap;
docs/cluster-design.md, "A transaction's begin point across gateways"), at
engine level: two gateways' engines on a throwaway PostgreSQL; the zombie's
transactional id is coordinated by gateway A, the group by gateway B, so its
TxnOffsetCommit is staged by B (``txn_offset_commit_elsewhere``).

The zombie began (AddOffsetsToTxn) before another commit claimed the
partition's range; its TxnOffsetCommit then sends the same offset, or a
later one. On one gateway the offset-range check refuses it (the row's
version is newer than the transaction's begin version: ILLEGAL_GENERATION,
abortable). Here:

- B refuses it the same way, whoever committed the row since: a transaction
  of another id coordinated by B itself, one coordinated by A (its offsets
  staged on B), or a plain OffsetCommit; nothing is staged, and only the
  other commit lands;
- the exceptions one gateway makes hold too: an unchanged, member-fenced
  offset of a predecessor (another member) passes and its commit lands; the
  same offset without a member conflicts;
- the commit has the final word: a row committed after the begin and
  reaching the staged row's expected version anyway (the race between
  staging's check and its insert, made here by hand) refuses the commit
  (UNKNOWN_PRODUCER_ID at EndTxn, abortable), and nothing of it lands;
- a transaction that began after the other commit is not refused.
"""

from __future__ import annotations

import asyncpg
import pytest
from kio.schema.errors import ErrorCode

from kafka_gateway.errors import error_code
from pgstore.migrate import quoted
from testkit import postgres
from testkit.pg_engines import until
from testkit.pg_gateways import (
    LEASE,
    TOPIC,
    Gateway,
    at,
    key_of,
    opened,
    retried,
    rows,
    run_two,
)
from testkit.postgres import PostgresServer
from txn.errors import TxnConflict
from txn.state import TxnState

pg_server = postgres.server_fixture("module")


async def settled(a: Gateway, b: Gateway, *ids: str, group: str) -> None:
    await until(lambda: b.cluster.coordinates(group)
                and all(a.cluster.coordinates(i) or b.cluster.coordinates(i) for i in ids),
                "coordinators settled", 4 * LEASE)
    assert not a.cluster.coordinates(group)


async def committed_by_other(a: Gateway, b: Gateway, group: str, how: str,
                             offset: int) -> str:
    """Commit ``offset`` of the group's partition 0 another way; returns the
    committer ("" for a plain OffsetCommit)."""
    if how == "plain":
        await b.offsets.commit(group, at(offset), 1)
        return ""
    if how == "local":  # another id that B coordinates, with the group
        other = key_of(b.cluster, "other")
        await until(lambda: b.cluster.coordinates(other), "other id settled", 4 * LEASE)
        pid, epoch = await opened(b, other, group)
        await b.txns.txn_offset_commit(other, pid, epoch, group, at(offset))
        await b.txns.end_txn(other, pid, epoch, commit=True)
        return other
    other = key_of(a.cluster, "other")  # coordinated by A: its offsets staged on B
    await until(lambda: a.cluster.coordinates(other), "other id settled", 4 * LEASE)
    pid, epoch = await opened(a, other, group)
    await b.txns.txn_offset_commit_elsewhere(other, pid, epoch, group, at(offset))
    await a.txns.end_txn(other, pid, epoch, commit=True)
    return other


@pytest.mark.parametrize("how", ["plain", "local", "staged"])
@pytest.mark.parametrize("zombie_offset", [10, 12])
def test_a_zombie_staging_after_another_commit_is_refused(
        pg_server: PostgresServer, how: str, zombie_offset: int) -> None:
    async def body(schema: str, a: Gateway, b: Gateway) -> None:
        zombie, group = key_of(a.cluster, "zombie"), key_of(b.cluster, "group")
        await settled(a, b, zombie, group=group)
        zpid, zepoch = await opened(a, zombie, group)  # the zombie's begin
        await retried(lambda: a.txns.add_partitions(zombie, zpid, zepoch, [(TOPIC, 1)]))
        winner = await committed_by_other(a, b, group, how, 10)
        with pytest.raises(TxnConflict) as refused:
            await b.txns.txn_offset_commit_elsewhere(zombie, zpid, zepoch, group,
                                                     at(zombie_offset))
        assert error_code(refused.value, 28, 3) is ErrorCode.illegal_generation
        assert await rows(pg_server, schema, "txn_staged_offsets", group) == []
        # The client aborts (an abortable error).
        await a.txns.end_txn(zombie, zpid, zepoch, commit=False)
        landed = await rows(pg_server, schema, "consumer_offsets", group)
        assert [(r["committed_offset"], r["committer"]) for r in landed] == [(10, winner)]

    run_two(pg_server, body)


def test_an_unchanged_member_fenced_offset_of_a_predecessor_passes(
        pg_server: PostgresServer) -> None:
    async def body(schema: str, a: Gateway, b: Gateway) -> None:
        txn_id, group = key_of(a.cluster, "txn"), key_of(b.cluster, "group")
        await settled(a, b, txn_id, group=group)
        pid, epoch = await opened(a, txn_id, group)
        # The predecessor (another member) commits offset 10 after the begin.
        await b.offsets.commit(group, at(10), 1, member="1:old")
        # Without a member, the same offset conflicts (rule 2, as on one gateway).
        with pytest.raises(TxnConflict):
            await b.txns.txn_offset_commit_elsewhere(txn_id, pid, epoch, group, at(10))
        # Member-fenced by another member: an empty range, passes.
        await b.txns.txn_offset_commit_elsewhere(txn_id, pid, epoch, group, at(10),
                                                 "2:new")
        staged = await rows(pg_server, schema, "txn_staged_offsets", group)
        assert [(r["committed_offset"], r["member"], r["exempt_version"] > 0)
                for r in staged] == [(10, "2:new", True)]
        await a.txns.end_txn(txn_id, pid, epoch, commit=True)
        landed = await rows(pg_server, schema, "consumer_offsets", group)
        assert [(r["committed_offset"], r["committer"], r["member"])
                for r in landed] == [(10, txn_id, "2:new")]
        # A later offset from that member, the row moved since the begin: conflicts.
        await a.txns.add_offsets(txn_id, pid, epoch, group)
        await b.offsets.commit(group, at(11), 1, member="1:old")
        with pytest.raises(TxnConflict):
            await b.txns.txn_offset_commit_elsewhere(txn_id, pid, epoch, group, at(15),
                                                     "2:new")

    run_two(pg_server, body)


def test_the_commit_has_the_final_word_under_the_rows_locks(
        pg_server: PostgresServer) -> None:
    async def body(schema: str, a: Gateway, b: Gateway) -> None:
        zombie, group = key_of(a.cluster, "zombie"), key_of(b.cluster, "group")
        await settled(a, b, zombie, group=group)
        zpid, zepoch = await opened(a, zombie, group)
        await retried(lambda: a.txns.add_partitions(zombie, zpid, zepoch, [(TOPIC, 1)]))
        await b.txns.txn_offset_commit_elsewhere(zombie, zpid, zepoch, group, at(10))
        await b.offsets.commit(group, at(10), 1)  # after the begin and the staging
        # The staging's check passed on the rows before that commit, and its
        # insert read the row after it (the race between the two statements):
        # the staged row expects the new version.
        conn = await asyncpg.connect(pg_server.dsn)
        try:
            s = quoted(schema)
            moved = await conn.execute(
                f"UPDATE {s}.txn_staged_offsets t SET expected_version = c.version "
                f"FROM {s}.consumer_offsets c WHERE c.group_id = t.group_id "
                "AND c.topic = t.topic AND c.partition = t.partition "
                "AND t.transactional_id = $1", zombie)
            assert moved == "UPDATE 1"
        finally:
            await conn.close()
        with pytest.raises(TxnConflict) as refused:
            await a.txns.end_txn(zombie, zpid, zepoch, commit=True)
        assert error_code(refused.value, 26, 3) is ErrorCode.unknown_producer_id
        assert a.txns.txns[zombie].state is TxnState.COMPLETE_ABORT
        landed = await rows(pg_server, schema, "consumer_offsets", group)
        assert [(r["committed_offset"], r["committer"]) for r in landed] == [(10, "")]
        assert await rows(pg_server, schema, "txn_staged_offsets", group) == []

    run_two(pg_server, body)


def test_a_transaction_begun_after_the_other_commit_is_not_refused(
        pg_server: PostgresServer) -> None:
    async def body(schema: str, a: Gateway, b: Gateway) -> None:
        txn_id, group = key_of(a.cluster, "txn"), key_of(b.cluster, "group")
        await settled(a, b, txn_id, group=group)
        winner = await committed_by_other(a, b, group, "staged", 10)
        pid, epoch = await opened(a, txn_id, group)  # begins after that commit
        await b.txns.txn_offset_commit_elsewhere(txn_id, pid, epoch, group, at(12))
        await a.txns.end_txn(txn_id, pid, epoch, commit=True)
        landed = await rows(pg_server, schema, "consumer_offsets", group)
        assert [(r["committed_offset"], r["committer"]) for r in landed] == [(12, txn_id)]
        assert winner != txn_id

    run_two(pg_server, body)


def test_a_zombie_the_groups_gateway_coordinates_is_refused_at_txn_offset_commit(
        pg_server: PostgresServer) -> None:
    """The zombie's id and the group on B, the winner's id on A (its offsets
    staged on B): B reads what A committed before its check, so the zombie
    is refused at TxnOffsetCommit (ILLEGAL_GENERATION), as on one gateway,
    not at EndTxn."""

    async def body(schema: str, a: Gateway, b: Gateway) -> None:
        zombie, group = key_of(b.cluster, "zombie"), key_of(b.cluster, "group")
        await settled(a, b, zombie, group=group)
        assert b.cluster.coordinates(zombie)
        zpid, zepoch = await opened(b, zombie, group)
        await b.txns.add_partitions(zombie, zpid, zepoch, [(TOPIC, 1)])
        winner = await committed_by_other(a, b, group, "staged", 10)
        assert b.txns.pending_offsets.is_pending(group, TOPIC, 0)  # not settled yet
        with pytest.raises(TxnConflict) as refused:
            await b.txns.txn_offset_commit(zombie, zpid, zepoch, group, at(10))
        assert error_code(refused.value, 28, 3) is ErrorCode.illegal_generation
        await b.txns.end_txn(zombie, zpid, zepoch, commit=False)
        landed = await rows(pg_server, schema, "consumer_offsets", group)
        assert [(r["committed_offset"], r["committer"]) for r in landed] == [(10, winner)]

    run_two(pg_server, body)
