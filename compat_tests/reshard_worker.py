"""An exactly-once resharding worker in its own process (confluent-kafka), so the
chaos check can SIGKILL it, SIGSTOP it past its session timeout (a zombie),
and kill the gateway under it.

    python reshard_worker.py BOOTSTRAP GROUP SOURCE TARGET TARGET_PARTITIONS WORKER_ID

Consume-transform-produce, the standard KIP-447 loop: read a batch from the
source (read_committed), route each record by the user id in its value to a
target partition, produce, send the batch's next offsets with the consumer's
group metadata, commit - all in one transaction. On an abortable error the
transaction is aborted and the consumer rewinds to the committed offsets; on
a fatal one (this producer was fenced) a new producer is made. Every outcome
is printed as one line for the test's log.

A transactional call still blocked well past its own timeout restarts the
worker in place (``Watchdog``): librdkafka can block there for good when the
group coordinator's broker died and left Metadata.

Source values are ``user=<u> seq=<n>``; target values are
``<source partition>:<source offset>:user=<u> seq=<n>``.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition


def log(*parts: object) -> None:
    print(*parts, flush=True)


class Watchdog:
    """Restarts the worker (exec: the same pid, so the check's faults still
    reach it) when a call is still blocked ``GRACE_S`` past its own timeout.

    librdkafka (2.16 here) can block in send_offsets_to_transaction past its
    timeout, for good, when the group coordinator's broker dies and leaves
    Metadata: the broker is decommissioned but stays the cached coordinator,
    and the TxnOffsetCommit waits for a state change of a broker thread that
    is gone (confluentinc/librdkafka#5511, with #5456: the request's timeout
    is never checked; fix proposed in PR #5512). A Kafka broker that dies
    leaves Metadata too. A restarted worker is what an orchestrator does with
    a stuck process; its InitProducerId fences the old producer, so the
    check's exactly-once still holds."""

    GRACE_S = 15.0

    def __init__(self) -> None:
        self._call: tuple[str, float] | None = None
        threading.Thread(target=self._watch, daemon=True).start()

    @contextmanager
    def call(self, name: str, timeout: float) -> Iterator[None]:
        self._call = (name, time.monotonic() + timeout + self.GRACE_S)
        try:
            yield
        finally:
            self._call = None

    def _watch(self) -> None:
        while True:
            time.sleep(1.0)
            call = self._call
            if call is not None and time.monotonic() > call[1]:
                log("hung", call[0], f"past its timeout + {self.GRACE_S:.0f} s - restarting")
                os.execv(sys.executable, [sys.executable, *sys.argv])


def new_producer(bootstrap: str, transactional_id: str, watchdog: Watchdog) -> Producer:
    producer = Producer({
        "bootstrap.servers": bootstrap,
        "transactional.id": transactional_id,
        "transaction.timeout.ms": 30000,
        "message.timeout.ms": 20000,
        "linger.ms": 5,
    })
    with watchdog.call("init_transactions", 30):
        producer.init_transactions(30)
    return producer


def route(value: bytes, partitions: int) -> int:
    user = value.split(b" ", 1)[0]
    return zlib.crc32(user) % partitions


def main() -> None:
    bootstrap, group, source, target, target_partitions, worker = sys.argv[1:7]
    partitions = int(target_partitions)
    transactional_id = f"reshard-{worker}"
    running = True

    def stop(*_: object) -> None:
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)
    watchdog = Watchdog()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # a stalled run's diagnosis
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "client.id": f"reshard-{worker}",
        "isolation.level": "read_committed",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500,
        "partition.assignment.strategy": "range",
    })
    consumer.subscribe([source], on_assign=lambda _c, tps: log(
        "assigned", ",".join(str(tp.partition) for tp in tps)))
    producer = new_producer(bootstrap, transactional_id, watchdog)

    def rewind() -> None:
        """Back to the committed offsets: what an aborted transaction consumed
        is read again."""
        assignment = consumer.assignment()
        if not assignment:
            return
        with watchdog.call("committed", 20):
            committed = consumer.committed(assignment, timeout=20)
        for tp in committed:
            consumer.seek(TopicPartition(tp.topic, tp.partition,
                                         tp.offset if tp.offset >= 0 else 0))

    while running:
        messages = [m for m in consumer.consume(200, timeout=0.5) if m.error() is None]
        if not messages:
            continue
        try:
            producer.begin_transaction()
            next_offsets: dict[int, int] = {}
            for m in messages:
                producer.produce(target, partition=route(m.value(), partitions),
                                 value=f"{m.partition()}:{m.offset()}:".encode() + m.value())
                next_offsets[m.partition()] = m.offset() + 1
            with watchdog.call("send_offsets_to_transaction", 20):
                producer.send_offsets_to_transaction(
                    [TopicPartition(source, p, o) for p, o in next_offsets.items()],
                    consumer.consumer_group_metadata(), 20)
            with watchdog.call("commit_transaction", 30):
                producer.commit_transaction(30)
            log("committed", len(messages), sorted(next_offsets.items()))
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if error.fatal():
                log("fatal", error.name(), "- new producer")
                producer = new_producer(bootstrap, transactional_id, watchdog)
            elif error.txn_requires_abort():
                log("abort", error.name())
                try:
                    with watchdog.call("abort_transaction", 30):
                        producer.abort_transaction(30)
                except KafkaException as again:
                    log("abort failed", again.args[0].name(), "- new producer")
                    producer = new_producer(bootstrap, transactional_id, watchdog)
            else:
                log("retriable", error.name(), "- new producer")
                producer = new_producer(bootstrap, transactional_id, watchdog)
            try:
                rewind()
            except KafkaException as again:
                log("rewind failed", again.args[0].name())
    consumer.close()


if __name__ == "__main__":
    main()
