"""One instance of an EOS v2 consume-transform-produce app with confluent-kafka,
the loop of Kafka's own ``ExactlyOnceMessageProcessor`` example:

    python eos_worker.py BOOTSTRAP GROUP TRANSACTIONAL_ID SOURCE TARGET [--auto-commit]

It subscribes to SOURCE (read_committed, range assignor), and for every
non-empty batch begins a transaction, copies each record's value to TARGET
partition 0, sends the position of EVERY assigned partition (idle ones too)
with ``consumer_group_metadata()`` (KIP-447), and commits. A partition with
nothing consumed yet reports its committed offset, as the Java client's
``position()`` does (librdkafka's own ``position()`` would say "invalid"). An
abortable error aborts and rewinds every partition to its committed offset,
as the example does; anything else is fatal (the process exits non-zero).

``--auto-commit`` leaves ``enable.auto.commit`` on (every 100 ms), the user
error the gateway must survive without losing records.

JSON lines on stdout: ``assigned`` (the whole assignment) after each
rebalance, ``committed`` / ``aborted`` per transaction, ``done`` at the end.
"stop" on stdin ends the loop; the consumer then leaves the group.
"""

from __future__ import annotations

import json
import sys
import threading

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

TIMEOUT_S = 30


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def main() -> None:
    bootstrap, group, transactional_id, source, target, *flags = sys.argv[1:]
    auto_commit = "--auto-commit" in flags
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "isolation.level": "read_committed",
        "auto.offset.reset": "earliest", "partition.assignment.strategy": "range",
        "enable.auto.commit": auto_commit, "auto.commit.interval.ms": 100,
        "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
        "client.id": transactional_id,
    })
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                         "transaction.timeout.ms": 30000, "linger.ms": 5})
    producer.init_transactions(TIMEOUT_S)
    positions: dict[int, int] = {}  # partition -> the next offset to process

    def committed_positions(partitions: list[TopicPartition]) -> dict[int, int]:
        """Committed offsets; the log start where there is none (auto.offset.reset)."""
        out = {}
        for tp in consumer.committed(partitions, timeout=TIMEOUT_S):
            low, _high = consumer.get_watermark_offsets(tp, timeout=TIMEOUT_S)
            out[tp.partition] = tp.offset if tp.offset >= 0 else low
        return out

    def on_assign(_consumer: Consumer, partitions: list[TopicPartition]) -> None:
        positions.update(committed_positions(partitions))
        emit(op="assigned", partitions=sorted(positions))

    def on_revoke(_consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            positions.pop(tp.partition, None)

    def rewind() -> None:
        assignment = consumer.assignment()
        positions.clear()
        positions.update(committed_positions(assignment))
        for tp in assignment:
            consumer.seek(TopicPartition(source, tp.partition, positions[tp.partition]))

    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
    consumer.subscribe([source], on_assign=on_assign, on_revoke=on_revoke)
    commits = aborts = total = 0
    while not stop.is_set():
        messages = [m for m in consumer.consume(100, 0.2) if m.error() is None]
        if not messages:
            continue
        try:
            producer.begin_transaction()
            for message in messages:
                producer.produce(target, value=message.value(), partition=0)
                positions[message.partition()] = message.offset() + 1
            producer.send_offsets_to_transaction(
                [TopicPartition(source, p, o) for p, o in sorted(positions.items())],
                consumer.consumer_group_metadata(), TIMEOUT_S)
            producer.commit_transaction(TIMEOUT_S)
        except KafkaException as exc:
            error = exc.args[0]
            if not error.txn_requires_abort():
                raise
            producer.abort_transaction(TIMEOUT_S)
            aborts += 1
            emit(op="aborted", error=error.name(), reason=error.str())
            rewind()
            continue
        commits += 1
        total += len(messages)
        emit(op="committed", records=len(messages), total=total)
    consumer.close()
    producer.flush(TIMEOUT_S)
    emit(op="done", commits=commits, aborts=aborts, total=total)


if __name__ == "__main__":
    main()
