"""A consumer-group member in its own process (confluent-kafka), so a test can
kill it with SIGKILL - a crash: no LeaveGroup, no final commit.

    python group_worker.py BOOTSTRAP GROUP TOPIC OUTPUT [SESSION_TIMEOUT_MS]

Commit-after-process: each message's value is appended to OUTPUT (flushed
to the kernel, so it survives the kill) before its offset is committed
synchronously; a crash between the two re-delivers that message to the next
owner, never loses it. Assignment changes are printed as
``assigned <partitions>``. SIGTERM closes cleanly (LeaveGroup).
"""

from __future__ import annotations

import signal
import sys

from confluent_kafka import Consumer, KafkaException


def main() -> None:
    bootstrap, group, topic, output = sys.argv[1:5]
    session_timeout_ms = int(sys.argv[5]) if len(sys.argv) > 5 else 6000
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "client.id": f"worker-{output.rsplit('/', 1)[-1]}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "session.timeout.ms": session_timeout_ms,
        "heartbeat.interval.ms": 500,
        "partition.assignment.strategy": "range",
    })
    running = True

    def stop(*_: object) -> None:
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)

    def assigned(_consumer: Consumer, partitions: list) -> None:
        print("assigned " + ",".join(str(tp.partition) for tp in partitions), flush=True)

    consumer.subscribe([topic], on_assign=assigned)
    with open(output, "a", buffering=1) as processed:
        while running:
            message = consumer.poll(0.2)
            if message is None:
                continue
            if message.error():
                print(f"error {message.error()}", flush=True)
                continue
            processed.write(message.value().decode() + "\n")
            processed.flush()
            try:
                consumer.commit(message, asynchronous=False)
            except KafkaException as exc:  # e.g. the group is rebalancing: it is re-read
                print(f"commit failed {exc}", flush=True)
    consumer.close()


if __name__ == "__main__":
    main()
