"""Idempotent producer state: the engine-free rules (tablets.producer_rules)
alone, over a persistence port that records what they stage; the RocksDB
engine's port (tablets.producers); and through a tablet: sequence checks,
duplicates, epochs, wrap-around, expiry, eviction, encoding, and a retried
batch recognised after a restart of the storage engine."""

from __future__ import annotations

import asyncio

import pytest

from tablets import EngineSettings, StorageEngine
from tablets.errors import InvalidProducerEpoch, OutOfOrderSequence, UnknownProducerId
from tablets.producer_rules import (
    CACHED_BATCHES,
    INT32_MAX,
    REFUSED,
    CachedBatch,
    ProducerEntry,
    ProducerStates,
    next_seq,
)
from tablets.producers import StoredProducers, producer_key, producer_states
from tablets.records import record_timestamps
from tablets.rocks_store import Ops
from testkit.batches import make_batch
from testkit.compaction import as_batches

PID = 7


Staged = list[tuple[str, int, bytes]]  # ("put" | "delete", producer id, encoded entry)


class Recorded:
    """A persistence port whose atomic change is a list of what was staged:
    the rules with no engine under them."""

    def __init__(self, entries: list[tuple[int, ProducerEntry]] | None = None) -> None:
        self.entries = entries or []

    def load(self) -> list[tuple[int, ProducerEntry]]:
        return list(self.entries)

    def stage_entry(self, change: Staged, producer_id: int, entry: ProducerEntry) -> None:
        change.append(("put", producer_id, entry.encode()))

    def stage_removal(self, change: Staged, producer_id: int) -> None:
        change.append(("delete", producer_id, b""))


def states(max_producers: int = 100) -> ProducerStates[Staged]:
    return ProducerStates(Recorded(), max_producers)


def removed(change: Staged) -> list[int]:
    return [pid for what, pid, _ in change if what == "delete"]


def write(s: ProducerStates[Staged], pid: int, epoch: int, first: int, count: int,
          offset: int, now: int = 0) -> Staged:
    """Check a batch of ``count`` records and, when new, record it at ``offset``."""
    last = next_seq(first, count - 1)
    assert s.check(pid, epoch, first, last) is None
    change: Staged = []
    s.stage(pid, epoch, CachedBatch(first, last, offset), now, change)
    assert change[0] == ("put", pid, s.get(pid).encode())
    return change


def test_a_new_producer_must_start_at_sequence_zero():
    s = states()
    with pytest.raises(UnknownProducerId):
        s.check(PID, 0, 5, 9)
    assert s.check(PID, 0, 0, 4) is None


def test_sequences_continue_and_gaps_are_out_of_order():
    s = states()
    write(s, PID, 0, 0, 5, 100)
    write(s, PID, 0, 5, 1, 105)
    assert s.get(PID).last_seq == 5
    with pytest.raises(OutOfOrderSequence):
        s.check(PID, 0, 7, 7)  # a gap: 6 is missing
    with pytest.raises(OutOfOrderSequence):
        s.check(PID, 0, 5, 6)  # overlaps the last batch without repeating it
    write(s, PID, 0, 6, 2, 106)


def test_a_duplicate_of_any_of_the_last_five_batches_returns_the_original():
    s = states()
    offset = 0
    for n in range(8):  # batches of 2 records: sequences 2n..2n+1
        write(s, PID, 0, 2 * n, 2, offset)
        offset += 10
    assert len(s.get(PID).batches) == CACHED_BATCHES
    for n in range(8 - CACHED_BATCHES, 8):
        assert s.check(PID, 0, 2 * n, 2 * n + 1) == CachedBatch(2 * n, 2 * n + 1, 10 * n)
    # Older than the last five: no longer recognised, and not a continuation.
    for n in range(8 - CACHED_BATCHES):
        with pytest.raises(OutOfOrderSequence):
            s.check(PID, 0, 2 * n, 2 * n + 1)


def test_a_refused_batch_may_be_followed_or_sent_again():
    """A batch its transaction refused (nothing stored) is noted as REFUSED:
    the next batch may follow it (librdkafka) or start where it started
    (kafkajs), and replaces it then; a retry of it after a later batch is
    out of reach of both and found as the refused one, never a stored one."""
    follows = states()
    write(follows, PID, 0, 0, 2, -1)
    write(follows, PID, 0, 2, 3, REFUSED)  # sequences 2..4 refused
    write(follows, PID, 0, 5, 1, -1)
    assert follows.check(PID, 0, 2, 4) == CachedBatch(2, 4, REFUSED)
    again = states()
    write(again, PID, 0, 0, 2, -1)
    write(again, PID, 0, 2, 3, REFUSED)
    write(again, PID, 0, 2, 1, -1)  # the same first sequence, fewer records
    assert [b.base_offset for b in again.get(PID).batches] == [-1, -1]
    assert again.check(PID, 0, 2, 2) == CachedBatch(2, 2, -1)  # now a stored duplicate
    with pytest.raises(OutOfOrderSequence):
        again.check(PID, 0, 5, 5)


def test_an_older_epoch_is_fenced_and_a_newer_one_starts_at_zero():
    s = states()
    write(s, PID, 3, 0, 4, 0)
    with pytest.raises(InvalidProducerEpoch):
        s.check(PID, 2, 4, 4)
    with pytest.raises(InvalidProducerEpoch):
        s.check(PID, 2, 0, 3)  # even a "duplicate" of the old epoch
    with pytest.raises(OutOfOrderSequence):
        s.check(PID, 4, 4, 4)
    write(s, PID, 4, 0, 1, 10)
    entry = s.get(PID)
    assert entry.epoch == 4
    assert list(entry.batches) == [CachedBatch(0, 0, 10)]  # the old epoch's batches are gone
    with pytest.raises(InvalidProducerEpoch):
        s.check(PID, 3, 0, 3)


def test_sequences_wrap_at_int32_max():
    assert next_seq(INT32_MAX) == 0
    assert next_seq(INT32_MAX - 1, 3) == 1
    s = states()
    write(s, PID, 0, 0, 1, 0)
    # Jump the producer near the top of the range (as after 2^31 records).
    s.get(PID).batches.append(CachedBatch(INT32_MAX - 10, INT32_MAX - 3, 5))
    write(s, PID, 0, INT32_MAX - 2, 5, 13)  # INT32_MAX-2 .. 1: wraps inside the batch
    assert s.get(PID).last_seq == 1
    assert s.check(PID, 0, INT32_MAX - 2, 1) == CachedBatch(INT32_MAX - 2, 1, 13)
    write(s, PID, 0, 2, 1, 18)
    with pytest.raises(OutOfOrderSequence):
        s.check(PID, 0, INT32_MAX, INT32_MAX)


def test_idle_producers_expire():
    s = states()
    write(s, 1, 0, 0, 1, 0, now=1_000)
    write(s, 2, 0, 0, 1, 1, now=5_000)
    change: Staged = []
    assert s.expire(now_ms=6_000, expiration_ms=5_000, change=change) == 1
    assert s.get(1) is None and s.get(2) is not None
    assert removed(change) == [1]
    with pytest.raises(UnknownProducerId):  # forgotten mid-sequence
        s.check(1, 0, 1, 1)


def test_least_recently_written_producer_is_evicted_past_the_cap():
    s = states(max_producers=3)
    for pid in (1, 2, 3):
        write(s, pid, 0, 0, 1, pid)
    write(s, 1, 0, 1, 1, 10)  # 1 is now the most recent
    ops = write(s, 4, 0, 0, 1, 11)
    assert len(s) == 3 and s.evictions == 1
    assert s.get(2) is None and {pid for pid, _ in s.items()} == {3, 1, 4}
    assert removed(ops) == [2]
    with pytest.raises(UnknownProducerId):
        s.check(2, 0, 1, 1)


def test_entry_encoding_round_trips():
    entry = ProducerEntry(epoch=12, last_timestamp=1_700_000_000_123)
    assert ProducerEntry.decode(entry.encode()) == entry
    for n in range(CACHED_BATCHES + 2):
        entry.batches.append(CachedBatch(10 * n, 10 * n + 9, -1 if n % 2 else 1000 * n))
    decoded = ProducerEntry.decode(entry.encode())
    assert decoded == entry
    assert list(decoded.batches) == list(entry.batches)
    assert decoded.batches.maxlen == CACHED_BATCHES
    # The cached batches alone, for an engine keeping epoch and time in columns.
    columns = ProducerEntry.from_columns(12, 1_700_000_000_123, entry.encode_batches())
    assert columns == entry and columns.batches.maxlen == CACHED_BATCHES
    assert entry.encode() == entry.encode()[:11] + entry.encode_batches()


def test_recovery_forgets_producers_whose_batches_it_cut():
    s = states()
    write(s, 1, 0, 0, 1, 5)
    write(s, 2, 0, 0, 1, 10)
    write(s, 2, 0, 1, 1, 20)
    change: Staged = []
    assert s.forget_from(15, change) == 1
    assert removed(change) == [2] and s.get(2) is None and s.get(1) is not None


def test_states_restore_in_write_order_from_the_port():
    entries = [(pid, ProducerEntry(0, now)) for pid, now in ((5, 300), (6, 100), (7, 200))]
    s = ProducerStates(Recorded(entries), 100)
    s.load()
    assert [pid for pid, _ in s.items()] == [6, 7, 5]


def test_states_load_from_the_store_in_write_order(tmp_path):
    async def scenario(engine: StorageEngine) -> None:
        s = producer_states(engine.store, b"q" * 20, 100)
        ops = Ops()
        for pid, now in ((5, 300), (6, 100), (7, 200)):
            for n in range(3):
                s.stage(pid, 1, CachedBatch(n, n, 10 * pid + n), now, ops)
        # The RocksDB port: one put per staged entry, under the partition's key.
        assert [key for key, _ in ops.puts] == [
            producer_key(b"q" * 20, pid) for pid in (5, 5, 5, 6, 6, 6, 7, 7, 7)]
        assert ops.puts[-1][1] == s.get(7).encode()
        await engine.writer.submit(ops)
        loaded = ProducerStates(StoredProducers(engine.store, b"q" * 20), 100)
        loaded.load()
        assert [pid for pid, _ in loaded.items()] == [6, 7, 5]  # least recent first
        assert dict(loaded.items()) == dict(s.items())

    run(scenario, tmp_path)


# ------------------------------------------------------------ through a tablet


def run(coro_fn, data_dir, **settings):
    async def main():
        engine = StorageEngine(str(data_dir), EngineSettings(**settings))
        engine.start(asyncio.get_running_loop())
        try:
            return await coro_fn(engine)
        finally:
            engine.close()

    return asyncio.run(main())


def idempotent(values: list[bytes], seq: int, epoch: int = 1) -> bytes:
    return make_batch(values, producer_id=PID, producer_epoch=epoch, base_sequence=seq)


def test_a_retried_batch_is_recognised_after_a_restart(tmp_path):
    async def first(engine):
        await engine.create_topic("t", 1, {})
        tablet = engine.partition("t", 0)
        await tablet.append(make_batch([b"plain"] * 2), 0)
        results = [await tablet.append(idempotent([b"x"] * 3, seq), 0) for seq in (0, 3, 6)]
        assert [r.base_offset for r in results] == [2, 5, 8]
        assert tablet.log_end_offset == 11

    async def after_restart(engine):
        tablet = engine.partition("t", 0)
        for seq, offset in ((0, 2), (3, 5), (6, 8)):
            retried = await tablet.append(idempotent([b"x"] * 3, seq), 0)
            assert retried.base_offset == offset
        assert tablet.log_end_offset == 11  # nothing stored twice
        with pytest.raises(OutOfOrderSequence):
            await tablet.append(idempotent([b"x"], 10), 0)
        with pytest.raises(InvalidProducerEpoch):
            await tablet.append(idempotent([b"x"], 9, epoch=0), 0)
        appended = await tablet.append(idempotent([b"y"], 9), 0)
        assert appended.base_offset == 11
        read = await tablet.read(0, 1 << 20)
        assert [o for b in as_batches(read.batches)
                for o, _ in record_timestamps(b)] == list(range(12))

    run(first, tmp_path)
    run(after_restart, tmp_path)


def test_expired_producers_leave_the_store(tmp_path):
    async def first(engine):
        await engine.create_topic("t", 1, {})
        tablet = engine.partition("t", 0)
        await tablet.append(idempotent([b"x"], 0), 0)
        assert await tablet.truncation.expire_producers(now_ms=10**15, expiration_ms=1000) == 1

    async def after_restart(engine):
        tablet = engine.partition("t", 0)
        assert len(tablet.producers) == 0
        with pytest.raises(UnknownProducerId):
            await tablet.append(idempotent([b"x"], 1), 0)

    run(first, tmp_path)
    run(after_restart, tmp_path)


def test_a_duplicate_is_answered_only_once_its_original_is_durable(tmp_path):
    async def scenario(engine):
        await engine.create_topic("t", 1, {})
        tablet = engine.partition("t", 0)
        original = tablet.append(idempotent([b"x"] * 2, 0), 0)
        retried = tablet.append(idempotent([b"x"] * 2, 0), 0)  # before the original landed
        assert not retried.done()
        first = await retried
        assert original.done() and first.base_offset == (await original).base_offset == 0
        assert tablet.high_watermark == 2

    run(scenario, tmp_path)
