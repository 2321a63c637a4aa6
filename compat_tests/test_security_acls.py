"""ACLs seen by a real client (confluent-kafka over SASL_SSL): allowed and denied
produce, consume, consumer group, transaction and admin operations fail with
the errors Kafka's clients report, and nothing unauthorized is written or read."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from security_helpers import ROOT, librdkafka_config, start_secure_gateway


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    secure = start_secure_gateway(tmp_path_factory.mktemp("secure-acl"),
                                  "--authorizer-class-name", "acl", "--super-users",
                                  "User:admin;User:ANONYMOUS")
    try:
        yield secure
    finally:
        secure.gateway.stop()


def _acls(secure, *args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "kafka_gateway", "acls", "--bootstrap-server",
                           secure.bootstrap("PLAINTEXT"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def _delivery(producer: Producer, topic: str, value: bytes) -> KafkaError | None:
    outcome: list[KafkaError | None] = []
    try:
        producer.produce(topic, value, on_delivery=lambda err, _msg: outcome.append(err))
    except KafkaException as exc:  # refused at once when the client knows it already
        return exc.args[0]
    producer.flush(30)
    assert outcome, "no delivery report"
    return outcome[0]


def _high_watermark(secure, topic: str) -> int:
    admin = Consumer({**librdkafka_config(secure, "SASL_SSL", "SCRAM-SHA-256", user="admin"),
                      "group.id": "watermarks"})
    try:
        return admin.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
    finally:
        admin.close()


def test_acl_matrix(secure):
    ok_topic, secret = f"acl-ok-{uuid.uuid4().hex[:6]}", f"acl-secret-{uuid.uuid4().hex[:6]}"
    admin = AdminClient(librdkafka_config(secure, "SASL_SSL", "SCRAM-SHA-256", user="admin"))
    for future in admin.create_topics([NewTopic(ok_topic, 1), NewTopic(secret, 1)]).values():
        future.result(30)
    _acls(secure, "add", "--allow-principal", "User:alice", "--operation", "Write",
          "--operation", "Read", "--topic", ok_topic)
    _acls(secure, "add", "--allow-principal", "User:alice", "--operation", "Read",
          "--group", "acl-app")
    _acls(secure, "add", "--allow-principal", "User:alice", "--operation", "Write",
          "--transactional-id", "acl-tx")
    alice = librdkafka_config(secure, "SASL_SSL", "SCRAM-SHA-256")

    # Produce: allowed topic written, denied one refused and left empty.
    producer = Producer(alice)
    assert _delivery(producer, ok_topic, b"allowed") is None
    refused = _delivery(producer, secret, b"denied")
    assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    admin_producer = Producer(librdkafka_config(secure, "SASL_SSL", "SCRAM-SHA-256",
                                                user="admin"))
    assert _delivery(admin_producer, secret, b"hidden") is None
    assert _high_watermark(secure, secret) == 1  # only the admin's record

    # Consume: the allowed group reads the allowed topic; the denied topic is never read.
    consumer = Consumer({**alice, "group.id": "acl-app", "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(ok_topic, 0, 0)])
    message = None
    deadline = time.monotonic() + 30
    while message is None and time.monotonic() < deadline:
        message = consumer.poll(0.5)
    assert message is not None and message.error() is None
    assert message.value() == b"allowed"
    consumer.commit(message=message, asynchronous=False)
    consumer.close()
    snooper = Consumer({**alice, "group.id": "acl-app", "auto.offset.reset": "earliest"})
    snooper.subscribe([secret])
    values, errors = [], set()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not errors:
        message = snooper.poll(0.5)
        if message is not None:
            (errors.add(message.error().code()) if message.error()
             else values.append(message.value()))
    snooper.close()
    assert KafkaError.TOPIC_AUTHORIZATION_FAILED in errors
    assert values == []

    # A group alice may not read.
    other = Consumer({**alice, "group.id": "acl-other", "auto.offset.reset": "earliest"})
    other.subscribe([ok_topic])
    group_errors = set()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not group_errors:
        message = other.poll(0.5)
        if message is not None and message.error():
            group_errors.add(message.error().code())
    other.close()
    assert KafkaError.GROUP_AUTHORIZATION_FAILED in group_errors

    # Transactions: a transactional id alice may write, and one she may not.
    txn = Producer({**alice, "transactional.id": "acl-tx"})
    txn.init_transactions(30)
    txn.begin_transaction()
    txn.produce(ok_topic, b"in-txn")
    txn.commit_transaction(30)
    denied = Producer({**alice, "transactional.id": "acl-tx-other"})
    with pytest.raises(KafkaException) as caught:
        denied.init_transactions(30)
    assert caught.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED

    # Admin: creating and deleting topics needs CREATE / DELETE.
    alice_admin = AdminClient(alice)
    with pytest.raises(KafkaException) as caught:
        next(iter(alice_admin.create_topics([NewTopic("acl-mine", 1)]).values())).result(30)
    assert caught.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    with pytest.raises(KafkaException) as caught:
        next(iter(alice_admin.delete_topics([ok_topic]).values())).result(30)
    assert caught.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert ok_topic in admin.list_topics(timeout=10).topics
    assert "acl-mine" not in admin.list_topics(timeout=10).topics
    assert secure.metrics()["authorization_failures_total"] >= 5
