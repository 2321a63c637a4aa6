"""TxnOffsetCommit for a transaction another gateway coordinates (issue 22,
"Commits that cross gateways"), at engine level on a throwaway PostgreSQL:
two gateways' engines in one process, each with its ``TransactionCoordinator``
as the server wires it; the transactional id is coordinated by gateway A, the
group by gateway B (chosen by ``coordinator_slot`` and the slots each leads).

- B stages the offsets (``txn_offset_commit_elsewhere``): nothing of them is
  visible before A's EndTxn(commit), which writes them in its commit; B holds
  them pending (require_stable) until ``settle_offsets`` reads them back;
- B's refusals, in Kafka's codes: an unknown id or another producer id
  (INVALID_PRODUCER_ID_MAPPING), an old epoch (INVALID_PRODUCER_EPOCH), a group not
  added (INVALID_TXN_STATE), an offset below the committed one (a conflict),
  a group whose slot B lost (NOT_COORDINATOR); none of them stages anything;
- an abort (EndTxn, and a timeout) deletes what B staged: never visible;
- two transactions, coordinated by different gateways, committing one
  partition's offsets from one view: exactly one wins, in either order; the
  loser's EndTxn(commit) is refused as a conflict, nothing of it lands (nor
  its batches' marker), and its EndTxn(abort) then succeeds;
- transactions begun on both gateways both commit: a begin from a stale view
  of the shared instance counter is refused once and leaves nothing open,
  and a transaction's later changes never set the counter back.
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg
import pytest
from kio.schema.errors import ErrorCode

from kafka_gateway.errors import error_code
from pgstore.migrate import quoted
from tablets.errors import CoordinatorMoved, CounterMoved
from testkit import postgres
from testkit.pg_engines import until
from testkit.pg_gateways import (
    LEASE,
    TOPIC,
    Gateway,
    at,
    close,
    gateway,
    key_of,
    opened,
    retried,
    rows,
    run,
    run_two,
    two_gateways,
)
from testkit.postgres import PostgresServer
from txn.errors import (
    ConcurrentTransactions,
    InvalidProducerIdMapping,
    InvalidTxnState,
    ProducerFenced,
    TxnConflict,
)
from txn.state import TxnState

pg_server = postgres.server_fixture("module")


def test_offsets_staged_by_the_groups_coordinator_land_with_the_commit(
        pg_server: PostgresServer) -> None:
    async def body(schema: str, a: Gateway, b: Gateway) -> None:
        txn_id, group = key_of(a.cluster, "txn"), key_of(b.cluster, "group")
        await until(lambda: a.cluster.coordinates(txn_id) and b.cluster.coordinates(group),
                    "coordinators settled", 4 * LEASE)
        assert not b.cluster.coordinates(txn_id) and not a.cluster.coordinates(group)
        pid, epoch = await opened(a, txn_id, group)
        await b.txns.txn_offset_commit_elsewhere(txn_id, pid, epoch, group,
                                                 {**at(5), **at(7, 1)})
        await b.txns.txn_offset_commit_elsewhere(txn_id, pid, epoch, group, at(6))  # again
        # Nothing visible before the commit; pending on B.
        assert await rows(pg_server, schema, "consumer_offsets", group) == []
        assert b.txns.pending_offsets.is_pending(group, TOPIC, 0)
        await b.txns.settle_offsets(group)  # still open: still held
        assert b.txns.pending_offsets.is_pending(group, TOPIC, 1)
        assert b.offsets.committed(group, TOPIC, 0) is None

        await a.txns.end_txn(txn_id, pid, epoch, commit=True)
        landed = await rows(pg_server, schema, "consumer_offsets", group)
        assert [(r["partition"], r["committed_offset"], r["committer"], r["metadata"])
                for r in landed] == [(0, 6, txn_id, "m"), (1, 7, txn_id, "m")]
        assert await rows(pg_server, schema, "txn_staged_offsets", group) == []
        await b.txns.settle_offsets(group)
        assert not b.txns.pending_offsets.has_pending(group)
        seen = b.offsets.committed(group, TOPIC, 0)
        assert seen is not None and seen.offset == 6

        # The next transaction of the same producer, from the committed view.
        await a.txns.add_offsets(txn_id, pid, epoch, group)
        await b.txns.txn_offset_commit_elsewhere(txn_id, pid, epoch, group, at(9))
        await a.txns.end_txn(txn_id, pid, epoch, commit=True)
        landed = await rows(pg_server, schema, "consumer_offsets", group)
        assert landed[0]["committed_offset"] == 9
        assert landed[0]["version"] > 0

    run_two(pg_server, body)


def test_the_groups_coordinator_refuses_what_the_transaction_does_not_allow(
        pg_server: PostgresServer) -> None:
    async def body(schema: str, a: Gateway, b: Gateway) -> None:
        txn_id, group = key_of(a.cluster, "txn"), key_of(b.cluster, "group")
        other_group = key_of(b.cluster, "group", skip=1)
        await until(lambda: a.cluster.coordinates(txn_id) and b.cluster.coordinates(group),
                    "coordinators settled", 4 * LEASE)
        stage = b.txns.txn_offset_commit_elsewhere
        with pytest.raises(InvalidProducerIdMapping) as unknown:
            await stage("nobody", 1, 0, group, at(1))
        assert error_code(unknown.value) is ErrorCode.invalid_producer_id_mapping
        pid, epoch = await opened(a, txn_id, group)
        with pytest.raises(InvalidProducerIdMapping):
            await stage(txn_id, pid + 1000, epoch, group, at(1))
        with pytest.raises(ProducerFenced) as fenced:
            await stage(txn_id, pid, epoch + 1, group, at(1))
        # As on one gateway (KIP-588 is not for TxnOffsetCommit).
        assert error_code(fenced.value, 28, 3) is ErrorCode.invalid_producer_epoch
        with pytest.raises(InvalidTxnState) as not_added:
            await stage(txn_id, pid, epoch, other_group, at(1))
        assert error_code(not_added.value) is ErrorCode.invalid_txn_state
        # B commits the group's offset 10 itself (a plain OffsetCommit):
        # staging 4 claims a range already processed.
        await b.offsets.commit(group, at(10), 1)
        with pytest.raises(TxnConflict) as behind:
            await stage(txn_id, pid, epoch, group, at(4))
        assert error_code(behind.value, 28, 3) is ErrorCode.illegal_generation
        # A gateway that does not hold the group's slot.
        with pytest.raises(CoordinatorMoved):
            await a.txns.txn_offset_commit_elsewhere(txn_id, pid, epoch, group, at(12))
        assert await rows(pg_server, schema, "txn_staged_offsets", group) == []
        assert await rows(pg_server, schema, "txn_staged_offsets", other_group) == []
        assert not b.txns.pending_offsets.has_pending(group)
        # A new session fences the old one: its staging is refused.
        pid2, epoch2 = await a.txns.init_producer_id(txn_id, 60_000)
        with pytest.raises(ProducerFenced):
            await stage(txn_id, pid, epoch, group, at(12))
        assert (pid2, epoch2) == (pid, epoch + 1)

    run_two(pg_server, body)


def test_an_abort_or_a_timeout_discards_the_staged_offsets(pg_server: PostgresServer) -> None:
    async def body(schema: str, a: Gateway, b: Gateway) -> None:
        txn_id, group = key_of(a.cluster, "txn"), key_of(b.cluster, "group")
        await until(lambda: a.cluster.coordinates(txn_id) and b.cluster.coordinates(group),
                    "coordinators settled", 4 * LEASE)
        pid, epoch = await opened(a, txn_id, group)
        await b.txns.txn_offset_commit_elsewhere(txn_id, pid, epoch, group, at(5))
        assert len(await rows(pg_server, schema, "txn_staged_offsets", group)) == 1
        await a.txns.end_txn(txn_id, pid, epoch, commit=False)
        assert await rows(pg_server, schema, "txn_staged_offsets", group) == []
        assert await rows(pg_server, schema, "consumer_offsets", group) == []
        await b.txns.settle_offsets(group)
        assert not b.txns.pending_offsets.has_pending(group)
        assert b.offsets.committed(group, TOPIC, 0) is None

        # A timeout aborts too (and bumps the epoch, as Kafka does).
        await a.txns.add_offsets(txn_id, pid, epoch, group)
        await b.txns.txn_offset_commit_elsewhere(txn_id, pid, epoch, group, at(8))
        a.txns.txns[txn_id].timeout_ms = 1
        await asyncio.sleep(0.01)
        await a.txns.expire()
        assert a.txns.txns[txn_id].state is TxnState.COMPLETE_ABORT
        assert await rows(pg_server, schema, "txn_staged_offsets", group) == []
        assert await rows(pg_server, schema, "consumer_offsets", group) == []

    run_two(pg_server, body)


@pytest.mark.parametrize("first", ["staged", "local"])
def test_two_gateways_committing_one_partitions_range_exactly_one_wins(
        pg_server: PostgresServer, first: str) -> None:
    """``staged``: coordinated by A, its offsets staged on B; ``local``:
    coordinated by B, which also coordinates the group. Both claim [0, n)
    of one partition from one view; ``first`` commits first."""

    async def body(schema: str, a: Gateway, b: Gateway) -> None:
        staged_id, group = key_of(a.cluster, "txn"), key_of(b.cluster, "group")
        local_id = key_of(b.cluster, "txn")
        await until(lambda: a.cluster.coordinates(staged_id)
                    and b.cluster.coordinates(group) and b.cluster.coordinates(local_id),
                    "coordinators settled", 4 * LEASE)
        # Each transaction also produced a batch: the loser's must not land.
        spid, sepoch = await opened(a, staged_id, group)
        lpid, lepoch = await opened(b, local_id, group)
        await retried(lambda: a.txns.add_partitions(staged_id, spid, sepoch, [(TOPIC, 0)]))
        await b.txns.add_partitions(local_id, lpid, lepoch, [(TOPIC, 1)])
        await b.txns.txn_offset_commit_elsewhere(staged_id, spid, sepoch, group, at(10))
        await b.txns.txn_offset_commit(local_id, lpid, lepoch, group, at(20))

        ends = {"staged": lambda: a.txns.end_txn(staged_id, spid, sepoch, commit=True),
                "local": lambda: b.txns.end_txn(local_id, lpid, lepoch, commit=True)}
        second = "local" if first == "staged" else "staged"
        await ends[first]()
        with pytest.raises(TxnConflict) as lost:
            await ends[second]()
        assert error_code(lost.value, 26, 3) is ErrorCode.unknown_producer_id
        landed = await rows(pg_server, schema, "consumer_offsets", group)
        winner = staged_id if first == "staged" else local_id
        assert [(r["committed_offset"], r["committer"]) for r in landed] == [
            (10 if first == "staged" else 20, winner)]
        assert await rows(pg_server, schema, "txn_staged_offsets", group) == []
        # The loser's transaction is aborted: no marker on its partition,
        # and the client's EndTxn(abort) that follows succeeds.
        loser = b if first == "staged" else a
        loser_id = local_id if first == "staged" else staged_id
        loser_pid, loser_epoch = (lpid, lepoch) if first == "staged" else (spid, sepoch)
        assert loser.txns.txns[loser_id].state is TxnState.COMPLETE_ABORT
        await loser.txns.end_txn(loser_id, loser_pid, loser_epoch, commit=False)
        # No batch was produced: the winner's commit wrote its marker
        # (log end 1), the loser's none (0), whatever gateway leads them.
        loser_partition = 1 if first == "staged" else 0
        conn = await asyncpg.connect(pg_server.dsn)
        try:
            log_ends = {row["partition"]: row["log_end_offset"] for row in await conn.fetch(
                f"SELECT p.partition, p.log_end_offset FROM {quoted(schema)}.partitions p "
                f"JOIN {quoted(schema)}.topics t USING (topic_id) WHERE t.name = $1",
                TOPIC)}
        finally:
            await conn.close()
        assert log_ends == {loser_partition: 0, 1 - loser_partition: 1}, log_ends
        # B reads the group again and agrees.
        await b.txns.settle_offsets(group)
        conn = await asyncpg.connect(pg_server.dsn)
        try:
            await b.offsets.load_group(conn, group)
        finally:
            await conn.close()
        seen = b.offsets.committed(group, TOPIC, 0)
        assert seen is not None and seen.committer == winner

    run_two(pg_server, body)


def test_a_producer_id_another_gateway_took_is_allocated_again(
        pg_server: PostgresServer, caplog: pytest.LogCaptureFixture) -> None:
    """Gateways share the producer-id counter. InitProducerId on a gateway
    whose view of it is stale (the other allocated since) loses the
    compare-and-set, learns the stored value and allocates again: the client
    gets an id, never a storage error (librdkafka backed off a second from
    it, and a producer acknowledged nothing meanwhile)."""

    async def body() -> None:
        _, a, b = await two_gateways(pg_server)
        try:
            ids: list[int] = []
            for round_ in range(5):  # each call follows one of the other gateway
                for gw in (a, b):
                    ids.append((await gw.txns.init_producer_id(None, 0))[0])
                # A new transactional id's first session, too.
                b_id = key_of(b.cluster, f"first-{round_}")
                ids.append((await b.txns.init_producer_id(b_id, 60_000))[0])
                ids.append((await a.txns.init_producer_id(None, 0))[0])
            assert len(set(ids)) == len(ids) == 20, ids
        finally:
            await close(a, b)

    with caplog.at_level(logging.INFO, logger="txn.sessions"):
        run(body)
    lost = [r for r in caplog.records if "taken by another gateway" in r.getMessage()]
    assert len(lost) >= 9, "the race was never lost: the test proves nothing"


def test_transactions_begun_on_two_gateways_both_commit(pg_server: PostgresServer) -> None:
    """Each gateway takes transaction instances from the shared counter. A
    begin from a stale view of it is refused once (``CounterMoved``, nothing
    written: the transaction is not open, here either; answered
    CONCURRENT_TRANSACTIONS, which clients retry), its retry begins
    it; a transaction that began before another gateway moved the counter
    still commits (its later changes do not set the counter again)."""

    async def body(schema: str, a: Gateway, b: Gateway) -> None:
        a_id, b_id = key_of(a.cluster, "txn"), key_of(b.cluster, "txn")
        group = key_of(b.cluster, "group")
        apid, aepoch = await a.txns.init_producer_id(a_id, 60_000)
        bpid, bepoch = await b.txns.init_producer_id(b_id, 60_000)
        await a.txns.add_partitions(a_id, apid, aepoch, [(TOPIC, 0)])  # a: instance 1
        with pytest.raises(ConcurrentTransactions) as refused:  # b's view: none
            await b.txns.add_partitions(b_id, bpid, bepoch, [(TOPIC, 1)])
        assert isinstance(refused.value.__cause__, CounterMoved)
        assert error_code(refused.value) is ErrorCode.concurrent_transactions
        assert not b.txns.txns[b_id].is_open and b.txns.open_count == 0
        assert b.txns.txns[b_id].partitions == {}
        await b.txns.add_partitions(b_id, bpid, bepoch, [(TOPIC, 1)])
        assert b.txns.txns[b_id].instance > a.txns.txns[a_id].instance
        # a's transaction goes on and commits, with offsets b stages.
        await a.txns.add_offsets(a_id, apid, aepoch, group)
        await b.txns.txn_offset_commit_elsewhere(a_id, apid, aepoch, group, at(3))
        await a.txns.end_txn(a_id, apid, aepoch, commit=True)
        await b.txns.end_txn(b_id, bpid, bepoch, commit=True)
        landed = await rows(pg_server, schema, "consumer_offsets", group)
        assert [(r["committed_offset"], r["committer"]) for r in landed] == [(3, a_id)]

    run_two(pg_server, body)


def test_a_new_coordinator_of_the_group_holds_what_its_predecessor_staged(
        pg_server: PostgresServer) -> None:
    """Offsets B staged are pending on a gateway that reads the group later
    (as one gaining the group's slot does: ``load_group``) and on one that
    starts meanwhile (``load``); once the id's coordinator commits, each
    answers the committed offsets when it next settles, though neither saw
    the commit happen (without holding them, their memory would keep the
    offset read before the commit)."""

    async def body() -> None:
        schema, a, b = await two_gateways(pg_server)
        c: Gateway | None = None
        try:
            txn_id, group = key_of(a.cluster, "txn"), key_of(b.cluster, "group")
            await until(lambda: a.cluster.coordinates(txn_id) and b.cluster.coordinates(group),
                        "coordinators settled", 4 * LEASE)
            await b.offsets.commit(group, at(2), 1)  # a plain commit first: offset 2
            pid, epoch = await opened(a, txn_id, group)
            await b.txns.txn_offset_commit_elsewhere(txn_id, pid, epoch, group, at(6))
            conn = await asyncpg.connect(pg_server.dsn)
            try:
                await a.offsets.load_group(conn, group)  # as a slot gained does
            finally:
                await conn.close()
            c = await gateway(pg_server, schema, 3)  # starts with them staged
            for each in (a, c):
                assert each.txns.pending_offsets.is_pending(group, TOPIC, 0)
                seen = each.offsets.committed(group, TOPIC, 0)
                assert seen is not None and seen.offset == 2
                await each.txns.settle_offsets(group)  # still open: still held
                assert each.txns.pending_offsets.is_pending(group, TOPIC, 0)

            await a.txns.end_txn(txn_id, pid, epoch, commit=True)
            for each in (a, b, c):
                await each.txns.settle_offsets(group)
                assert not each.txns.pending_offsets.has_pending(group)
                seen = each.offsets.committed(group, TOPIC, 0)
                assert seen is not None and (seen.offset, seen.committer) == (6, txn_id)
        finally:
            await close(a, b, *([] if c is None else [c]))

    run(body)
