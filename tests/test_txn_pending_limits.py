"""The limits on open transactions' stored batches (``gateway.txn.max.bytes``
per transaction, ``gateway.txn.pending.disk.bytes`` node-wide), over a real
StorageEngine: the batch that would cross one is refused before anything of
it is written, its transaction is made abort-only (later batches and EndTxn(commit)
fail, an abort gives the bytes back), and the counts survive a restart."""

from __future__ import annotations

import os
import re

import pytest

from tablets import batch as batch_header
from tablets import keys, log_entry, validate
from tablets.consumer_offsets import OffsetCommit
from tablets.errors import BatchRefused
from testkit.batches import GZIP, make_batch
from testkit.txn import GROUP, TID, TIMEOUT_MS, Env, run
from txn import TxnSettings, TxnState
from txn.errors import TxnConflict, TxnDoomed

VALUE = b"v" * 1000
# One batch of one VALUE record, as stored (the size does not depend on the ids).
BATCH = len(make_batch([VALUE], producer_id=1, producer_epoch=0, base_sequence=0,
                       attributes=batch_header.ATTR_TRANSACTIONAL))


def stored_blob_bytes(env: Env) -> int:
    """What the store holds of open transactions' batches, read from the store
    (the sizes of the batches their pending entries name)."""
    return sum(log_entry.size(value)
               for meta in env.txns.list({TxnState.ONGOING}) for tp in meta.partitions
               for _, value in env.engine.store.scan(
                   *keys.blob_range(env.engine.partition(*tp).prefix, meta.instance)))


async def made_abort_only_by(env: Env, limit: str, pid: int, epoch: int,
                             tp: tuple[str, int], tid: str = TID) -> None:
    """The next batch of ``tp`` is refused for ``limit`` and nothing of it is stored."""
    blobs, stored = env.blobs(), env.txns.pending_bytes
    counted = dict(env.txns.stats.over_limit)
    with pytest.raises(TxnDoomed, match=re.escape(limit)):
        await env.produce(pid, epoch, tp, [VALUE], tid=tid)
    env.seqs[(pid, *tp)] += 1  # it took its sequence number all the same
    assert env.blobs() == blobs and env.txns.pending_bytes == stored == stored_blob_bytes(env)
    counted[{"gateway.txn.max.bytes": "transaction",
            "gateway.txn.pending.disk.bytes": "node"}[limit]] += 1
    assert env.txns.stats.over_limit == counted
    assert env.txns.describe(tid).abort_only is not None
    assert env.txns.stats.conflicts == 0  # a limit is not an offset conflict


def test_a_transaction_past_its_limit_is_abort_only_and_its_abort_gives_the_bytes_back(tmp_path):
    async def phase(env: Env) -> None:
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        await env.begin(pid, epoch, [("a", 0), ("a", 1)])
        for _ in range(3):  # exactly at the limit: allowed
            await env.produce(pid, epoch, ("a", 0), [VALUE])
        assert env.txns.pending_bytes == 3 * BATCH == stored_blob_bytes(env)
        assert env.txns.pending_of(TID) == (3 * BATCH, 3 * BATCH)
        assert env.txns.pending_memory_bytes == 3 * BATCH
        await made_abort_only_by(env, "gateway.txn.max.bytes", pid, epoch, ("a", 0))
        # Abort-only: every later batch is refused, also a small one of another partition.
        with pytest.raises(TxnDoomed, match="can only abort"):
            await env.produce(pid, epoch, ("a", 1), [b"x"])
        assert env.txns.stats.over_limit == {"transaction": 1, "node": 0}
        with pytest.raises(TxnConflict, match=r"gateway\.txn\.max\.bytes"):
            await env.txns.end_txn(TID, pid, epoch, True)  # aborted instead
        meta = env.txns.describe(TID)
        assert (meta.state, meta.abort_only) == (TxnState.COMPLETE_ABORT, None)
        assert env.blobs() == [] and await env.log(("a", 0)) == []
        assert (env.txns.pending_bytes, env.txns.pending_memory_bytes) == (0, 0)
        assert env.txns.pending_of(TID) is None
        # The next transaction works. A refused batch's sequence numbers may be
        # sent again (kafkajs counts them unused) or skipped (librdkafka counts
        # them used); a retry of it after a later batch is never taken for stored.
        await env.begin(pid, epoch, [("a", 0), ("a", 1)])
        await env.produce(pid, epoch, ("a", 0), [b"again"], seq=3)
        await env.produce(pid, epoch, ("a", 1), [b"after"], seq=1)
        with pytest.raises(BatchRefused, match="refused before"):
            await env.produce(pid, epoch, ("a", 1), [b"x"], seq=0)
        await env.produce(pid, epoch, ("a", 0), [b"again"], seq=3)  # a duplicate now
        await env.txns.end_txn(TID, pid, epoch, True)
        assert [v for _, v in await env.record_values(("a", 0))] == [b"again"]
        assert [v for _, v in await env.record_values(("a", 1))] == [b"after"]
        assert env.txns.pending_bytes == 0

    run(tmp_path, phase, settings=TxnSettings(max_txn_bytes=3 * BATCH))


def test_the_node_limit_makes_the_transaction_whose_batch_crosses_it_abort_only(tmp_path):
    async def phase(env: Env) -> None:
        first, e1 = await env.txns.init_producer_id("first", TIMEOUT_MS)
        second, e2 = await env.txns.init_producer_id("second", TIMEOUT_MS)
        await env.begin(first, e1, [("a", 0)], tid="first")
        await env.begin(second, e2, [("b", 0)], tid="second")
        for _ in range(2):
            await env.produce(first, e1, ("a", 0), [VALUE], tid="first")
        await env.produce(second, e2, ("b", 0), [VALUE], tid="second")
        await made_abort_only_by(env, "gateway.txn.pending.disk.bytes", second, e2, ("b", 0),
                                 tid="second")
        assert env.txns.describe("first").abort_only is None
        await env.txns.end_txn("first", first, e1, True)  # the other one commits
        assert env.txns.pending_bytes == BATCH == stored_blob_bytes(env)
        # room again, but the abort-only transaction stays so until it aborts
        with pytest.raises(TxnDoomed):
            await env.produce(second, e2, ("b", 0), [VALUE], tid="second")
        env.seqs[(second, "b", 0)] += 1
        await env.txns.end_txn("second", second, e2, False)
        assert env.txns.pending_bytes == 0 == stored_blob_bytes(env)
        await env.begin(second, e2, [("b", 0)], tid="second")
        for _ in range(3):
            await env.produce(second, e2, ("b", 0), [VALUE], tid="second")
        await env.txns.end_txn("second", second, e2, True)
        assert env.txns.stats.over_limit == {"transaction": 0, "node": 1}

    run(tmp_path, phase, settings=TxnSettings(pending_disk_bytes=3 * BATCH))


def test_a_batch_checked_off_the_event_loop_is_refused_as_well(tmp_path):
    """Compressed batches are checked on a worker thread: the refusal reaches
    the append's future, and nothing is written."""

    async def phase(env: Env) -> None:
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        await env.begin(pid, epoch, [("a", 0)])
        await env.produce(pid, epoch, ("a", 0), [VALUE])
        sink = env.txns.sink_for(TID, pid, epoch, "a", 0)
        compressed = make_batch([os.urandom(600)], producer_id=pid, producer_epoch=epoch,
                                base_sequence=1, attributes=batch_header.ATTR_TRANSACTIONAL,
                                codec=GZIP)
        assert len(compressed) > 500
        assert not validate.runs_inline(batch_header.parse_batches(compressed)[0])
        with pytest.raises(TxnDoomed, match=r"gateway\.txn\.max\.bytes"):
            await env.engine.partition("a", 0).append(compressed, env.clock(), sink)
        assert env.txns.pending_bytes == BATCH == stored_blob_bytes(env)
        assert len(env.blobs()) == 1

    run(tmp_path, phase, settings=TxnSettings(max_txn_bytes=BATCH + 500))


def test_no_limit(tmp_path):
    async def phase(env: Env) -> None:
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        await env.begin(pid, epoch, [("a", 0)])
        for _ in range(20):
            await env.produce(pid, epoch, ("a", 0), [VALUE])
        await env.txns.end_txn(TID, pid, epoch, True)
        assert env.txns.stats.over_limit == {"transaction": 0, "node": 0}

    run(tmp_path, phase, settings=TxnSettings(pending_disk_bytes=-1, max_txn_bytes=-1))


def test_the_counts_and_the_abort_only_reason_survive_a_restart(tmp_path):
    """After a restart the stored bytes are counted again from the store (and
    none are held in memory); an abort-only transaction still is."""
    ids: dict[str, tuple[int, int]] = {}
    settings = TxnSettings(pending_disk_bytes=5 * BATCH, max_txn_bytes=3 * BATCH)

    async def before(env: Env) -> None:
        for tid, tp, batches in (("open", ("a", 0), 2), ("abort-only", ("b", 0), 3)):
            pid, epoch = ids[tid] = await env.txns.init_producer_id(tid, TIMEOUT_MS)
            await env.begin(pid, epoch, [tp], tid=tid)
            for _ in range(batches):
                await env.produce(pid, epoch, tp, [VALUE], tid=tid)
        await made_abort_only_by(env, "gateway.txn.max.bytes", *ids["abort-only"], ("b", 0),
                                 tid="abort-only")
        assert env.txns.pending_bytes == 5 * BATCH

    async def after(env: Env) -> None:
        assert env.txns.pending_bytes == 5 * BATCH == stored_blob_bytes(env)
        assert env.txns.pending_memory_bytes == 0
        assert env.txns.pending_of("open") == (2 * BATCH, 0)
        assert env.txns.pending_of("abort-only") == (3 * BATCH, 0)
        pid, epoch = ids["open"]
        env.seqs[(pid, "a", 0)] = 2
        # the node is at its limit, counting what was recovered
        await made_abort_only_by(env, "gateway.txn.pending.disk.bytes", pid, epoch, ("a", 0),
                                 tid="open")
        pid, epoch = ids["abort-only"]
        env.seqs[(pid, "b", 0)] = 4
        with pytest.raises(TxnDoomed, match=r"gateway\.txn\.max\.bytes"):
            await env.produce(pid, epoch, ("b", 0), [b"x"], tid="abort-only")
        with pytest.raises(TxnConflict):
            await env.txns.end_txn("abort-only", pid, epoch, True, env.connect())
        await env.txns.end_txn("open", *ids["open"], False, env.connect())
        assert env.txns.pending_bytes == 0 == stored_blob_bytes(env)

    run(tmp_path, before, after, settings=settings)


def test_a_transaction_abort_only_after_a_conflict_refuses_its_batches_too(tmp_path):
    async def phase(env: Env) -> None:
        await env.offsets.commit(GROUP, {("a", 0): OffsetCommit(5)}, env.clock())
        pid, epoch = await env.txns.init_producer_id(TID, TIMEOUT_MS)
        await env.begin(pid, epoch, [("a", 0)], group=GROUP)
        await env.produce(pid, epoch, ("a", 0), [VALUE])
        with pytest.raises(TxnConflict):  # offset 5 is not past the committed 5
            await env.txns.txn_offset_commit(TID, pid, epoch, GROUP,
                                             {("a", 0): OffsetCommit(5)})
        with pytest.raises(TxnDoomed, match="can only abort"):
            await env.produce(pid, epoch, ("a", 0), [VALUE])
        assert env.txns.pending_bytes == BATCH == stored_blob_bytes(env)
        assert env.txns.stats.over_limit == {"transaction": 0, "node": 0}
        assert env.txns.stats.conflicts == 1
        await env.txns.end_txn(TID, pid, epoch, False)
        assert env.txns.pending_bytes == 0

    run(tmp_path, phase)
