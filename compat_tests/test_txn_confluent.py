"""confluent-kafka (librdkafka 2.16): idempotent and transactional producers.

Scenarios where Kafka's semantics apply run against Apache Kafka 3.4.1 too
(``server`` is parametrized), asserting the same client-visible outcome; the
intended differences are asserted explicitly:

- offsets: the gateway assigns a transaction's offsets at commit, so an
  aborted transaction takes none; Kafka assigns them at produce time and
  leaves aborted records and an ABORT marker in the log;
- read_uncommitted: Kafka returns records of open and aborted transactions;
  the gateway never has them in any log, so both isolation levels read the
  same committed records;
- delivery reports: the gateway answers a transactional Produce with base
  offset -1 (the offsets do not exist yet) and librdkafka reports base + i
  for the i-th message of a batch: -1 (``None`` in Python), 0, 1, ...;
- conflicts: two transactions committing offsets over the same range of a
  group's partition both land in Kafka; in the gateway exactly one does.

What librdkafka reports, as asserted below: a fenced producer fails with
``_FENCED`` (fatal; the Produce was answered INVALID_PRODUCER_EPOCH, EndTxn
PRODUCER_FENCED); an offset-range conflict at TxnOffsetCommit is
ILLEGAL_GENERATION and at EndTxn(commit) UNKNOWN_PRODUCER_ID, both abortable
(``txn_requires_abort``); after abort_transaction() the same producer goes on.
Its consumer's committed() with isolation.level=read_committed (librdkafka's
default) sends OffsetFetch with require_stable and retries
UNSTABLE_OFFSET_COMMIT until the transaction ends.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_INVALID,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode
from txn_helpers import (
    PER_PARTITION,
    TXN_TIMEOUT_MS,
    RawTxn,
    Server,
    expected_view,
    fetch_offsets,
    log_offsets,
    stored_log,
    stored_log_reaching,
    timed_out,
    topic_names,
    txn_gateway,
    txn_records,
    wait_for,
)

from testkit.batches import make_batch

TIMEOUT = 30
WORKER = Path(__file__).with_name("txn_commit_worker.py")
Rows = list[tuple[str, int, int, bytes]]  # (topic, partition, offset, value)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with txn_gateway(tmp_path_factory.mktemp("txn-confluent") / "data") as gw:
        yield gw


@pytest.fixture(params=["gateway", "kafka"])
def server(request):
    """The same scenario against the gateway and against Apache Kafka 3.4.1."""
    return request.getfixturevalue("gateway" if request.param == "gateway" else "kafka_broker")


def is_kafka(server: Server) -> bool:
    return not hasattr(server, "data_dir")


# ------------------------------------------------------------------ helpers
def create_topics(server: Server, topics: dict[str, int]) -> None:
    admin = wait_for(lambda: with_controller(server), TIMEOUT, "a controller")[0]
    futures = admin.create_topics([NewTopic(name, count, 1) for name, count in topics.items()])
    for future in futures.values():
        future.result(TIMEOUT)


def with_controller(server: Server) -> tuple[AdminClient] | None:
    """An admin client that knows the controller. Kafka answers as soon as it
    listens, before its broker is registered; an admin client that saw no
    controller then waits for one without asking again. (In a tuple: an
    AdminClient with nothing queued is falsy.)"""
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    return (admin,) if admin.list_topics(timeout=TIMEOUT).controller_id >= 0 else None


def txn_producer(server: Server, transactional_id: str, **extra) -> Producer:
    # linger.ms is long so that each partition's records of one flush() form
    # one batch (flush sends at once): the delivery reports are then exact.
    producer = Producer({"bootstrap.servers": server.bootstrap,
                         "transactional.id": transactional_id, "linger.ms": 1000, **extra})
    producer.init_transactions(TIMEOUT)
    return producer


def produce(producer: Producer, records: list[tuple[str, int, bytes]]) -> list:
    """Produce and flush; (topic, partition, error, reported offset) per record, in order."""
    reports: list = [None] * len(records)

    def report(index: int):
        def callback(err, msg):
            reports[index] = (msg.topic(), msg.partition(), err, msg.offset())
        return callback

    for index, (topic, partition, value) in enumerate(records):
        producer.produce(topic, value=value, partition=partition, on_delivery=report(index))
    assert producer.flush(TIMEOUT) == 0
    return reports


def consumer(server: Server, isolation: str, group: str | None = None, **extra) -> Consumer:
    return Consumer({"bootstrap.servers": server.bootstrap,
                     "group.id": group or f"reader-{uuid.uuid4().hex[:8]}",
                     "enable.auto.commit": False, "auto.offset.reset": "earliest",
                     "isolation.level": isolation, "fetch.wait.max.ms": 50, **extra})


def read(server: Server, topics: dict[str, int], count: int, isolation: str,
         linger: float = 1.0) -> Rows:
    """Every partition from the beginning: ``count`` records, then ``linger``
    seconds more, so that a record too many is seen too."""
    c = consumer(server, isolation)
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING)
                  for topic, n in topics.items() for p in range(n)])
        rows: Rows = []
        deadline = time.monotonic() + TIMEOUT
        extra_until = None
        while time.monotonic() < (extra_until or deadline):
            msg = c.poll(0.2)
            if msg is not None:
                assert msg.error() is None, msg.error()
                rows.append((msg.topic(), msg.partition(), msg.offset(), msg.value()))
            if len(rows) >= count and extra_until is None:
                extra_until = time.monotonic() + linger
        return rows
    finally:
        c.close()


def view(rows: Rows) -> dict[tuple[str, int], list[tuple[int, bytes]]]:
    out: dict[tuple[str, int], list[tuple[int, bytes]]] = {}
    for topic, partition, offset, value in rows:
        out.setdefault((topic, partition), []).append((offset, value))
    return out


def kafka_error(exc: KafkaException) -> KafkaError:
    return exc.args[0]


def committed(c: Consumer, tps: list[TopicPartition], timeout: float = TIMEOUT) -> list[int]:
    return [tp.offset for tp in c.committed(tps, timeout=timeout)]


# -------------------------------------------------------------- idempotence
def test_default_idempotent_producer_exactly_once(gateway, topic_name):
    """enable.idempotence=true (librdkafka's default is false): every record once,
    at the offset its delivery report names; the batches carry the producer's
    id, epoch 0 and consecutive sequences."""
    create_topics(gateway, {topic_name: 3})
    p = Producer({"bootstrap.servers": gateway.bootstrap, "enable.idempotence": True,
                  "linger.ms": 5})
    records = [(topic_name, i % 3, b"idem-%d" % i) for i in range(600)]
    reports = produce(p, records)
    assert [err for _t, _p, err, _o in reports] == [None] * 600
    for partition in range(3):
        assert [o for _t, p_, _e, o in reports if p_ == partition] == list(range(200))
    rows = read(gateway, {topic_name: 3}, 600, "read_uncommitted", linger=0.5)
    for partition in range(3):
        assert view(rows)[(topic_name, partition)] == [
            (offset, b"idem-%d" % (offset * 3 + partition)) for offset in range(200)]
        log = stored_log(gateway, topic_name, partition)
        assert {(b.producer_id, b.producer_epoch) for b in log.batches} == {
            (log.batches[0].producer_id, 0)}
        assert log.batches[0].producer_id >= 0
        assert [b.base_sequence for b in log.batches] == [b.base_offset for b in log.batches]


def test_idempotent_stream_through_kill_9_is_exactly_once(gateway, topic_name):
    """kill -9 while an idempotent producer streams: librdkafka retries what
    was in flight, the gateway recognises the retries (its producer state is
    stored with the data), and every record is in the log exactly once."""
    create_topics(gateway, {topic_name: 2})
    p = Producer({"bootstrap.servers": gateway.bootstrap, "enable.idempotence": True,
                  "linger.ms": 2, "message.timeout.ms": 60_000})
    errors: list = []
    total, kill_at = 2000, 700
    for i in range(total):
        p.produce(topic_name, value=b"k9-%d" % i, partition=i % 2,
                  on_delivery=lambda err, _m: err and errors.append(err))
        p.poll(0)
        if i == kill_at:
            p.flush(TIMEOUT)  # some acknowledged before the kill, the rest after
        if i == kill_at + 100:
            gateway.kill()
            gateway.start()
    assert p.flush(TIMEOUT * 2) == 0
    assert errors == []
    rows = read(gateway, {topic_name: 2}, total, "read_uncommitted", linger=0.5)
    assert sorted(value for *_x, value in rows) == sorted(b"k9-%d" % i for i in range(total))
    for partition in range(2):
        got = view(rows)[(topic_name, partition)]
        assert [o for o, _v in got] == list(range(total // 2))  # no gap, no duplicate
        assert [v for _o, v in got] == [b"k9-%d" % i for i in range(partition, total, 2)]


def test_raw_duplicate_after_restart_gets_its_original_offset(gateway, topic_name):
    """A batch resent with the same producer id, epoch and sequence after a
    kill -9 of the gateway is answered with its original offset and stored once;
    a gap is OUT_OF_ORDER_SEQUENCE_NUMBER."""
    create_topics(gateway, {topic_name: 1})
    first = second = b""

    async def before(server: Server) -> tuple[int, int]:
        nonlocal first, second
        raw = await RawTxn.routed(server, None, topic_name, 0)
        try:
            assert await raw.init_producer_id() is ErrorCode.none
            first = make_batch([b"a", b"b", b"c"], producer_id=raw.producer_id,
                               producer_epoch=raw.epoch, base_sequence=0)
            second = make_batch([b"d", b"e"], producer_id=raw.producer_id,
                                producer_epoch=raw.epoch, base_sequence=3)
            assert await raw.produce(topic_name, 0, first) == (ErrorCode.none, 0)
            assert await raw.produce(topic_name, 0, second) == (ErrorCode.none, 3)
            return raw.producer_id, raw.epoch
        finally:
            await raw.close()

    producer_id, epoch = asyncio.run(asyncio.wait_for(before(gateway), TIMEOUT))
    gateway.kill()
    gateway.start()

    async def after(server: Server) -> list:
        raw = await RawTxn.routed(server, None, topic_name, 0)
        raw.producer_id, raw.epoch = producer_id, epoch
        try:
            gap = make_batch([b"x"], producer_id=producer_id, producer_epoch=epoch,
                             base_sequence=9)
            third = make_batch([b"f"], producer_id=producer_id, producer_epoch=epoch,
                               base_sequence=5)
            return [await raw.produce(topic_name, 0, second),
                    await raw.produce(topic_name, 0, first),
                    (await raw.produce(topic_name, 0, gap))[0],
                    await raw.produce(topic_name, 0, third)]
        finally:
            await raw.close()

    answers = asyncio.run(asyncio.wait_for(after(gateway), TIMEOUT))
    assert answers == [(ErrorCode.none, 3), (ErrorCode.none, 0),
                       ErrorCode.out_of_order_sequence_number, (ErrorCode.none, 5)]
    log = stored_log(gateway, topic_name, 0)
    assert [(b.base_offset, b.records, b.base_sequence) for b in log.batches] == [
        (0, 3, 0), (3, 2, 3), (5, 1, 5)]
    assert log.high_watermark == 6


# ----------------------------------------------------- commit and abort
def test_commit_and_abort_across_topics_and_partitions(server, topic_name):
    """One producer: c1 committed, a2 aborted, o3 left open and committed
    later, each across 2 topics and 5 partitions. read_committed sees exactly
    c1, then c1 and o3, in order, skipping the COMMIT markers' offsets."""
    kafka = is_kafka(server)
    topics = topic_names(topic_name)
    create_topics(server, topics)
    p = txn_producer(server, f"ca-{topic_name}")
    delivered = {}
    for tag, outcome in (("c1", "commit"), ("a2", "abort"), ("o3", "open")):
        p.begin_transaction()
        delivered[tag] = produce(p, txn_records(tag, topics))
        if outcome == "commit":
            p.commit_transaction(TIMEOUT)
        elif outcome == "abort":
            p.abort_transaction(TIMEOUT)
    # o3 is open: its records are flushed and acknowledged, not committed.
    offsets = log_offsets([(PER_PARTITION, "commit"), (PER_PARTITION, "abort"),
                           (PER_PARTITION, "commit")], keeps_aborted=kafka)
    per_partition = {tag: [o for t, part, _e, o in reports if (t, part) == reports[0][:2]]
                     for tag, reports in delivered.items()}
    assert all(err is None for reports in delivered.values() for *_x, err, _o in reports)
    if kafka:  # offsets assigned at produce time, aborted records included
        assert per_partition == {"c1": offsets[0], "a2": offsets[1], "o3": offsets[2]}
    else:  # base offset -1 answered: librdkafka reports -1 (None), 0, 1, 2 per batch
        assert per_partition == {tag: [None, 0, 1, 2] for tag in delivered}

    records = len(txn_records("x", topics))
    committed_view = expected_view(topics, [("c1", offsets[0])])
    assert view(read(server, topics, records, "read_committed")) == committed_view
    uncommitted = view(read(server, topics, 3 * records if kafka else records,
                            "read_uncommitted"))
    if kafka:  # Kafka hands out aborted and open records to read_uncommitted
        assert uncommitted == expected_view(
            topics, [("c1", offsets[0]), ("a2", offsets[1]), ("o3", offsets[2])])
    else:  # nothing of a2 or o3 is in any log
        assert uncommitted == committed_view
        for topic, count in topics.items():
            for partition in range(count):
                log = stored_log(server, topic, partition)
                assert (log.data_records, log.markers, log.high_watermark,
                        log.last_stable_offset) == (PER_PARTITION, [PER_PARTITION], 5, 5)

    p.commit_transaction(TIMEOUT)  # o3
    both = expected_view(topics, [("c1", offsets[0]), ("o3", offsets[2])])
    assert view(read(server, topics, 2 * records, "read_committed")) == both
    if kafka:
        assert view(read(server, topics, 3 * records, "read_uncommitted")) == expected_view(
            topics, [("c1", offsets[0]), ("a2", offsets[1]), ("o3", offsets[2])])
    else:
        assert view(read(server, topics, 2 * records, "read_uncommitted")) == both
        assert offsets[2] == [5, 6, 7, 8]  # right after c1's COMMIT marker at 4
        log = stored_log(server, f"{topic_name}-a", 0)
        assert log.markers == [4, 9] and log.high_watermark == 10


# ------------------------------------------------------------ group offsets
def test_send_offsets_moves_the_group_only_on_commit(server, topic_name):
    """send_offsets_to_transaction with a subscribed consumer's group metadata:
    the group's committed offset stays put through an abort and moves with a
    commit, together with the output records."""
    source, output, group = f"{topic_name}-in", f"{topic_name}-out", f"g-{topic_name}"
    create_topics(server, {source: 1, output: 1})
    plain = Producer({"bootstrap.servers": server.bootstrap})
    for i in range(10):
        plain.produce(source, value=b"in-%d" % i, partition=0)
    assert plain.flush(TIMEOUT) == 0

    c = consumer(server, "read_committed", group)
    c.subscribe([source])
    got = []
    deadline = time.monotonic() + TIMEOUT
    while len(got) < 10 and time.monotonic() < deadline:
        msg = c.poll(0.2)
        if msg is not None and msg.error() is None:
            got.append(msg.value())
    assert got == [b"in-%d" % i for i in range(10)]
    tp = [TopicPartition(source, 0)]
    metadata = c.consumer_group_metadata()
    # committed() of a read_uncommitted consumer does not wait for stable offsets.
    checker = consumer(server, "read_uncommitted", group)
    assert committed(checker, tp) == [OFFSET_INVALID]

    p = txn_producer(server, f"so-{topic_name}")
    p.begin_transaction()
    produce(p, [(output, 0, b"aborted")])
    p.send_offsets_to_transaction([TopicPartition(source, 0, 6)], metadata, TIMEOUT)
    assert committed(checker, tp) == [OFFSET_INVALID]
    p.abort_transaction(TIMEOUT)
    assert committed(checker, tp) == [OFFSET_INVALID]

    p.begin_transaction()
    produce(p, [(output, 0, b"out-%d" % i) for i in range(6)])
    p.send_offsets_to_transaction([TopicPartition(source, 0, 6)], metadata, TIMEOUT)
    assert committed(checker, tp) == [OFFSET_INVALID]
    p.commit_transaction(TIMEOUT)
    if is_kafka(server):  # Kafka writes the offsets after EndTxn is answered, with the markers
        wait_for(lambda: committed(checker, tp) == [6], TIMEOUT, "the offsets' marker")
    assert committed(checker, tp) == [6]  # the gateway: in EndTxn's write
    assert committed(c, tp) == [6]
    checker.close()
    c.close()
    out = [v for *_x, v in read(server, {output: 1}, 6, "read_committed")]
    assert out == [b"out-%d" % i for i in range(6)]


def test_require_stable_while_offsets_are_pending(server, topic_name):
    """While an open transaction holds a group's offset, OffsetFetch with
    require_stable answers UNSTABLE_OFFSET_COMMIT (a read_committed consumer's
    committed() keeps retrying it), without it the old offset; after the commit,
    the new offset."""
    source, group = f"{topic_name}-in", f"g-{topic_name}"
    create_topics(server, {source: 1})
    plain = Producer({"bootstrap.servers": server.bootstrap})
    for i in range(5):
        plain.produce(source, value=b"%d" % i, partition=0)
    assert plain.flush(TIMEOUT) == 0
    c = consumer(server, "read_uncommitted", group)
    c.commit(offsets=[TopicPartition(source, 0, 2)], asynchronous=False)
    metadata = c.consumer_group_metadata()

    p = txn_producer(server, f"rs-{topic_name}")
    p.begin_transaction()
    p.send_offsets_to_transaction([TopicPartition(source, 0, 5)], metadata, TIMEOUT)
    tp = (source, 0)
    assert fetch_offsets(server, group, [tp], require_stable=True)[tp][1] is (
        ErrorCode.unstable_offset_commit)
    assert fetch_offsets(server, group, [tp], require_stable=False)[tp] == (2, ErrorCode.none)
    assert committed(c, [TopicPartition(source, 0)]) == [2]  # read_uncommitted: not stable

    stable = consumer(server, "read_committed", group)
    answer: list = []
    waiter = threading.Thread(target=lambda: answer.append(
        committed(stable, [TopicPartition(source, 0)])))
    waiter.start()  # retries UNSTABLE_OFFSET_COMMIT until the commit
    p.commit_transaction(TIMEOUT)
    waiter.join(TIMEOUT)
    assert answer == [[5]]  # never the old 2
    assert fetch_offsets(server, group, [tp], require_stable=True)[tp] == (5, ErrorCode.none)
    stable.close()
    c.close()


# ----------------------------------------------------------------- fencing
def test_zombie_is_fenced_and_its_transaction_never_visible(server, topic_name):
    """A second producer with the same transactional.id: init_transactions
    aborts the first one's open transaction and fences it; the zombie's next
    produce and its commit fail with _FENCED (fatal)."""
    kafka = is_kafka(server)
    create_topics(server, {topic_name: 2})
    txn_id = f"zombie-{topic_name}"
    zombie = txn_producer(server, txn_id)
    zombie.begin_transaction()
    produce(zombie, [(topic_name, p, b"zombie-%d" % p) for p in range(2)])
    successor = txn_producer(server, txn_id)

    zombie.produce(topic_name, value=b"zombie-late", partition=0)
    with pytest.raises(KafkaException) as flushed:
        zombie.flush(TIMEOUT)  # the Produce is refused: a fatal error, raised by flush
    assert kafka_error(flushed.value).code() == KafkaError._FENCED
    with pytest.raises(KafkaException) as failed:
        zombie.commit_transaction(TIMEOUT)
    error = kafka_error(failed.value)
    assert (error.code(), error.fatal()) == (KafkaError._FENCED, True)

    successor.begin_transaction()
    produce(successor, [(topic_name, 0, b"successor")])
    successor.commit_transaction(TIMEOUT)
    # Kafka: the zombie's record (0) and its ABORT marker (1) come first.
    expected = {(topic_name, 0): [(2 if kafka else 0, b"successor")]}
    assert view(read(server, {topic_name: 2}, 1, "read_committed")) == expected
    if not kafka:
        assert view(read(server, {topic_name: 2}, 1, "read_uncommitted")) == expected
        assert stored_log(server, topic_name, 1).high_watermark == 0


# ---------------------------------------------------------------- conflicts
@pytest.mark.parametrize("loser_sends_offsets", ["before_winner_commits",
                                                 "after_winner_commits"])
def test_two_transactional_ids_one_group_partition(server, topic_name, loser_sends_offsets):
    """Two producers (different transactional ids) commit the same new offset
    of one group partition: in the gateway exactly one lands; the loser's
    error is abortable, it aborts and its next transaction commits. Kafka
    lets both land: the output has both producers' records for one range."""
    kafka = is_kafka(server)
    source, output, group = f"{topic_name}-in", f"{topic_name}-out", f"g-{topic_name}"
    create_topics(server, {source: 1, output: 1})
    assigned_only = consumer(server, "read_uncommitted", group)
    metadata = assigned_only.consumer_group_metadata()
    assigned_only.close()
    offsets = [TopicPartition(source, 0, 10)]
    winner = txn_producer(server, f"win-{topic_name}")
    loser = txn_producer(server, f"lose-{topic_name}")
    for p, tag in ((winner, b"winner"), (loser, b"loser")):
        p.begin_transaction()
        produce(p, [(output, 0, tag)])
    winner.send_offsets_to_transaction(offsets, metadata, TIMEOUT)
    early = loser_sends_offsets == "before_winner_commits"
    if early:
        loser.send_offsets_to_transaction(offsets, metadata, TIMEOUT)
    winner.commit_transaction(TIMEOUT)

    def loser_commits() -> None:
        if not early:
            loser.send_offsets_to_transaction(offsets, metadata, TIMEOUT)
        loser.commit_transaction(TIMEOUT)

    if kafka:
        loser_commits()
        landed = [b"winner", b"loser"]
    else:
        with pytest.raises(KafkaException) as failed:
            loser_commits()
        error = kafka_error(failed.value)
        # EndTxn answers UNKNOWN_PRODUCER_ID, TxnOffsetCommit ILLEGAL_GENERATION.
        code = KafkaError.UNKNOWN_PRODUCER_ID if early else KafkaError.ILLEGAL_GENERATION
        assert (error.code(), error.txn_requires_abort(), error.fatal()) == (code, True, False)
        loser.abort_transaction(TIMEOUT)
        landed = [b"winner"]
    loser.begin_transaction()  # the loser goes on by itself
    produce(loser, [(output, 0, b"loser-next")])
    loser.commit_transaction(TIMEOUT)
    stable = {(source, 0): (10, ErrorCode.none)}
    if kafka:  # until the coordinator wrote the markers
        wait_for(lambda: fetch_offsets(server, group, [(source, 0)], True) == stable, TIMEOUT,
                 "stable offsets")
    assert fetch_offsets(server, group, [(source, 0)], require_stable=True) == stable
    values = [v for *_x, v in read(server, {output: 1}, len(landed) + 1, "read_committed")]
    assert values == [*landed, b"loser-next"]


# ----------------------------------------------------------------- timeout
def test_transaction_timeout_aborts_and_fences(gateway, topic_name):
    """transaction.timeout.ms=2000: the gateway aborts the open transaction
    (nothing of it is visible) and bumps the epoch, so the producer is fenced."""
    create_topics(gateway, {topic_name: 2})
    txn_id = f"timeout-{topic_name}"
    p = txn_producer(gateway, txn_id, **{"transaction.timeout.ms": TXN_TIMEOUT_MS})
    p.begin_transaction()
    produce(p, [(topic_name, part, b"late") for part in range(2)])
    wait_for(lambda: timed_out(gateway, txn_id), TIMEOUT, "the transaction to time out")
    with pytest.raises(KafkaException) as failed:
        p.commit_transaction(TIMEOUT)
    error = kafka_error(failed.value)
    assert (error.code(), error.fatal()) == (KafkaError._FENCED, True)
    assert [stored_log(gateway, topic_name, part).high_watermark for part in range(2)] == [0, 0]


# -------------------------------------------------- topic recreated
def test_commit_skips_a_topic_recreated_under_the_transaction(gateway, topic_name):
    """A topic of the open transaction is deleted and created again under the
    same name before the commit: the commit succeeds for the rest and leaves
    the new topic untouched (no COMMIT marker: high watermark 0 on every
    partition), and nothing of the old topic's records is readable."""
    recreated, other = f"{topic_name}-r", f"{topic_name}-o"
    create_topics(gateway, {recreated: 2, other: 1})
    p = txn_producer(gateway, f"recreate-{topic_name}")
    p.begin_transaction()
    produce(p, [(recreated, 0, b"old-0"), (recreated, 1, b"old-1"), (other, 0, b"kept")])
    admin = AdminClient({"bootstrap.servers": gateway.bootstrap})
    admin.delete_topics([recreated])[recreated].result(TIMEOUT)
    create_topics(gateway, {recreated: 2})  # the deletion was answered once done
    p.commit_transaction(TIMEOUT)
    assert [stored_log(gateway, recreated, part).high_watermark for part in range(2)] == [0, 0]
    assert view(read(gateway, {recreated: 2, other: 1}, 1, "read_uncommitted")) == {
        (other, 0): [(0, b"kept")]}
    log = stored_log(gateway, other, 0)
    assert (log.data_records, log.markers) == (1, [1])


# ----------------------------------------------------------------- kill -9
def test_kill_9_between_produce_and_commit(gateway, topic_name):
    """After a kill -9 between produce and commit, the transaction is still
    open: the same producer commits it, and everything becomes visible. A
    transaction abandoned across the restart times out, and nothing of it shows."""
    topics = topic_names(topic_name)
    create_topics(gateway, topics)
    p = txn_producer(gateway, f"k9-{topic_name}")
    p.begin_transaction()
    produce(p, txn_records("k9", topics))
    abandoned_id = f"k9-abandoned-{topic_name}"
    abandoned = txn_producer(gateway, abandoned_id,
                             **{"transaction.timeout.ms": TXN_TIMEOUT_MS})
    abandoned.begin_transaction()
    produce(abandoned, txn_records("lost", topics))
    gateway.kill()
    gateway.start()
    p.commit_transaction(TIMEOUT)
    records = len(txn_records("x", topics))
    assert view(read(gateway, topics, records, "read_uncommitted")) == expected_view(
        topics, [("k9", list(range(PER_PARTITION)))])
    wait_for(lambda: timed_out(gateway, abandoned_id), TIMEOUT, "the abandoned timeout")
    for topic, count in topics.items():
        for partition in range(count):
            log = stored_log(gateway, topic, partition)
            assert (log.data_records, log.markers) == (PER_PARTITION, [PER_PARTITION])


KILL_ROUNDS = 8  # at most; each round is a producer process and a gateway restart


def test_kill_9_during_commit_is_all_or_nothing(gateway, topic_name):
    """kill -9 of the gateway (and of the producer) while EndTxn(commit) is
    under way: after the restart each transaction's records are in every
    partition or in none, a commit the producer saw acknowledged is all of
    them, and the next session of the transactional id finishes it (aborting
    it if it was still open) without changing the answer.

    The moment of the kill is searched, not guessed: the first round kills as
    soon as the producer starts committing, the next ones wait twice as long
    each until a round finds the commit done, then they bisect between the
    latest "none" and the earliest "all", closing in on the commit's write.
    The rounds must show both outcomes, so the kills did straddle the commit
    (if no round committed by the last one, that round kills once the
    producer saw the commit acknowledged: the restart must keep it).
    """
    rounds: list[tuple[float | None, str, bool]] = []  # (delay, outcome, acknowledged)
    latest_none: float = 0.0  # seconds
    earliest_all: float | None = None
    delay: float | None = 0.0
    for round_ in range(KILL_ROUNDS):
        if round_ == KILL_ROUNDS - 1 and earliest_all is None:
            delay = None  # after the acknowledgement
        topics = {f"{topic_name}-{round_}-{s}": n for s, n in (("a", 4), ("b", 4))}
        seen, acknowledged = kill_during_commit(gateway, f"kc-{topic_name}-{round_}", topics,
                                                delay)
        assert seen in ({0}, {50}), f"round {round_}: a partial commit: {seen}"
        assert seen == {50} or not acknowledged, (
            f"round {round_}: the producer saw its commit acknowledged, but it is gone")
        outcome = "all" if seen == {50} else "none"
        rounds.append((delay, outcome, acknowledged))
        if delay is None:
            break
        if outcome == "all":
            earliest_all = delay if earliest_all is None else min(earliest_all, delay)
        else:
            latest_none = max(latest_none, delay)
        outcomes = {outcome for _d, outcome, _a in rounds}
        if outcomes == {"all", "none"} and len(rounds) >= 5:
            break
        delay = (max(2 * delay, 0.002) if earliest_all is None
                 else (latest_none + earliest_all) / 2)
    print("kill -9 during commit, per round (delay ms, outcome, acknowledged):",
          [(None if d is None else round(d * 1000, 2), o, a) for d, o, a in rounds])
    assert {outcome for _d, outcome, _a in rounds} == {"all", "none"}, rounds


def kill_during_commit(gateway, txn_id: str, topics: dict[str, int],
                       delay: float | None) -> tuple[set[int], bool]:
    """One producer process commits 50 records per partition; the gateway is
    killed ``delay`` seconds after the producer starts committing (None: once
    it saw the commit acknowledged), then restarted, and the next session of
    the transactional id begins. Returns (the distinct record counts of the
    partitions, whether the producer saw the commit acknowledged)."""
    create_topics(gateway, topics)
    worker = subprocess.Popen(
        [sys.executable, str(WORKER), gateway.bootstrap, txn_id, "50",
         *(f"{t}:{n}" for t, n in topics.items())],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert worker.stdout is not None
        assert worker.stdout.readline().strip() == "committing"
        if delay is None:
            assert worker.stdout.readline().strip() == "committed"
        else:
            time.sleep(delay)
        gateway.kill()
    finally:
        worker.kill()
        worker.wait(10)
    # The producer prints "committed" only after the answer, which the
    # gateway sent before it was killed.
    acknowledged = delay is None or "committed" in worker.stdout.read()
    gateway.start()
    seen = visible_records(gateway, topics)
    txn_producer(gateway, txn_id)  # the next session aborts it if still open
    assert visible_records(gateway, topics) == seen
    return seen, acknowledged


def visible_records(gateway, topics: dict[str, int]) -> set[int]:
    """The distinct numbers of data records the topics' partitions hold."""
    return {stored_log(gateway, topic, partition).data_records
            for topic, count in topics.items() for partition in range(count)}


# ------------------------------------------------------- delayed EndTxn
def test_delayed_end_txn_cannot_end_a_later_transaction(gateway, topic_name):
    """KAFKA-17754: txn N on connection A; its EndTxn(commit) is retried on a
    new connection B and succeeds; txn N+1 begins on B; then A's delayed
    EndTxn(commit) of N arrives: it is refused and N+1 stays open, until B
    commits it."""
    create_topics(gateway, {topic_name: 1})
    txn_id = f"delayed-{topic_name}"

    async def scenario() -> tuple[ErrorCode, ErrorCode, RawTxn]:
        # Each connection to the id's coordinator, its Produce to the leader.
        a = await RawTxn.routed(gateway, txn_id, topic_name, 0)
        try:
            assert await a.init_producer_id() is ErrorCode.none
            assert await a.add_partitions(topic_name, 0) is ErrorCode.none
            batch_n = make_batch([b"n-0", b"n-1"], producer_id=a.producer_id,
                                 producer_epoch=a.epoch, base_sequence=0, attributes=0x10)
            assert await a.produce(topic_name, 0, batch_n) == (ErrorCode.none, -1)
            # A's EndTxn(commit) is "lost"; the client retries it on a new connection.
            b = (await RawTxn.routed(gateway, txn_id, topic_name, 0)).adopt(a)
            retried = await b.end_txn(commit=True)
            assert await b.add_partitions(topic_name, 0) is ErrorCode.none
            batch_next = make_batch([b"next-0"], producer_id=b.producer_id,
                                    producer_epoch=b.epoch, base_sequence=2, attributes=0x10)
            assert await b.produce(topic_name, 0, batch_next) == (ErrorCode.none, -1)
            delayed = await a.end_txn(commit=True)  # arrives late, on A
            return retried, delayed, b
        finally:
            await a.close()

    async def commit_next(b: RawTxn) -> ErrorCode:
        try:
            return await b.end_txn(commit=True)
        finally:
            await b.close()

    loop = asyncio.new_event_loop()  # B stays open while the log is read
    try:
        retried, delayed, b = loop.run_until_complete(asyncio.wait_for(scenario(), TIMEOUT))
        assert (retried, delayed) == (ErrorCode.none, ErrorCode.invalid_txn_state)
        log = stored_log_reaching(gateway, topic_name, 0, 3)  # N committed, N+1 still open
        assert (log.data_records, log.markers, log.high_watermark) == (2, [2], 3)
        committed_next = loop.run_until_complete(asyncio.wait_for(commit_next(b), TIMEOUT))
        assert committed_next is ErrorCode.none
    finally:
        loop.close()
    log = stored_log_reaching(gateway, topic_name, 0, 5)
    assert [(b.base_offset, b.records, b.control) for b in log.batches] == [
        (0, 2, False), (2, 1, True), (3, 1, False), (4, 1, True)]
