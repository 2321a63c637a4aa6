"""python -m bench.compaction: how fast a partition is compacted, and what produce
latency is while it is, on the gateway and on Apache Kafka 3.4.1 in the same run.

For each server, one partition is written with cleanup.policy=delete (nothing
compacts yet): ``--mib`` MiB of 1 KiB records over ``--keys`` keys, by
confluent-kafka (``--codec``, lz4 by default), in 16 MiB segments. A probe
producer then sends a 100-byte record to the same partition every 5 ms (acks=all)
and times each acknowledgement; after ``--baseline`` seconds the topic becomes
cleanup.policy=compact (IncrementalAlterConfigs), both cleaners look every
second, and the run compacts everything but the active segment. Reported per
server: the first run's MB of log (from the log start to where it compacted)
and seconds, from each server's own log line at its end, its MB/s, and the
probe's latency percentiles before the switch and while the run went on.
With ``--repeat N`` both servers are measured N times, one after the other,
and the medians are reported with the gateway's ratio to Kafka.

    python3 -m bench.compaction                       # 256 MiB over 100,000 keys
    python3 -m bench.compaction --mib 64 --keys 20000 --codec none --repeat 5
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import re
import statistics
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

from testkit.gateway import GatewayProcess
from testkit.kafka_broker import KafkaBroker

PROBE_INTERVAL_S = 0.005


@dataclass
class Result:
    server: str
    log_mb: float
    run_seconds: float
    mb_per_s: float
    baseline_p50_ms: float
    baseline_p99_ms: float
    during_p50_ms: float
    during_p99_ms: float
    during_max_ms: float
    probes_during: int


def fill(bootstrap: str, topic: str, mib: int, keys: int, codec: str, segment_mib: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.list_topics(timeout=60)  # a broker just started: its metadata first
    admin.create_topics([NewTopic(topic, 1, 1, config={
        "cleanup.policy": "delete", "retention.ms": "-1", "segment.bytes": str(segment_mib << 20),
        "min.cleanable.dirty.ratio": "0.01"})])[topic].result(60)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                         "batch.size": 1 << 20, "compression.type": codec,
                         "queue.buffering.max.kbytes": 256 << 10})
    rng = random.Random(7)
    values = [os.urandom(512).hex().encode() for _ in range(4096)]
    for _ in range(mib * 1024):
        key, value = b"key-%d" % rng.randrange(keys), values[rng.randrange(len(values))]
        while True:
            try:
                producer.produce(topic, key=key, value=value)
                break
            except BufferError:  # the client's queue is full: let it drain
                producer.poll(0.05)
        producer.poll(0)
    assert producer.flush(300) == 0


class Probe(threading.Thread):
    """One small record every PROBE_INTERVAL_S, each acknowledgement timed."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
        self.topic = topic
        self.samples: list[tuple[float, float]] = []  # (sent at, wall clock; latency s)
        self.stopping = threading.Event()

    def run(self) -> None:
        number = 0
        due = time.perf_counter()
        while not self.stopping.is_set():
            sent, started = time.time(), time.perf_counter()

            def acked(err, _message, sent=sent, started=started):
                if err is None:
                    self.samples.append((sent, time.perf_counter() - started))

            self.producer.produce(self.topic, key=b"probe-%d" % number, value=b"x" * 100,
                                  on_delivery=acked)
            number += 1
            due += PROBE_INTERVAL_S
            while (left := due - time.perf_counter()) > 0:
                self.producer.poll(left)
        self.producer.flush(30)

    def window(self, start: float, end: float) -> list[float]:
        return sorted(lat * 1000 for sent, lat in self.samples if start <= sent < end)


def percentile(values: list[float], fraction: float) -> float:
    return values[min(len(values) - 1, int(fraction * len(values)))] if values else float("nan")


def make_compact(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource("topic", topic, incremental_configs=[ConfigEntry(
        "cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET)])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(60)


def _wall(stamp: str) -> float:
    """A log line's local time ("2026-01-02 03:04:05,678") as a Unix time."""
    return datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def measure(server: str, bootstrap: str, wait_run, args) -> Result:
    """Fill, probe, switch to compact; ``wait_run()`` returns (log MB, seconds,
    when it ended: wall clock) once the run is over."""
    topic = f"compaction-{server}"
    print(f"{server}: writing {args.mib} MiB", flush=True)
    fill(bootstrap, topic, args.mib, args.keys, args.codec, args.segment_mib)
    print(f"{server}: probing, then compacting", flush=True)
    probe = Probe(bootstrap, topic)
    probe.start()
    time.sleep(args.baseline)
    switched = time.time()
    make_compact(bootstrap, topic)
    log_mb, seconds, ended = wait_run(topic)
    time.sleep(1)
    probe.stopping.set()
    probe.join(60)
    before = probe.window(switched - args.baseline, switched)
    during = probe.window(ended - seconds, ended)
    return Result(server, round(log_mb, 1), round(seconds, 2), round(log_mb / seconds, 1),
                  round(percentile(before, 0.5), 2), round(percentile(before, 0.99), 2),
                  round(percentile(during, 0.5), 2), round(percentile(during, 0.99), 2),
                  round(max(during, default=float("nan")), 2), len(during))


def run_gateway(work: Path, args) -> Result:
    with GatewayProcess(work / "gateway", "--log-cleaner-backoff-ms", "1000") as gateway:
        done = re.compile(r"^([\d\- :,]+) INFO tablets.cleaner: compacted (\S+)-0 up to offset "
                          r"\d+: ([\d.]+) MB of log in ([\d.]+) s", re.M)

        def wait_run(topic: str) -> tuple[float, float, float]:
            deadline = time.monotonic() + 3600
            while time.monotonic() < deadline:
                for stamp, name, mb, seconds in done.findall(gateway.output()):
                    if name == topic:
                        return float(mb), float(seconds), _wall(stamp)
                time.sleep(0.2)
            raise TimeoutError("the gateway did not compact")

        return measure("gateway", gateway.bootstrap, wait_run, args)


def run_kafka(work: Path, args) -> Result:
    with KafkaBroker(work / "kafka", {"log.cleaner.backoff.ms": "1000"}) as kafka:
        # "[time] INFO [kafka-log-cleaner-thread-0]: " then the stats, on the next lines.
        processed = re.compile(r"^\[([\d\- :,]+)\] INFO [^\n]*\n\s*Log cleaner thread \d+ cleaned "
                               r"log (\S+)-0 [^\n]*\n\s*([\d,.]+) MB of log processed in "
                               r"([\d,.]+) seconds", re.M)

        def wait_run(topic: str) -> tuple[float, float, float]:
            deadline = time.monotonic() + 3600
            while time.monotonic() < deadline:
                text = kafka.log_path.read_text(errors="replace")
                for stamp, name, mb, seconds in processed.findall(text):
                    if name == topic:
                        return (float(mb.replace(",", "")), float(seconds.replace(",", "")),
                                _wall(stamp))
                time.sleep(0.2)
            raise TimeoutError("Kafka did not compact")

        return measure("kafka", kafka.bootstrap, wait_run, args)


RATIOS = ("mb_per_s", "during_p99_ms", "baseline_p99_ms")


def summary(runs: list[list[Result]]) -> dict[str, dict[str, float]]:
    """Per server the median of each figure over the runs, and the gateway's
    ratio to Kafka for the headline ones."""
    medians = {}
    for index, server in enumerate(("gateway", "kafka")):
        rows = [asdict(run[index]) for run in runs]
        medians[server] = {field: round(statistics.median(row[field] for row in rows), 2)
                           for field in rows[0] if field != "server"}
    medians["gateway/kafka"] = {field: round(medians["gateway"][field]
                                             / medians["kafka"][field], 2) for field in RATIOS}
    return medians


def _table(rows: list[dict]) -> None:
    columns = list(rows[0])
    print("  ".join(f"{c:>16}" for c in columns))
    for row in rows:
        print("  ".join(f"{v:>16}" for v in row.values()))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=256, help="data written before compacting")
    parser.add_argument("--keys", type=int, default=100_000, help="distinct keys")
    parser.add_argument("--codec", default="lz4", help="the producer's compression.type")
    parser.add_argument("--segment-mib", type=int, default=16, help="the topic's segment.bytes")
    parser.add_argument("--baseline", type=float, default=5.0,
                        help="seconds of probing before the switch to compact")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each server")
    parser.add_argument("--out", help="also write the results as JSON here")
    args = parser.parse_args(argv)
    runs = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="bench-compaction-") as work:
            runs.append([run_gateway(Path(work), args), run_kafka(Path(work), args)])
    print(f"{args.mib} MiB of 1 KiB records over {args.keys} keys, codec {args.codec}, "
          f"{args.repeat} run(s) of each server")
    _table([asdict(result) for run in runs for result in run])
    medians = summary(runs)
    print("medians, and the gateway's ratio to Kafka:")
    _table([{"server": server, **figures} for server, figures in medians.items()
            if server != "gateway/kafka"])
    print("  ".join(f"{field} {ratio}" for field, ratio in medians["gateway/kafka"].items()))
    if args.out:
        Path(args.out).write_text(json.dumps(
            {"runs": [[asdict(r) for r in run] for run in runs], "summary": medians}, indent=2))


if __name__ == "__main__":
    main()
