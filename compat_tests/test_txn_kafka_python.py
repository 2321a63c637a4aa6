"""kafka-python (3.0): idempotent and transactional producers against the gateway.

kafka-python's default producer is idempotent. Its transactional API
(init_transactions, begin/commit/abort_transaction, send_offsets_to_transaction
with the consumer's group_metadata(), KIP-447) waits without a timeout of its
own: every such call here runs through ``within``.

What kafka-python reports, as asserted below:

- a transactional send's RecordMetadata carries offset -1 for every record:
  the gateway answers base offset -1 (offsets are assigned at commit);
- a fenced producer: its send fails with InvalidProducerEpochError, upon
  which it tries to bump its epoch (KIP-360); InitProducerId answers
  PRODUCER_FENCED and the producer fails for good: its commit raises
  KafkaError("... in an error state: ProducerFencedError");
- an offset-range conflict at TxnOffsetCommit (ILLEGAL_GENERATION):
  CommitFailedError, abortable: abort_transaction() and go on;
- an offset-range conflict found at EndTxn(commit) (UNKNOWN_PRODUCER_ID):
  kafka-python's EndTxn handler knows no abortable error, so the producer
  fails for good ("Unhandled error in EndTxnResponse"); nothing of the
  transaction landed, and a new producer with the same transactional_id
  goes on (as Kafka Streams does with the Java client);
- committed() of a read_committed consumer sends OffsetFetch with
  require_stable and retries UNSTABLE_OFFSET_COMMIT until the commit.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import (
    CommitFailedError,
    InvalidProducerEpochError,
    KafkaError,
    ProducerFencedError,
)
from kafka.structs import OffsetAndMetadata
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
    wait_for,
    within,
)

TIMEOUT_S = 30.0
Rows = list[tuple[str, int, int, bytes]]  # (topic, partition, offset, value)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with txn_gateway(tmp_path_factory.mktemp("txn-kafka-python") / "data") as gw:
        yield gw


# ------------------------------------------------------------------ helpers
def create_topics(gateway, topics: dict[str, int]) -> None:
    admin = KafkaAdminClient(bootstrap_servers=gateway.bootstrap, request_timeout_ms=20000)
    try:
        admin.create_topics([NewTopic(name, count, 1) for name, count in topics.items()])
    finally:
        admin.close()


@contextmanager
def txn_producer(gateway, transactional_id: str, **config: Any) -> Iterator[KafkaProducer]:
    producer = KafkaProducer(bootstrap_servers=gateway.bootstrap,
                             transactional_id=transactional_id, max_block_ms=20000,
                             request_timeout_ms=20000, **config)
    try:
        within(TIMEOUT_S, producer.init_transactions)
        yield producer
    finally:
        producer.close(timeout=5)


def send(producer: KafkaProducer, records: list[tuple[str, int, bytes]]) -> list[int]:
    """Send and flush; the offset each record's metadata reports, in order."""
    futures = [producer.send(topic, value=value, partition=partition)
               for topic, partition, value in records]
    producer.flush(TIMEOUT_S)
    return [future.get(TIMEOUT_S).offset for future in futures]


def consumer(gateway, isolation: str, group: str | None = None, **config: Any) -> KafkaConsumer:
    return KafkaConsumer(bootstrap_servers=gateway.bootstrap, group_id=group,
                         enable_auto_commit=False, auto_offset_reset="earliest",
                         isolation_level=isolation, request_timeout_ms=30000,
                         fetch_max_wait_ms=100, **config)


def read(gateway, topics: dict[str, int], count: int, isolation: str,
         linger: float = 1.0) -> Rows:
    """Every partition from the beginning: ``count`` records, then ``linger``
    seconds more, so that a record too many is seen too."""
    cons = consumer(gateway, isolation)
    try:
        cons.assign([TopicPartition(t, p) for t, n in topics.items() for p in range(n)])
        rows: Rows = []
        deadline, extra_until = time.monotonic() + TIMEOUT_S, None
        while time.monotonic() < (extra_until or deadline):
            for batch in cons.poll(timeout_ms=200).values():
                rows += [(r.topic, r.partition, r.offset, r.value) for r in batch]
            if len(rows) >= count and extra_until is None:
                extra_until = time.monotonic() + linger
        return rows
    finally:
        cons.close(autocommit=False)


def view(rows: Rows) -> dict[tuple[str, int], list[tuple[int, bytes]]]:
    out: dict[tuple[str, int], list[tuple[int, bytes]]] = {}
    for topic, partition, offset, value in sorted(rows, key=lambda r: r[:3]):
        out.setdefault((topic, partition), []).append((offset, value))
    return out


def produce_source(gateway, topic: str, count: int) -> None:
    producer = KafkaProducer(bootstrap_servers=gateway.bootstrap)
    try:
        send(producer, [(topic, 0, b"in-%d" % i) for i in range(count)])
    finally:
        producer.close(timeout=5)


# -------------------------------------------------------------- idempotence
def test_default_producer_is_idempotent_exactly_once(gateway, topic_name):
    """KafkaProducer() as it comes: InitProducerId, then batches with the
    producer's id and sequences; every record once, at the offset acknowledged."""
    create_topics(gateway, {topic_name: 2})
    producer = KafkaProducer(bootstrap_servers=gateway.bootstrap, linger_ms=5)
    try:
        offsets = send(producer, [(topic_name, i % 2, b"idem-%d" % i) for i in range(400)])
    finally:
        producer.close(timeout=5)
    assert offsets == [i // 2 for i in range(400)]
    rows = view(read(gateway, {topic_name: 2}, 400, "read_uncommitted", linger=0.5))
    for partition in range(2):
        assert rows[(topic_name, partition)] == [
            (o, b"idem-%d" % (2 * o + partition)) for o in range(200)]
        assert_one_idempotent_producer(gateway, topic_name, partition)


# ----------------------------------------------------- commit and abort
def test_commit_and_abort_across_topics_and_partitions(gateway, topic_name):
    """c1 committed, a2 aborted, o3 open then committed, over 2 topics and 5
    partitions: read_committed and read_uncommitted consumers both see
    exactly c1, then c1 and o3, in order, the COMMIT markers' offsets skipped."""
    topics = topic_names(topic_name)
    create_topics(gateway, topics)
    records = len(txn_records("x", topics))
    with txn_producer(gateway, f"ca-{topic_name}", linger_ms=5) as producer:
        for tag, outcome in (("c1", "commit"), ("a2", "abort"), ("o3", "open")):
            producer.begin_transaction()
            assert send(producer, txn_records(tag, topics)) == [-1] * records
            if outcome == "commit":
                within(TIMEOUT_S, producer.commit_transaction)
            elif outcome == "abort":
                within(TIMEOUT_S, producer.abort_transaction)
        offsets = log_offsets([(PER_PARTITION, "commit"), (PER_PARTITION, "abort"),
                               (PER_PARTITION, "commit")], keeps_aborted=False)
        first = expected_view(topics, [("c1", offsets[0])])
        for isolation in ("read_committed", "read_uncommitted"):
            assert view(read(gateway, topics, records, isolation)) == first, isolation
        within(TIMEOUT_S, producer.commit_transaction)
    both = expected_view(topics, [("c1", offsets[0]), ("o3", offsets[2])])
    for isolation in ("read_committed", "read_uncommitted"):
        assert view(read(gateway, topics, 2 * records, isolation, linger=0.3)) == both


# ------------------------------------------------------------ group offsets
def test_send_offsets_moves_the_group_only_on_commit(gateway, topic_name):
    """send_offsets_to_transaction with a subscribed consumer's group_metadata():
    committed() stays put through an abort and moves with the commit; a
    read_committed consumer's committed() (require_stable) waits for the commit."""
    source, output, group = f"{topic_name}-in", f"{topic_name}-out", f"g-{topic_name}"
    create_topics(gateway, {source: 1, output: 1})
    produce_source(gateway, source, 10)
    tp = TopicPartition(source, 0)
    member = consumer(gateway, "read_committed", group, session_timeout_ms=10000)
    checker = consumer(gateway, "read_uncommitted", group)
    try:
        member.subscribe([source])
        got: list = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(got) < 10 and time.monotonic() < deadline:
            for batch in member.poll(timeout_ms=200).values():
                got += [r.value for r in batch]
        assert got == [b"in-%d" % i for i in range(10)]
        metadata = member.group_metadata()
        assert metadata.generation_id >= 1 and metadata.member_id
        assert checker.committed(tp) is None

        with txn_producer(gateway, f"so-{topic_name}") as producer:
            producer.begin_transaction()
            send(producer, [(output, 0, b"aborted")])
            within(TIMEOUT_S, producer.send_offsets_to_transaction,
                   {tp: OffsetAndMetadata(6, "", -1)}, metadata)
            assert fetch_offsets(gateway, group, [(source, 0)], True)[(source, 0)][1] is (
                ErrorCode.unstable_offset_commit)
            assert checker.committed(tp) is None
            within(TIMEOUT_S, producer.abort_transaction)
            assert checker.committed(tp) is None

            producer.begin_transaction()
            send(producer, [(output, 0, b"out-%d" % i) for i in range(6)])
            within(TIMEOUT_S, producer.send_offsets_to_transaction,
                   {tp: OffsetAndMetadata(6, "", -1)}, metadata)
            assert checker.committed(tp) is None
            answer: list = []
            waiter = threading.Thread(target=lambda: answer.append(
                member.committed(tp, timeout_ms=int(TIMEOUT_S * 1000))))
            waiter.start()  # require_stable: retries UNSTABLE_OFFSET_COMMIT
            within(TIMEOUT_S, producer.commit_transaction)
            waiter.join(TIMEOUT_S)
            assert answer == [6]  # never None, the offset before the commit
            assert checker.committed(tp) == 6
    finally:
        checker.close(autocommit=False)
        member.close(autocommit=False)
    assert [v for *_x, v in read(gateway, {output: 1}, 6, "read_committed")] == [
        b"out-%d" % i for i in range(6)]


# ----------------------------------------------------------------- fencing
def test_zombie_is_fenced_and_its_transaction_never_visible(gateway, topic_name):
    """A second producer with the same transactional_id aborts the first one's
    open transaction; the zombie's next send fails with InvalidProducerEpochError
    (Produce answers INVALID_PRODUCER_EPOCH, as Kafka's does), its attempt to
    bump its epoch is refused, and its commit fails: ProducerFencedError."""
    create_topics(gateway, {topic_name: 2})
    txn_id = f"zombie-{topic_name}"
    with txn_producer(gateway, txn_id) as zombie:
        zombie.begin_transaction()
        send(zombie, [(topic_name, p, b"zombie-%d" % p) for p in range(2)])
        with txn_producer(gateway, txn_id) as successor:
            late = zombie.send(topic_name, value=b"zombie-late", partition=0)
            zombie.flush(TIMEOUT_S)
            with pytest.raises(InvalidProducerEpochError):  # Produce's code, as from Kafka
                late.get(TIMEOUT_S)
            # kafka-python answers that by bumping its epoch (KIP-360), which the
            # gateway refuses with PRODUCER_FENCED: from then on it is fenced.
            wait_for(lambda: commit_fails_fenced(zombie), TIMEOUT_S, "the zombie fenced")
            successor.begin_transaction()
            send(successor, [(topic_name, 0, b"successor")])
            within(TIMEOUT_S, successor.commit_transaction)
    for isolation in ("read_committed", "read_uncommitted"):
        assert view(read(gateway, {topic_name: 2}, 1, isolation)) == {
            (topic_name, 0): [(0, b"successor")]}
    assert stored_log(gateway, topic_name, 1).high_watermark == 0


def commit_fails_fenced(producer: KafkaProducer) -> bool:
    """Whether commit_transaction fails because the producer was fenced:
    ProducerFencedError, or, once that error made the producer fail for good,
    the KafkaError kafka-python raises for every later call, naming it. False
    while the producer is still in another state (e.g. bumping its epoch)."""
    try:
        within(TIMEOUT_S, producer.commit_transaction)
    except KafkaError as exc:
        return isinstance(exc, ProducerFencedError) or "ProducerFencedError" in str(exc)
    raise AssertionError("a fenced producer committed")


# ---------------------------------------------------------------- conflicts
def test_conflict_at_txn_offset_commit_is_abortable(gateway, topic_name):
    """Two transactional ids, one group partition: the winner commits offset
    10 first; the loser's send_offsets_to_transaction for the same range then
    fails with CommitFailedError (ILLEGAL_GENERATION); it aborts and goes on."""
    source, output, group = f"{topic_name}-in", f"{topic_name}-out", f"g-{topic_name}"
    create_topics(gateway, {source: 1, output: 1})
    offsets = {TopicPartition(source, 0): OffsetAndMetadata(10, "", -1)}
    with txn_producer(gateway, f"win-{topic_name}") as winner, \
            txn_producer(gateway, f"lose-{topic_name}") as loser:
        for producer, tag in ((winner, b"winner"), (loser, b"loser")):
            producer.begin_transaction()
            send(producer, [(output, 0, tag)])
        within(TIMEOUT_S, winner.send_offsets_to_transaction, offsets, group)
        within(TIMEOUT_S, winner.commit_transaction)
        with pytest.raises(CommitFailedError):
            within(TIMEOUT_S, loser.send_offsets_to_transaction, offsets, group)
        within(TIMEOUT_S, loser.abort_transaction)
        loser.begin_transaction()
        send(loser, [(output, 0, b"loser-next")])
        within(TIMEOUT_S, loser.commit_transaction)
    assert fetch_offsets(gateway, group, [(source, 0)], True) == {
        (source, 0): (10, ErrorCode.none)}
    assert [v for *_x, v in read(gateway, {output: 1}, 2, "read_committed")] == [
        b"winner", b"loser-next"]


def test_conflict_at_end_txn_fails_the_producer_a_new_one_goes_on(gateway, topic_name):
    """Both transactions stage offset 10 of the same group partition; the
    winner commits first. The loser's EndTxn(commit) is answered
    UNKNOWN_PRODUCER_ID: kafka-python treats every EndTxn error but the
    retriable ones as fatal, so its commit_transaction raises KafkaError and
    the producer is done. Nothing of its transaction landed; a new producer
    with the same transactional_id commits the next transaction."""
    source, output, group = f"{topic_name}-in", f"{topic_name}-out", f"g-{topic_name}"
    create_topics(gateway, {source: 1, output: 1})
    offsets = {TopicPartition(source, 0): OffsetAndMetadata(10, "", -1)}
    loser_id = f"lose-{topic_name}"
    with txn_producer(gateway, f"win-{topic_name}") as winner, \
            txn_producer(gateway, loser_id) as loser:
        for producer, tag in ((winner, b"winner"), (loser, b"loser")):
            producer.begin_transaction()
            send(producer, [(output, 0, tag)])
            within(TIMEOUT_S, producer.send_offsets_to_transaction, offsets, group)
        within(TIMEOUT_S, winner.commit_transaction)
        with pytest.raises(KafkaError, match="UnknownProducerId"):
            within(TIMEOUT_S, loser.commit_transaction)
        with pytest.raises(KafkaError):
            loser.begin_transaction()  # fatal: this producer is done
    with txn_producer(gateway, loser_id) as successor:
        successor.begin_transaction()
        send(successor, [(output, 0, b"loser-next")])
        within(TIMEOUT_S, successor.commit_transaction)
    assert fetch_offsets(gateway, group, [(source, 0)], True) == {
        (source, 0): (10, ErrorCode.none)}
    assert [v for *_x, v in read(gateway, {output: 1}, 2, "read_committed")] == [
        b"winner", b"loser-next"]


# ----------------------------------------------------------------- timeout
def test_transaction_timeout_aborts_and_fences(gateway, topic_name):
    """transaction_timeout_ms=2000: the gateway aborts the open transaction
    (nothing of it is stored in the log) and bumps the epoch: the producer's
    commit raises ProducerFencedError."""
    create_topics(gateway, {topic_name: 1})
    txn_id = f"timeout-{uuid.uuid4().hex[:8]}"
    with txn_producer(gateway, txn_id, transaction_timeout_ms=TXN_TIMEOUT_MS) as producer:
        producer.begin_transaction()
        send(producer, [(topic_name, 0, b"late")])
        wait_for(lambda: timed_out(gateway, txn_id), TIMEOUT_S, "the transaction to time out")
        with pytest.raises(ProducerFencedError):
            within(TIMEOUT_S, producer.commit_transaction)
    assert stored_log(gateway, topic_name, 0).high_watermark == 0
