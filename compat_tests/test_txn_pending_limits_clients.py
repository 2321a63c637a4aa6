"""The limits on open transactions' stored batches with real clients
(docs/transactions.md, "Limits on open transactions").

A gateway with ``gateway.txn.max.bytes`` and ``gateway.txn.pending.disk.bytes``
set low: the batch that would cross one is answered POLICY_VIOLATION and
nothing of it is stored; the client's transaction becomes abortable (not
fatal); after abort_transaction() the bytes are given back and the same
producer's next transaction commits. librdkafka (confluent-kafka 2.16), the
Java client 3.4.1, kafka-python 3, aiokafka 0.14 and kafkajs 2.2 (js/txn.js,
scenario overLimit).

aiokafka and kafkajs do not stop a commit after a failed send: an
EndTxn(commit) then aborts the doomed transaction (UNKNOWN_PRODUCER_ID, fatal
for both), so a transaction missing a refused batch never commits.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError as AIOKafkaError
from aiokafka.errors import PolicyViolationError as AIOPolicyViolation
from compat_helpers import create_topic
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from java_helpers import by_op, run_java
from kafka import KafkaProducer
from kafka.errors import KafkaError as KPKafkaError
from kafka.errors import PolicyViolationError
from txn_helpers import TXN_GATEWAY_ARGS, stored_log, wait_for, within

from testkit import prom
from testkit.gateway import GatewayProcess

TIMEOUT = 30
JS_DIR = Path(__file__).resolve().parent / "js"
VALUE = b"v" * 10_000
# Each open transaction may store 3 batches of one VALUE (about 10 KB each),
# the node 5 of them.
TXN_LIMIT = 35_000
NODE_LIMIT = 55_000


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    data = tmp_path_factory.mktemp("txn-limits") / "data"
    with GatewayProcess(data, *TXN_GATEWAY_ARGS, "--admin-listen", "127.0.0.1:0",
                        "--txn-max-bytes", str(TXN_LIMIT),
                        "--txn-pending-disk-bytes", str(NODE_LIMIT)) as gw:
        yield gw


def metric(gateway: GatewayProcess, name: str, **labels: str) -> float:
    return prom.value(gateway.metrics(), f"kafka_gateway_{name}", **labels)


def txn_producer(gateway: GatewayProcess, transactional_id: str) -> Producer:
    # linger.ms=0 and a flush after each record: one record per batch.
    producer = Producer({"bootstrap.servers": gateway.bootstrap,
                         "transactional.id": transactional_id, "linger.ms": 0})
    producer.init_transactions(TIMEOUT)
    return producer


def send(producer: Producer, topic: str, value: bytes) -> KafkaError | None:
    """Produce one record and flush: the delivery report's error (None: delivered)."""
    reports: list[KafkaError | None] = []
    producer.produce(topic, value=value, partition=0,
                     on_delivery=lambda err, _msg: reports.append(err))
    assert producer.flush(TIMEOUT) == 0
    [error] = reports
    return error


def committed_values(gateway: GatewayProcess, topic: str, count: int) -> list[bytes]:
    """``count`` records of partition 0 at read_committed, then a second more
    (so one too many is seen too)."""
    reader = Consumer({"bootstrap.servers": gateway.bootstrap, "group.id": uuid.uuid4().hex,
                       "isolation.level": "read_committed", "enable.auto.commit": False})
    try:
        reader.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        out: list[bytes] = []
        deadline, extra = time.monotonic() + TIMEOUT, None
        while time.monotonic() < (extra or deadline):
            msg = reader.poll(0.2)
            if msg is not None:
                assert msg.error() is None, msg.error()
                out.append(msg.value())
            if len(out) >= count and extra is None:
                extra = time.monotonic() + 1
        return out
    finally:
        reader.close()


def assert_abortable(producer: Producer) -> None:
    """commit_transaction() fails with the refused batch's error, abortable,
    not fatal (librdkafka does not show the broker's error message)."""
    with pytest.raises(KafkaException) as failed:
        producer.commit_transaction(TIMEOUT)
    error = failed.value.args[0]
    assert (error.code(), error.txn_requires_abort(), error.fatal(), error.retriable()) == \
        (KafkaError.POLICY_VIOLATION, True, False, False), error


def assert_logged(gateway: GatewayProcess, transactional_id: str, limit: str) -> None:
    """The gateway logged why the transaction can only abort (its log is read
    by a thread: wait for the line)."""
    wait_for(lambda: any(f"transaction {transactional_id} " in line and limit in line
                         and "can only abort" in line
                         for line in gateway.output().splitlines()),
             TIMEOUT, f"the log line dooming {transactional_id}")


def test_a_transaction_past_its_limit_aborts_and_the_producer_goes_on(gateway, topic_name):
    create_topic(gateway, topic_name)
    doomed_before = metric(gateway, "txn_pending_limit_doomed_total", limit="transaction")
    producer = txn_producer(gateway, f"big-{topic_name}")
    producer.begin_transaction()
    for _ in range(3):
        assert send(producer, topic_name, VALUE) is None
    assert 3 * len(VALUE) < metric(gateway, "txn_pending_stored_bytes") <= TXN_LIMIT
    error = send(producer, topic_name, VALUE)  # the fourth would cross the limit
    assert error is not None and error.code() == KafkaError.POLICY_VIOLATION, error
    assert_logged(gateway, f"big-{topic_name}", "gateway.txn.max.bytes")
    assert metric(gateway, "txn_pending_limit_doomed_total", limit="transaction") == \
        doomed_before + 1
    assert_abortable(producer)
    producer.abort_transaction(TIMEOUT)
    assert metric(gateway, "txn_pending_stored_bytes") == 0
    assert metric(gateway, "txn_pending_memory_bytes") == 0
    # The same producer's next transaction commits; nothing of the first is visible.
    producer.begin_transaction()
    assert send(producer, topic_name, b"next") is None
    producer.commit_transaction(TIMEOUT)
    assert committed_values(gateway, topic_name, 1) == [b"next"]
    assert stored_log(gateway, topic_name, 0).high_watermark == 2  # the record, its marker


def test_the_node_limit_dooms_the_transaction_that_crosses_it(gateway, topic_name):
    create_topic(gateway, topic_name)
    doomed_before = metric(gateway, "txn_pending_limit_doomed_total", limit="node")
    holder = txn_producer(gateway, f"holder-{topic_name}")
    crosser = txn_producer(gateway, f"crosser-{topic_name}")
    holder.begin_transaction()
    crosser.begin_transaction()
    for _ in range(3):
        assert send(holder, topic_name, VALUE) is None
    for _ in range(2):
        assert send(crosser, topic_name, VALUE) is None
    error = send(crosser, topic_name, VALUE)  # the node's sixth batch
    assert error is not None and error.code() == KafkaError.POLICY_VIOLATION, error
    assert_logged(gateway, f"crosser-{topic_name}", "gateway.txn.pending.disk.bytes")
    assert metric(gateway, "txn_pending_limit_doomed_total", limit="node") == doomed_before + 1
    holder.commit_transaction(TIMEOUT)  # the other transaction is not affected
    assert_abortable(crosser)
    crosser.abort_transaction(TIMEOUT)
    assert metric(gateway, "txn_pending_stored_bytes") == 0
    crosser.begin_transaction()
    assert send(crosser, topic_name, b"crosser-next") is None
    crosser.commit_transaction(TIMEOUT)
    assert committed_values(gateway, topic_name, 4) == [VALUE] * 3 + [b"crosser-next"]



def test_the_counts_are_right_after_kill_9(tmp_path, topic_name):
    """After a kill -9 the gateway counts an open transaction's stored batches
    again from the store (none held in memory), and the limit applies to
    them: the producer's batch that crosses it after the restart is refused."""
    with GatewayProcess(tmp_path / "data", *TXN_GATEWAY_ARGS, "--admin-listen", "127.0.0.1:0",
                        "--txn-max-bytes", str(TXN_LIMIT)) as gw:
        create_topic(gw, topic_name)
        producer = txn_producer(gw, f"k9-{topic_name}")
        producer.begin_transaction()
        for _ in range(2):
            assert send(producer, topic_name, VALUE) is None
        stored = metric(gw, "txn_pending_stored_bytes")
        assert stored == metric(gw, "txn_pending_memory_bytes") > 2 * len(VALUE)
        gw.restart(hard=True)
        assert metric(gw, "txn_pending_stored_bytes") == stored
        assert metric(gw, "txn_pending_memory_bytes") == 0
        assert send(producer, topic_name, VALUE) is None  # the third fits
        error = send(producer, topic_name, VALUE)  # the fourth crosses
        assert error is not None and error.code() == KafkaError.POLICY_VIOLATION, error
        assert metric(gw, "txn_pending_limit_doomed_total", limit="transaction") == 1
        assert_abortable(producer)
        producer.abort_transaction(TIMEOUT)
        assert metric(gw, "txn_pending_stored_bytes") == 0
        producer.begin_transaction()
        assert send(producer, topic_name, b"after") is None
        producer.commit_transaction(TIMEOUT)
        assert committed_values(gw, topic_name, 1) == [b"after"]


def test_java_client_aborts_and_goes_on(gateway, topic_name, java_classes):
    """The Java client 3.4.1: the refused send fails with
    PolicyViolationException and the gateway's message (not split and retried,
    as MESSAGE_TOO_LARGE would be); commitTransaction() throws, caused by it
    (an abortable error, not fatal); abortTransaction() bumps the epoch
    (KIP-360: the client bumps after any failed send) and the next
    transaction commits."""
    lines = run_java(gateway, java_classes, "javatxn.TxnLimitCheck", "over-limit",
                     "--topic", topic_name, "--txn-id", f"java-{topic_name}",
                     "--size", str(len(VALUE)), "--sends", "4", timeout=120)
    ops = by_op(lines)
    [sent] = ops["sent"]
    assert (sent["ok"], sent["error"]) == (3, "PolicyViolationException"), sent
    assert "gateway.txn.max.bytes" in sent["message"], sent
    [commit] = ops["commit"]
    outcome = commit["outcome"]
    assert outcome["error"] == "KafkaException", outcome
    assert outcome["causes"][0].startswith("PolicyViolationException: "), outcome
    [abort] = ops["abort"]
    assert abort["outcome"] == "ok", abort
    [after] = ops["after-abort"]
    assert after["commit"] == "ok" and after["acks"] == [[topic_name, 0, -1]], after
    assert after["epoch_after"] == after["epoch_before"] + 1, after
    assert_logged(gateway, f"java-{topic_name}", "gateway.txn.max.bytes")
    assert committed_values(gateway, topic_name, 1) == [b"next"]
    assert metric(gateway, "txn_pending_stored_bytes") == 0


def test_kafka_python_aborts_and_goes_on(gateway, topic_name):
    create_topic(gateway, topic_name)
    producer = KafkaProducer(bootstrap_servers=gateway.bootstrap,
                             transactional_id=f"kp-{topic_name}", linger_ms=0)
    try:
        within(TIMEOUT, producer.init_transactions)
        producer.begin_transaction()
        for _ in range(3):
            producer.send(topic_name, VALUE, partition=0).get(timeout=TIMEOUT)
        with pytest.raises(PolicyViolationError, match=r"gateway\.txn\.max\.bytes"):
            producer.send(topic_name, VALUE, partition=0).get(timeout=TIMEOUT)
        with pytest.raises(KPKafkaError, match=r"error state: .*PolicyViolationError"):
            within(TIMEOUT, producer.commit_transaction)  # abortable: refused by the client
        within(TIMEOUT, producer.abort_transaction)
        producer.begin_transaction()
        producer.send(topic_name, b"next", partition=0).get(timeout=TIMEOUT)
        within(TIMEOUT, producer.commit_transaction)
    finally:
        producer.close(timeout=TIMEOUT)
    assert committed_values(gateway, topic_name, 1) == [b"next"]
    assert metric(gateway, "txn_pending_stored_bytes") == 0


def test_aiokafka_aborts_and_goes_on_and_never_commits_a_refused_batch(gateway, topic_name):
    """An application that aborts after the failed send goes on with the same
    producer; one that commits anyway (aiokafka sends EndTxn(commit)) gets a
    fatal error, nothing of that transaction lands, and a new producer goes on."""
    create_topic(gateway, topic_name)
    txn_id = f"aio-{topic_name}"

    async def fill_and_fail(producer: AIOKafkaProducer) -> None:
        await producer.begin_transaction()
        for _ in range(3):
            await producer.send_and_wait(topic_name, VALUE, partition=0)
        with pytest.raises(AIOPolicyViolation):
            await producer.send_and_wait(topic_name, VALUE, partition=0)

    async def scenario() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=gateway.bootstrap,
                                    transactional_id=txn_id, linger_ms=0)
        await producer.start()
        try:
            await fill_and_fail(producer)
            await producer.abort_transaction()
            async with producer.transaction():
                await producer.send_and_wait(topic_name, b"next", partition=0)
            await fill_and_fail(producer)
            with pytest.raises(AIOKafkaError):
                await producer.commit_transaction()
        finally:
            await producer.stop()
        successor = AIOKafkaProducer(bootstrap_servers=gateway.bootstrap,
                                     transactional_id=txn_id)
        await successor.start()
        try:
            async with successor.transaction():
                await successor.send_and_wait(topic_name, b"successor", partition=0)
        finally:
            await successor.stop()

    asyncio.run(asyncio.wait_for(scenario(), 120))
    assert committed_values(gateway, topic_name, 2) == [b"next", b"successor"]
    assert metric(gateway, "txn_pending_stored_bytes") == 0


def test_kafkajs_aborts_and_goes_on(gateway, topic_name):
    """kafkajs takes a failed send's sequence numbers back and sends them again
    in the next transaction: the gateway takes them (nothing of the refused
    batch was stored)."""
    node = shutil.which("node")
    assert node, "Node.js is not installed (Debian: apt-get install -y nodejs npm)"
    assert (JS_DIR / "node_modules" / "kafkajs").is_dir(), "run `npm ci` in compat_tests/js"
    done = subprocess.run([node, "txn.js", gateway.bootstrap, topic_name, "overLimit",
                           str(len(VALUE)), "4"], cwd=JS_DIR, capture_output=True,
                          text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["sent"][:3] == ["ok"] * 3, result
    assert result["sent"][3]["type"] == "POLICY_VIOLATION", result
    assert result["abort"] == {"ok": True} and result["next"] == {"ok": True}, result
    assert committed_values(gateway, topic_name, 1) == [b"next"]
    assert metric(gateway, "txn_pending_stored_bytes") == 0
