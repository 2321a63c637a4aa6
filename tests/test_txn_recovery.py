"""Transactions across time and restarts: timeouts and id expiry on a fake
clock, open and completed transactions after the engine is closed and
reopened, truncation of committed batches' blobs, a topic deleted under an
open transaction, LogAppendTime topics."""

from __future__ import annotations

import asyncio
import json

import pytest

from tablets import batch as batch_header
from tablets import keys
from tablets.consumer_offsets import OffsetCommit
from tablets.rocks_store import Ops
from tablets.txn_storage import partitions_range
from testkit.batches import make_batch
from testkit.compaction import as_batches
from testkit.txn import GROUP, PARTITIONS, TID, TIMEOUT_MS, Clock, Env, run
from txn import TxnState
from txn.errors import InvalidTxnState, ProducerFenced, TransactionalIdNotFound

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
        assert env.blobs() == [] and not env.pending_offsets.is_pending(GROUP, "a", 0)
        for commit in (True, False):
            with pytest.raises(ProducerFenced):
                await env.txns.end_txn(TID, pid, epoch, commit)
        with pytest.raises(ProducerFenced):
            env.txns.sink_for(TID, pid, epoch, "a", 0)
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
        assert meta.partitions == {tp: env.engine.partition(*tp).topic_id for tp in PARTITIONS}
        assert len(env.blobs()) == 8
        assert env.pending_offsets.is_pending(GROUP, "b", 0)
        assert env.txns.pending_bytes > 0
        # Its sequences are known too: the next batch continues them.
        await env.produce(pid, epoch, ("a", 0), [b"four"], seq=3)
        await env.txns.end_txn(TID, pid, epoch, True, env.connect())
        assert [v for _, v in await env.record_values(("a", 0))] == [
            b"one", b"two", b"three", b"four"]
        assert await env.log(("b", 1)) == [(0, False, 2), (2, False, 1), (3, True, 1)]
        assert env.offsets.committed(GROUP, "b", 0).offset == 9
        assert not env.pending_offsets.is_pending(GROUP, "b", 0)

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
        assert [v for _, v in await env.record_values(("a", 0))] == [b"y"]

    run(tmp_path, first, recovered, later)


def test_producer_ids_are_not_reused_after_a_restart(tmp_path):
    seen: list[int] = []

    async def phase(env: Env) -> None:
        seen.append((await env.txns.init_producer_id(f"t{len(seen)}", TIMEOUT_MS))[0])
        seen.append((await env.txns.init_producer_id(None, 0))[0])

    run(tmp_path, phase, phase, phase)
    assert len(set(seen)) == 6


# ------------------------------------------------------------ truncation, topics


async def sizes(tablet) -> list[tuple[int, int]]:
    """(base offset, size) of every batch of a partition's log."""
    read = await tablet.read(tablet.log_start_offset, 1 << 30)
    return [(batch_header.base_offset_of(b), len(b)) for b in as_batches(read.batches)]


def test_truncation_frees_the_bytes_of_committed_batches(tmp_path):
    async def phase(env: Env) -> None:
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        await env.begin(pid, epoch, [("a", 0)])
        await env.produce(pid, epoch, ("a", 0), [b"x", b"y"])
        await env.produce(pid, epoch, ("a", 0), [b"z"])
        await env.txns.end_txn(TID, pid, epoch, True)
        tablet = env.engine.partition("a", 0)
        assert env.blobs() == []  # moved into the log
        batches = [size for _o, size in await sizes(tablet)]
        assert env.stored_bytes(("a", 0)) == sum(batches)
        assert await tablet.delete_records(2) == 2  # the first batch (0-1) goes
        assert env.stored_bytes(("a", 0)) == sum(batches[1:])
        assert await tablet.delete_records(-1) == 4
        assert env.stored_bytes(("a", 0)) == 0

    run(tmp_path, phase)


def test_a_topic_deleted_and_recreated_under_an_open_transaction(tmp_path):
    async def phase(env: Env) -> None:
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        await env.begin(pid, epoch, [("a", 0), ("a", 1), ("b", 0)])
        await env.produce(pid, epoch, ("a", 0), [b"gone"])
        await env.produce(pid, epoch, ("b", 0), [b"kept"])
        await env.engine.delete_topic("a")
        await env.engine.create_topic("a", 2, {})
        # The new topic "a" is not in the transaction: nothing of it goes there.
        with pytest.raises(InvalidTxnState, match="deleted and recreated"):
            env.txns.sink_for(TID, pid, epoch, "a", 0)
        await env.txns.end_txn(TID, pid, epoch, True)
        assert_untouched(env, "a")  # no COMMIT marker in the new topic
        assert await env.record_values(("b", 0)) == [(0, b"kept")]

    async def after_restart(env: Env) -> None:  # every log entry still resolves
        assert_untouched(env, "a")
        assert await env.record_values(("b", 0)) == [(0, b"kept")]

    run(tmp_path, phase, after_restart)


def test_a_topic_recreated_under_an_open_transaction_across_a_restart(tmp_path):
    """The topic ids are persisted with the partitions: a restart between the
    recreation and the commit (or the abort) changes nothing."""
    ids: list[int] = []

    async def first(env: Env) -> None:
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        ids.extend((pid, epoch))
        await env.begin(pid, epoch, [("a", 0), ("a", 1), ("b", 0)])
        await env.produce(pid, epoch, ("a", 1), [b"gone"])
        await env.produce(pid, epoch, ("b", 0), [b"kept"])
        await env.engine.delete_topic("a")
        await env.engine.create_topic("a", 2, {})

    async def commit(env: Env) -> None:
        pid, epoch = ids
        meta = env.txns.describe(TID)
        assert meta.state is TxnState.ONGOING
        assert meta.partitions[("a", 0)] != env.engine.partition("a", 0).topic_id
        await env.txns.end_txn(TID, pid, epoch, True, env.connect())
        assert_untouched(env, "a")
        assert await env.record_values(("b", 0)) == [(0, b"kept")]

    async def abort_next(env: Env) -> None:
        assert_untouched(env, "a")
        pid, epoch = ids
        await env.begin(pid, epoch, [("a", 0), ("b", 1)])
        await env.produce(pid, epoch, ("b", 1), [b"aborted"])
        await env.engine.delete_topic("a")
        await env.engine.create_topic("a", 1, {})
        await env.txns.end_txn(TID, pid, epoch, False)
        assert_untouched(env, "a")
        assert await env.log(("b", 1)) == []
        assert env.engine.store.get(keys.topic_key("a")) is not None

    run(tmp_path, first, commit, abort_next)


def test_a_partition_re_added_after_its_topic_was_recreated_is_the_new_topic(tmp_path):
    async def phase(env: Env) -> None:
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        await env.begin(pid, epoch, [("a", 0)])
        await env.produce(pid, epoch, ("a", 0), [b"old topic"])
        await env.engine.delete_topic("a")
        await env.engine.create_topic("a", 2, {})
        await env.begin(pid, epoch, [("a", 0)])  # AddPartitionsToTxn again
        await env.produce(pid, epoch, ("a", 0), [b"new topic"], seq=0)  # a new partition

    async def after_restart(env: Env) -> None:
        pid, epoch = env.txns.describe(TID).producer_id, env.txns.describe(TID).epoch
        assert env.txns.describe(TID).partitions == {
            ("a", 0): env.engine.partition("a", 0).topic_id}
        await env.txns.end_txn(TID, pid, epoch, True, env.connect())
        assert await env.record_values(("a", 0)) == [(0, b"new topic")]
        assert await env.log(("a", 0)) == [(0, False, 1), (1, True, 1)]

    run(tmp_path, phase, after_restart)


def assert_untouched(env: Env, topic: str) -> None:
    """Every partition of ``topic`` is empty: no record, no marker."""
    for tablet in env.engine.topic(topic).partitions:
        assert (tablet.log_start_offset, tablet.high_watermark) == (0, 0), tablet


MANY = 3_000


def test_an_open_transaction_with_many_partitions_survives_a_restart(tmp_path):
    """Each partition is its own key, written when added: after a restart the
    open transaction has every one of them, and the commit marks each."""
    ids: list[int] = []

    async def first(env: Env) -> None:
        await env.engine.create_topic("many", MANY, {})
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        ids.extend((pid, epoch))
        for index in range(MANY):  # one AddPartitionsToTxn each, as a client adding them
            await env.begin(pid, epoch, [("many", index)])
        for index in (0, MANY - 1):
            await env.produce(pid, epoch, ("many", index), [b"data"])
        await env.txns.add_partitions(TID, pid, epoch, [("many", 5)])  # again: nothing new

    async def recovered(env: Env) -> None:
        pid, epoch = ids
        topic_id = env.engine.topic("many").topic_id
        meta = env.txns.describe(TID)
        assert meta.partitions == {("many", index): topic_id for index in range(MANY)}
        await env.txns.end_txn(TID, pid, epoch, True, env.connect())
        tablets = env.engine.topic("many").partitions
        assert [t.high_watermark for t in tablets] == [2] + [1] * (MANY - 2) + [2]
        start, end = keys.TXN_PARTITION, keys.TXN_PARTITION + b"\xff"
        assert list(env.engine.store.scan(start, end)) == []  # dropped with the commit

    async def completed(env: Env) -> None:
        assert env.txns.describe(TID).state is TxnState.COMPLETE_COMMIT
        assert env.txns.describe(TID).partitions == {}
        assert await env.log(("many", MANY - 1)) == [(0, False, 1), (1, True, 1)]

    run(tmp_path, first, recovered, completed)


def test_an_open_transaction_in_the_earlier_state_format_still_commits(tmp_path):
    """State written before partitions had their own keys (listed in the state
    record, without topic ids): they take the ids of the topics at load, and
    their keys are written with the next change."""
    ids: list[int] = []

    async def earlier(env: Env) -> None:
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        ids.extend((pid, epoch))
        await env.begin(pid, epoch, [("a", 0), ("b", 1)])
        await env.produce(pid, epoch, ("a", 0), [b"x"])
        meta = env.txns.describe(TID)
        record = json.loads(meta.encode())
        record["partitions"] = sorted(meta.partitions)
        ops = Ops()
        ops.put(keys.txn_state_key(TID), json.dumps(record).encode())
        for key, _value in env.engine.store.scan(*partitions_range(TID, meta.instance)):
            ops.delete(key)
        await env.engine.writer.submit(ops)

    async def loaded(env: Env) -> None:
        pid, epoch = ids
        meta = env.txns.describe(TID)
        assert meta.partitions == {tp: env.engine.partition(*tp).topic_id
                                   for tp in (("a", 0), ("b", 1))}
        await env.begin(pid, epoch, [("b", 0)])  # writes every partition's key

    async def migrated(env: Env) -> None:
        pid, epoch = ids
        meta = env.txns.describe(TID)
        assert "partitions" not in json.loads(env.engine.store.get(keys.txn_state_key(TID)))
        assert set(meta.partitions) == {("a", 0), ("b", 1), ("b", 0)}
        await env.txns.end_txn(TID, pid, epoch, True, env.connect())
        assert [await env.log(tp) for tp in (("a", 0), ("b", 1), ("b", 0))] == [
            [(0, False, 1), (1, True, 1)], [(0, True, 1)], [(0, True, 1)]]

    run(tmp_path, earlier, loaded, migrated)


def test_log_append_time_topics_stamp_transactional_batches(tmp_path):
    async def phase(env: Env) -> None:
        await env.engine.create_topic("lat", 1, {"message.timestamp.type": "LogAppendTime"})
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        await env.begin(pid, epoch, [("lat", 0)])
        batch = make_batch([b"x", b"y"], base_timestamp=5, producer_id=pid,
                           producer_epoch=epoch, base_sequence=0,
                           attributes=batch_header.ATTR_TRANSACTIONAL)
        sink = env.txns.sink_for(TID, pid, epoch, "lat", 0)
        produced_at = env.clock()
        result = await env.engine.partition("lat", 0).append(batch, produced_at, sink)
        assert (result.base_offset, result.log_append_time) == (-1, produced_at)
        env.clock.now += 1000
        await env.txns.end_txn(TID, pid, epoch, True)
        read = await env.engine.partition("lat", 0).read(0, 1 << 20)
        # From the segment file (nobody read the partition: no tail beyond its
        # newest batch, the COMMIT marker), patched first bytes then a region.
        [header] = batch_header.parse_batches(as_batches(read.batches)[0])  # the CRC holds
        assert header.attributes & batch_header.ATTR_TIMESTAMP_TYPE
        assert header.max_timestamp == produced_at
        assert await env.engine.partition("lat", 0).offset_for_timestamp(produced_at) == (
            0, produced_at)

    run(tmp_path, phase)
