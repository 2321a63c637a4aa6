"""The reference broker itself: Apache Kafka 3.4.1 starts, answers and stores."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient


def test_kafka_serves_a_round_trip(kafka_broker, topic_name):
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    cluster = admin.list_topics(timeout=30)
    assert cluster.controller_id == 1
    assert [b.port for b in cluster.brokers.values()] == [kafka_broker.port]

    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    for i in range(5):
        producer.produce(topic_name, f"v{i}".encode())
    assert producer.flush(30) == 0

    consumer = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": topic_name,
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic_name, 0, 0)])
    values, deadline = [], time.monotonic() + 30
    while len(values) < 5 and time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is not None and message.error() is None:
            values.append(message.value())
    consumer.close()
    assert values == [f"v{i}".encode() for i in range(5)]
