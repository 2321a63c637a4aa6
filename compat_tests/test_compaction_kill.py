"""kill -9 in the middle of a compaction run loses nothing that is still live.

A compacted topic is written while the cleaner is off (3000 records of 1 KB
over 1000 keys, some deleted), then the gateway restarts with the cleaner on
and slowed down (log.cleaner.io.max.bytes.per.second) so that one run takes
many seconds and swaps its changes in small chunks
(log.cleaner.io.buffer.size). Once some chunks are in and the run is not
finished, the gateway is killed with SIGKILL.

After a restart (cleaner off) the log is partly compacted and still holds
every key's newest record, tombstones included, at its offset; after one
more (cleaner on) compaction finishes and leaves exactly the newest values.
"""

from __future__ import annotations

import os

from compaction_helpers import EAGER, read_partition, rolls_after, values, wait_for
from compat_helpers import create_topic
from confluent_kafka import Producer

from testkit import prom
from testkit.gateway import GatewayProcess

TOPIC = "killed-mid-compaction"
RECORDS, KEYS = 3000, 1000
DELETED = {f"key-{k}" for k in range(0, KEYS, 37)}
ADMIN = ("--admin-listen", "127.0.0.1:0")


def produce(gateway) -> dict[str, tuple[int, str | None]]:
    """Write the topic; each key's newest (offset, value)."""
    model: dict[str, tuple[int, str | None]] = {}
    newest_stamp = 0

    def delivered(err, message):
        nonlocal newest_stamp
        assert err is None, err
        model[message.key().decode()] = (message.offset(), None if message.value() is None
                                          else message.value().decode())
        newest_stamp = max(newest_stamp, message.timestamp()[1])

    producer = Producer({"bootstrap.servers": gateway.bootstrap, "linger.ms": 5,
                         "batch.num.messages": 10, "compression.type": "lz4"})
    for number in range(RECORDS):
        producer.produce(TOPIC, key=f"key-{number % KEYS}", value=os.urandom(512).hex(),
                         on_delivery=delivered)
        producer.poll(0)
    for key in sorted(DELETED):
        producer.produce(TOPIC, key=key, value=None, on_delivery=delivered)
    assert producer.flush(60) == 0
    rolls_after(newest_stamp)  # (the tombstones' segment must be cleanable)
    last = Producer({"bootstrap.servers": gateway.bootstrap})
    last.produce(TOPIC, key="last", value="the active segment", on_delivery=delivered)
    assert last.flush(30) == 0
    return model


def newest_of(records) -> dict[str, tuple[int, str | None]]:
    out: dict[str, tuple[int, str | None]] = {}
    previous = -1
    for offset, key, value in values(records):
        assert offset > previous
        previous = offset
        out[key] = (offset, value)
    return out


def test_kill_9_in_the_middle_of_a_compaction_run_loses_nothing(tmp_path):
    gateway = GatewayProcess(tmp_path / "data", "--log-cleaner-enable", "false", *ADMIN)
    try:
        gateway.start()
        create_topic(gateway, TOPIC, configs=EAGER)
        model = produce(gateway)
        written = len(read_partition(gateway, TOPIC)[0])
        assert written == RECORDS + len(DELETED) + 1

        gateway.stop()
        gateway.extra_args = ["--log-cleaner-backoff-ms", "100",
                              "--log-cleaner-io-max-bytes-per-second", "300000",
                              "--log-cleaner-io-buffer-size", "32768", *ADMIN]
        gateway.start()

        def mid_run():
            found = gateway.metrics()
            return (prom.value(found, "kafka_gateway_compaction_chunks_total") >= 3
                    and prom.value(found, "kafka_gateway_compaction_runs_total") == 0
                    and prom.value(found, "kafka_gateway_compaction_running") == 1)

        wait_for(mid_run, 60, "compaction run with chunks swapped in")
        gateway.kill()  # SIGKILL

        gateway.extra_args = ["--log-cleaner-enable", "false", *ADMIN]
        gateway.start()
        records = read_partition(gateway, TOPIC)[0]
        assert KEYS < len(records) < written, "not killed in the middle of a run"
        assert newest_of(records) == model  # tombstones too: only a later run drops them

        gateway.stop()
        gateway.extra_args = ["--log-cleaner-backoff-ms", "100", *ADMIN]
        gateway.start()
        final = sorted((offset, key, value) for key, (offset, value) in model.items()
                       if value is not None)
        wait_for(lambda: values(read_partition(gateway, TOPIC)[0]) == final, 120,
                 "compaction to finish after the restart")
    finally:
        gateway.stop()
        gateway.kill()
