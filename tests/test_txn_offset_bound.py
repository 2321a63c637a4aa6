"""gateway.transactional.produce.offset=lower-bound: a transactional Produce
answered with a lower bound of the offset its commit gives the batch.

The bound is the partition's log end when the batch is stored plus the
records of the same transaction already pending there. Checked against the
offsets the commit really assigns: never above them; equal to them when the
transaction is the partition's only writer (a Kafka Streams changelog);
after a restart (the pending count rebuilt from the stored blobs); for a
retried duplicate batch (the bound kept with the producer's sequences); and
a topic without the config answers -1 as before.
"""

from __future__ import annotations

import pytest

from tablets.topic_config import TXN_OFFSET_LOWER_BOUND, TXN_PRODUCE_OFFSET, InvalidConfig
from testkit.batches import make_batch
from testkit.txn import TIMEOUT_MS, Env, run

BOUND = ("a", 0)  # the topic "a" opts in (``opt_in``); "b" keeps the default


async def opt_in(env: Env) -> None:
    await env.engine.set_topic_configs("a", {TXN_PRODUCE_OFFSET: TXN_OFFSET_LOWER_BOUND})


async def offsets_of(env: Env, tp: tuple[str, int]) -> dict[bytes, int]:
    """The offset the log gives each (unique) record value."""
    return {value: offset for offset, value in await env.record_values(tp)}


async def transaction(env: Env, tid: str, tp: tuple[str, int] = BOUND) -> tuple[int, int]:
    pid, epoch = await env.txns.init_producer_id(tid, TIMEOUT_MS)
    await env.begin(pid, epoch, [tp], tid=tid)
    return pid, epoch


def test_one_writer_gets_the_exact_offsets_of_its_batches(tmp_path):
    async def phase(env: Env) -> None:
        await opt_in(env)
        pid, epoch = await env.txns.init_producer_id("tx", TIMEOUT_MS)
        for round_ in range(3):  # each commit also appends its marker
            await env.begin(pid, epoch, [BOUND], tid="tx")
            answered = {}
            for n, size in enumerate((2, 3, 1)):  # several batches in one partition
                values = [f"{round_}-{n}-{i}".encode() for i in range(size)]
                answered[values[0]] = await env.produce(pid, epoch, BOUND, values, tid="tx")
            await env.txns.end_txn("tx", pid, epoch, True)
            real = await offsets_of(env, BOUND)
            assert answered == {value: real[value] for value in answered}, round_
        assert list(answered.values()) == [14, 16, 19]  # 2 rounds of 6 records + marker

    run(tmp_path, phase)


def test_interleaved_writers_get_bounds_never_above_the_real_offsets(tmp_path):
    async def phase(env: Env) -> None:
        await opt_in(env)
        one = await transaction(env, "one")
        two = await transaction(env, "two")
        tablet = env.engine.partition(*BOUND)
        answered = {
            b"one-a": await env.produce(*one, BOUND, [b"one-a", b"one-a2"], tid="one"),
            b"two-a": await env.produce(*two, BOUND, [b"two-a", b"two-a2", b"two-a3"],
                                        tid="two"),
            b"one-b": await env.produce(*one, BOUND, [b"one-b"], tid="one"),
        }
        # A plain (non-transactional) write lands in the log meanwhile.
        plain = await tablet.append(make_batch([b"plain"]), env.clock())
        assert plain.base_offset == 0
        answered[b"two-b"] = await env.produce(*two, BOUND, [b"two-b"], tid="two")
        assert answered == {b"one-a": 0, b"two-a": 0, b"one-b": 2, b"two-b": 1 + 3}
        await env.txns.end_txn("two", *two, True)  # two commits first: one moves up
        await env.txns.end_txn("one", *one, True)
        real = await offsets_of(env, BOUND)
        assert real == {b"plain": 0, b"two-a": 1, b"two-a2": 2, b"two-a3": 3, b"two-b": 4,
                        b"one-a": 6, b"one-a2": 7, b"one-b": 8}  # markers at 5 and 9
        for value, bound in answered.items():
            assert bound <= real[value], (value, bound, real[value])
        # Another producer's commit while a transaction is open: its later
        # batches' bounds start above that commit.
        three = await transaction(env, "three")
        four = await transaction(env, "four")
        first = await env.produce(*three, BOUND, [b"three-a"], tid="three")
        await env.produce(*four, BOUND, [b"four-a", b"four-a2"], tid="four")
        await env.txns.end_txn("four", *four, True)
        second = await env.produce(*three, BOUND, [b"three-b"], tid="three")
        assert (first, second) == (10, 10 + 3 + 1)  # after four's records and marker
        await env.txns.end_txn("three", *three, True)
        real = await offsets_of(env, BOUND)
        assert (real[b"three-a"], real[b"three-b"]) == (13, 14)
        assert first <= real[b"three-a"] and second == real[b"three-b"]

    run(tmp_path, phase)


def test_the_pending_count_is_rebuilt_after_a_restart(tmp_path):
    ids: list[int] = []
    answered: dict[bytes, int] = {}

    async def first(env: Env) -> None:
        await opt_in(env)
        await env.engine.partition(*BOUND).append(make_batch([b"p0", b"p1"]), env.clock())
        pid, epoch = await transaction(env, "tx")
        ids.extend((pid, epoch))
        answered[b"a"] = await env.produce(pid, epoch, BOUND, [b"a", b"a2", b"a3"], tid="tx")
        answered[b"b"] = await env.produce(pid, epoch, BOUND, [b"b"], tid="tx")
        assert answered == {b"a": 2, b"b": 5}

    async def recovered(env: Env) -> None:
        pid, epoch = ids
        answered[b"c"] = await env.produce(pid, epoch, BOUND, [b"c"], seq=4, tid="tx")
        assert answered[b"c"] == 2 + 3 + 1  # the log end plus the 4 records pending
        # The config is the topic's, stored: still in force.
        assert env.engine.partition(*BOUND).settings().txn_offset_lower_bound
        await env.txns.end_txn("tx", pid, epoch, True)
        real = await offsets_of(env, BOUND)
        assert answered == {value: real[value] for value in answered}

    run(tmp_path, first, recovered)


def test_a_recreated_topic_does_not_count_the_old_ones_records(tmp_path):
    """The old topic's pending batches are never committed to the new one
    of the same name: they must not raise its bound above the real offset."""
    async def phase(env: Env) -> None:
        await opt_in(env)
        pid, epoch = await transaction(env, "tx")
        assert await env.produce(pid, epoch, BOUND, [b"old", b"old2"], tid="tx") == 0
        await env.engine.delete_topic("a")
        await env.engine.create_topic("a", 2, {TXN_PRODUCE_OFFSET: TXN_OFFSET_LOWER_BOUND})
        await env.begin(pid, epoch, [BOUND], tid="tx")  # AddPartitionsToTxn again
        answered = {b"new": await env.produce(pid, epoch, BOUND, [b"new"], seq=0, tid="tx"),
                    b"new2": await env.produce(pid, epoch, BOUND, [b"new2"], seq=1, tid="tx")}
        assert answered == {b"new": 0, b"new2": 1}
        await env.txns.end_txn("tx", pid, epoch, True)
        assert await offsets_of(env, BOUND) == answered

    run(tmp_path, phase)


def test_a_retried_batch_gets_its_original_answer(tmp_path):
    ids: list[int] = []

    async def first(env: Env) -> None:
        await opt_in(env)
        pid, epoch = await env.txns.init_producer_id("tx", TIMEOUT_MS)
        ids.extend((pid, epoch))
        await env.begin(pid, epoch, [BOUND, ("b", 0)], tid="tx")
        assert await env.produce(pid, epoch, BOUND, [b"x", b"x2"], tid="tx") == 0
        assert await env.produce(pid, epoch, BOUND, [b"y"], tid="tx") == 2
        assert await env.produce(pid, epoch, ("b", 0), [b"z"], tid="tx") == -1
        # A retry of the first batch (same sequences): not stored again, and
        # answered with the bound it got, not with one counting itself twice.
        assert await env.produce(pid, epoch, BOUND, [b"x", b"x2"], seq=0, tid="tx") == 0
        assert await env.produce(pid, epoch, ("b", 0), [b"z"], seq=0, tid="tx") == -1

    async def recovered(env: Env) -> None:
        pid, epoch = ids
        # The bound is kept with the producer's sequences: the same after a restart.
        assert await env.produce(pid, epoch, BOUND, [b"y"], seq=2, tid="tx") == 2
        assert await env.produce(pid, epoch, ("b", 0), [b"z"], seq=0, tid="tx") == -1
        await env.txns.end_txn("tx", pid, epoch, True)
        assert await offsets_of(env, BOUND) == {b"x": 0, b"x2": 1, b"y": 2}
        assert [v for _, v in await env.record_values(("b", 0))] == [b"z"]

    run(tmp_path, first, recovered)


def test_the_default_answers_minus_one_and_the_config_can_be_turned_off(tmp_path):
    async def phase(env: Env) -> None:
        assert not env.engine.partition(*BOUND).settings().txn_offset_lower_bound
        pid, epoch = await transaction(env, "tx")
        assert await env.produce(pid, epoch, BOUND, [b"a"], tid="tx") == -1
        assert await env.produce(pid, epoch, BOUND, [b"b"], tid="tx") == -1
        assert await env.produce(pid, epoch, BOUND, [b"a"], seq=0, tid="tx") == -1
        await opt_in(env)
        assert await env.produce(pid, epoch, BOUND, [b"c"], tid="tx") == 2
        assert await env.produce(pid, epoch, BOUND, [b"a"], seq=0, tid="tx") == 0
        await env.engine.set_topic_configs("a", {TXN_PRODUCE_OFFSET: "unknown"})
        assert await env.produce(pid, epoch, BOUND, [b"d"], tid="tx") == -1
        await env.engine.set_topic_configs("a", {})
        assert await env.produce(pid, epoch, BOUND, [b"e"], tid="tx") == -1
        await env.txns.end_txn("tx", pid, epoch, True)
        assert await offsets_of(env, BOUND) == {b"a": 0, b"b": 1, b"c": 2, b"d": 3, b"e": 4}

    run(tmp_path, phase)


def test_a_bad_value_is_refused(tmp_path):
    async def phase(env: Env) -> None:
        for bad in ("Lower-Bound", "exact", ""):
            with pytest.raises(InvalidConfig) as refused:
                await env.engine.set_topic_configs("a", {TXN_PRODUCE_OFFSET: bad})
            assert str(refused.value) == (
                f"Invalid value {bad} for configuration {TXN_PRODUCE_OFFSET}: "
                "String must be one of: unknown, lower-bound")
        assert env.engine.topics["a"].configs == {}

    run(tmp_path, phase)
