"""aiokafka (0.14): idempotent and transactional producers against the gateway.

aiokafka's producer is not idempotent by default (enable_idempotence=False);
with a transactional_id it is. It commits a transaction's offsets with a
group id only (send_offsets_to_transaction(offsets, group_id): TxnOffsetCommit
without KIP-447 member and generation), and its consumer's OffsetFetch
cannot ask for stable offsets (no require_stable).

What aiokafka reports, as asserted below:

- a transactional send's RecordMetadata carries offset -1 for the first
  record of a batch, then 0, 1, ...: the gateway answers base offset -1
  (offsets are assigned at commit) and aiokafka adds each record's delta;
- a fenced producer: ProducerFenced (its Produce and its EndTxn are
  answered INVALID_PRODUCER_EPOCH, as aiokafka's request versions predate
  PRODUCER_FENCED);
- an offset-range conflict, at TxnOffsetCommit (ILLEGAL_GENERATION) or at
  EndTxn(commit) (UNKNOWN_PRODUCER_ID): aiokafka's handlers treat both as
  unexpected and the producer fails for good (nothing of the transaction
  lands); a new producer with the same transactional_id goes on.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import (
    IllegalGenerationError,
    KafkaError,
    ProducerFenced,
    UnknownProducerId,
)
from kio.schema.errors import ErrorCode
from txn_helpers import (
    PER_PARTITION,
    TXN_TIMEOUT_MS,
    assert_one_idempotent_producer,
    expected_view,
    fetch_offsets,
    log_offsets,
    stored_log,
    timed_out,
    topic_names,
    txn_gateway,
    txn_records,
)

TIMEOUT_S = 30.0
TEST_TIMEOUT_S = 90.0
Rows = list[tuple[str, int, int, bytes]]  # (topic, partition, offset, value)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with txn_gateway(tmp_path_factory.mktemp("txn-aiokafka") / "data") as gw:
        yield gw


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run one test's coroutine to completion, or fail it after TEST_TIMEOUT_S."""
    return asyncio.run(asyncio.wait_for(coro, TEST_TIMEOUT_S))


# ------------------------------------------------------------------ helpers
async def create_topics(gateway, topics: dict[str, int]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=gateway.bootstrap, request_timeout_ms=20000)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, n, 1) for name, n in topics.items()])
    finally:
        await admin.close()


@asynccontextmanager
async def producer(gateway, **config: Any) -> AsyncIterator[AIOKafkaProducer]:
    prod = AIOKafkaProducer(bootstrap_servers=gateway.bootstrap, request_timeout_ms=20000,
                            **config)
    await prod.start()
    try:
        yield prod
    finally:
        await prod.stop()


async def send(prod: AIOKafkaProducer, records: list[tuple[str, int, bytes]]) -> list[int]:
    """Send one batch per partition; the offset each record's metadata reports."""
    futures = [await prod.send(topic, value, partition=partition)
               for topic, partition, value in records]
    return [(await future).offset for future in futures]


@asynccontextmanager
async def consumer(gateway, isolation: str, group: str | None = None
                   ) -> AsyncIterator[AIOKafkaConsumer]:
    cons = AIOKafkaConsumer(bootstrap_servers=gateway.bootstrap, group_id=group,
                            enable_auto_commit=False, auto_offset_reset="earliest",
                            isolation_level=isolation, fetch_max_wait_ms=100)
    await cons.start()
    try:
        yield cons
    finally:
        await cons.stop()


async def read(gateway, topics: dict[str, int], count: int, isolation: str,
               linger: float = 1.0) -> Rows:
    """Every partition from the beginning: ``count`` records, then ``linger``
    seconds more, so that a record too many is seen too."""
    async with consumer(gateway, isolation) as cons:
        cons.assign([TopicPartition(t, p) for t, n in topics.items() for p in range(n)])
        rows: Rows = []
        deadline, extra_until = time.monotonic() + TIMEOUT_S, None
        while time.monotonic() < (extra_until or deadline):
            for batch in (await cons.getmany(timeout_ms=200)).values():
                rows += [(r.topic, r.partition, r.offset, r.value) for r in batch]
            if len(rows) >= count and extra_until is None:
                extra_until = time.monotonic() + linger
        return rows


def view(rows: Rows) -> dict[tuple[str, int], list[tuple[int, bytes]]]:
    out: dict[tuple[str, int], list[tuple[int, bytes]]] = {}
    for topic, partition, offset, value in sorted(rows, key=lambda r: r[:3]):
        out.setdefault((topic, partition), []).append((offset, value))
    return out


async def committed(gateway, group: str, tp: TopicPartition) -> int | None:
    async with consumer(gateway, "read_uncommitted", group) as cons:
        return await cons.committed(tp)


# -------------------------------------------------------------- idempotence
def test_idempotent_producer_exactly_once(gateway, topic_name):
    """enable_idempotence=True (aiokafka's default is False): the batches carry
    the producer's id and sequences; every record once, at its acknowledged offset."""

    async def main() -> None:
        await create_topics(gateway, {topic_name: 2})
        async with producer(gateway, enable_idempotence=True, linger_ms=5) as prod:
            offsets = await send(prod, [(topic_name, i % 2, b"idem-%d" % i) for i in range(400)])
        assert offsets == [i // 2 for i in range(400)]
        rows = view(await read(gateway, {topic_name: 2}, 400, "read_uncommitted", linger=0.5))
        for partition in range(2):
            assert rows[(topic_name, partition)] == [
                (o, b"idem-%d" % (2 * o + partition)) for o in range(200)]

    run(main())
    for partition in range(2):
        assert_one_idempotent_producer(gateway, topic_name, partition)


# ----------------------------------------------------- commit and abort
def test_commit_and_abort_across_topics_and_partitions(gateway, topic_name):
    """c1 committed, a2 aborted, o3 open then committed, over 2 topics and 5
    partitions: read_committed and read_uncommitted consumers both see
    exactly c1, then c1 and o3, in order, the COMMIT markers' offsets skipped."""
    topics = topic_names(topic_name)
    records = len(txn_records("x", topics))
    offsets = log_offsets([(PER_PARTITION, "commit"), (PER_PARTITION, "abort"),
                           (PER_PARTITION, "commit")], keeps_aborted=False)
    first = expected_view(topics, [("c1", offsets[0])])
    both = expected_view(topics, [("c1", offsets[0]), ("o3", offsets[2])])

    async def main() -> None:
        await create_topics(gateway, topics)
        async with producer(gateway, transactional_id=f"ca-{topic_name}",
                            linger_ms=5) as prod:
            for tag, outcome in (("c1", "commit"), ("a2", "abort"), ("o3", "open")):
                await prod.begin_transaction()
                reported = await send(prod, txn_records(tag, topics))
                assert reported == [-1, 0, 1, 2] * (records // PER_PARTITION)
                if outcome == "commit":
                    await prod.commit_transaction()
                elif outcome == "abort":
                    await prod.abort_transaction()
            for isolation in ("read_committed", "read_uncommitted"):
                assert view(await read(gateway, topics, records, isolation)) == first
            await prod.commit_transaction()
        for isolation in ("read_committed", "read_uncommitted"):
            assert view(await read(gateway, topics, 2 * records, isolation, 0.3)) == both

    run(main())


# ------------------------------------------------------------ group offsets
def test_send_offsets_moves_the_group_only_on_commit(gateway, topic_name):
    """send_offsets_to_transaction(offsets, group_id): committed() stays put
    through an abort and moves with the commit. aiokafka's committed() cannot
    ask for stable offsets, so while the transaction is open it answers the
    old one; OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT."""
    source, output, group = f"{topic_name}-in", f"{topic_name}-out", f"g-{topic_name}"
    tp = TopicPartition(source, 0)

    async def main() -> None:
        await create_topics(gateway, {source: 1, output: 1})
        async with producer(gateway) as plain:
            await send(plain, [(source, 0, b"in-%d" % i) for i in range(10)])
        async with producer(gateway, transactional_id=f"so-{topic_name}") as prod:
            await prod.begin_transaction()
            await send(prod, [(output, 0, b"aborted")])
            await prod.send_offsets_to_transaction({tp: 6}, group)
            assert await committed(gateway, group, tp) is None
            await prod.abort_transaction()
            assert await committed(gateway, group, tp) is None

            await prod.begin_transaction()
            await send(prod, [(output, 0, b"out-%d" % i) for i in range(6)])
            await prod.send_offsets_to_transaction({tp: 6}, group)
            assert await committed(gateway, group, tp) is None
            stable = await asyncio.to_thread(fetch_offsets, gateway, group, [(source, 0)], True)
            assert stable[(source, 0)][1] is ErrorCode.unstable_offset_commit
            await prod.commit_transaction()
            assert await committed(gateway, group, tp) == 6
        out = await read(gateway, {output: 1}, 6, "read_committed")
        assert [v for *_x, v in out] == [b"out-%d" % i for i in range(6)]

    run(main())
    assert fetch_offsets(gateway, group, [(source, 0)], True) == {
        (source, 0): (6, ErrorCode.none)}


# ----------------------------------------------------------------- fencing
def test_zombie_is_fenced_and_its_transaction_never_visible(gateway, topic_name):
    """A second producer with the same transactional_id aborts the first one's
    open transaction; the zombie's next send and its commit raise ProducerFenced."""
    txn_id = f"zombie-{topic_name}"

    async def main() -> None:
        await create_topics(gateway, {topic_name: 2})
        async with producer(gateway, transactional_id=txn_id) as zombie:
            await zombie.begin_transaction()
            await send(zombie, [(topic_name, p, b"zombie-%d" % p) for p in range(2)])
            async with producer(gateway, transactional_id=txn_id) as successor:
                await successor.begin_transaction()  # waits for its InitProducerId
                with pytest.raises(ProducerFenced):
                    await send(zombie, [(topic_name, 0, b"zombie-late")])
                with pytest.raises(ProducerFenced):
                    await zombie.commit_transaction()
                await send(successor, [(topic_name, 0, b"successor")])
                await successor.commit_transaction()
        for isolation in ("read_committed", "read_uncommitted"):
            assert view(await read(gateway, {topic_name: 2}, 1, isolation)) == {
                (topic_name, 0): [(0, b"successor")]}

    run(main())
    assert stored_log(gateway, topic_name, 1).high_watermark == 0


# ---------------------------------------------------------------- conflicts
@pytest.mark.parametrize("loser_sends_offsets", ["before_winner_commits",
                                                 "after_winner_commits"])
def test_two_transactional_ids_one_group_partition(gateway, topic_name, loser_sends_offsets):
    """Two producers commit offset 10 of the same group partition; the winner
    commits first. The loser's conflict (at TxnOffsetCommit or at EndTxn)
    makes aiokafka's producer fail for good; nothing of its transaction
    lands, and a new producer with the same transactional_id goes on."""
    source, output, group = f"{topic_name}-in", f"{topic_name}-out", f"g-{topic_name}"
    tp = TopicPartition(source, 0)
    loser_id = f"lose-{topic_name}"
    early = loser_sends_offsets == "before_winner_commits"

    async def main() -> tuple[str, type]:
        await create_topics(gateway, {source: 1, output: 1})
        async with producer(gateway, transactional_id=f"win-{topic_name}") as winner, \
                producer(gateway, transactional_id=loser_id) as loser:
            for prod, tag in ((winner, b"winner"), (loser, b"loser")):
                await prod.begin_transaction()
                await send(prod, [(output, 0, tag)])
            await winner.send_offsets_to_transaction({tp: 10}, group)
            if early:
                await loser.send_offsets_to_transaction({tp: 10}, group)
            await winner.commit_transaction()
            with pytest.raises(KafkaError) as failed:
                if not early:
                    await loser.send_offsets_to_transaction({tp: 10}, group)
                await loser.commit_transaction()
            failure, cause = str(failed.value), type(failed.value.__cause__)
        async with producer(gateway, transactional_id=loser_id) as successor:
            await successor.begin_transaction()
            await send(successor, [(output, 0, b"loser-next")])
            await successor.commit_transaction()
        out = await read(gateway, {output: 1}, 2, "read_committed")
        assert [v for *_x, v in out] == [b"winner", b"loser-next"]
        return failure, cause

    # The producer's sender task died of it; the cause is the broker's answer.
    failure, cause = run(main())
    assert failure == "KafkaError: Unexpected error during batch delivery"
    assert cause is (UnknownProducerId if early else IllegalGenerationError)
    assert fetch_offsets(gateway, group, [(source, 0)], True) == {
        (source, 0): (10, ErrorCode.none)}


# ----------------------------------------------------------------- timeout
def test_transaction_timeout_aborts_and_fences(gateway, topic_name):
    """transaction_timeout_ms=2000: the gateway aborts the open transaction
    (nothing of it enters the log) and bumps the epoch: the commit raises
    ProducerFenced."""
    txn_id = f"timeout-{uuid.uuid4().hex[:8]}"

    async def main() -> None:
        await create_topics(gateway, {topic_name: 1})
        async with producer(gateway, transactional_id=txn_id,
                            transaction_timeout_ms=TXN_TIMEOUT_MS) as prod:
            await prod.begin_transaction()
            await send(prod, [(topic_name, 0, b"late")])
            deadline = time.monotonic() + TIMEOUT_S
            while not timed_out(gateway, txn_id):
                assert time.monotonic() < deadline, "the transaction did not time out"
                await asyncio.sleep(0.1)
            with pytest.raises(ProducerFenced):
                await prod.commit_transaction()

    run(main())
    assert stored_log(gateway, topic_name, 0).high_watermark == 0
