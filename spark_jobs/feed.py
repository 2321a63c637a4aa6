"""feed: produce JSON events to a topic, for the jobs to read (no Spark needed).

Event i is ``{"user_id": "user-<i mod USERS>", "seq": i, "amount": <1..100>}``
in partition ``i mod PARTITIONS`` (so every user's events are spread over all
partitions: what reshard undoes), produced with the gateway's idempotent
producer settings. The topic is created first if it does not exist.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from typing import Any

from spark_jobs.common import add_bootstrap

log = logging.getLogger("spark_jobs.feed")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_bootstrap(parser)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--count", type=int, default=1000, help="events to produce (1000)")
    parser.add_argument("--first-seq", type=int, default=0, help="seq of the first event")
    parser.add_argument("--users", type=int, default=20, help="distinct user ids (20)")
    parser.add_argument("--partitions", type=int, default=4,
                        help="partitions of the topic if it is created (4)")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="events per second; 0 = as fast as possible")


def event(seq: int, users: int) -> dict[str, Any]:
    return {"user_id": f"user-{seq % users}", "seq": seq, "amount": seq % 100 + 1}


def ensure_topic(bootstrap: str, topic: str, partitions: int) -> int:
    """The topic's partition count, creating it with ``partitions`` if missing."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = admin.list_topics(timeout=30).topics.get(topic)
    if existing is not None and existing.error is None:
        return len(existing.partitions)
    try:
        admin.create_topics([NewTopic(topic, partitions)])[topic].result(30)
    except KafkaException as exc:
        if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
            raise
    return len(admin.list_topics(topic, timeout=30).topics[topic].partitions)


def produce(bootstrap: str, topic: str, count: int, first_seq: int = 0, users: int = 20,
            partitions: int = 4, rate: float = 0.0) -> int:
    """Produce ``count`` events; returns how many were acknowledged."""
    from confluent_kafka import Producer

    spread = ensure_topic(bootstrap, topic, partitions)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 5})
    failed: list[str] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failed.append(str(error))

    began = time.monotonic()
    for n, seq in enumerate(range(first_seq, first_seq + count)):
        if rate > 0:
            time.sleep(max(0.0, began + n / rate - time.monotonic()))
        producer.produce(topic, json.dumps(event(seq, users)).encode(),
                         partition=seq % spread, on_delivery=delivered)
        producer.poll(0)
    left = producer.flush(60)
    if failed or left:
        raise RuntimeError(f"{len(failed) + left} of {count} events not acknowledged: "
                           f"{failed[:3]}")
    log.info("fed %d events (seq %d..%d) to %s", count, first_seq, first_seq + count - 1,
             topic)
    return count


def run(args: argparse.Namespace) -> None:
    produce(args.bootstrap_servers, args.topic, args.count, args.first_seq, args.users,
            args.partitions, args.rate)
