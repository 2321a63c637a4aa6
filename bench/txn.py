"""Transactions side by side: the gateway (YDB-style) and Apache Kafka 3.4.1.

    python -m bench.txn [--seconds 5] [--servers gateway,kafka] [--sizes-mib 1,16,100]

One librdkafka producer, 1 KiB records, acks=all, on each server in turn:

- **rate**: 100 partitions at the highest rate the client holds, without
  transactions (idempotent) and with a commit every 500, 100 and 10 ms:
  MB/s, write-ack latency p50/p99/p99.9 (a sample of the sends), end-to-end
  latency to a read_committed consumer, server CPU seconds per GB;
- **one percent**: 100 transactions of 100 records, 1 committed and 99
  aborted: the bytes a read_committed consumer fetches to read the topic
  (librdkafka's ``rxbytes``);
- **commit cost**: one transaction of 1 KiB up to the largest of
  ``--sizes-mib``: commit_transaction() latency and the bytes the server
  wrote (``wchar`` of /proc/PID/io) while it committed, and for the gateway
  its RocksDB writes and fsyncs per commit (/metrics).

Results go to bench/results/txn.json and txn.md. Figures, not tests: the
machine they run on says how far they go (docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from .servers import GATEWAY, KAFKA, Server, ServerSet, free_port

RESULTS = Path(__file__).with_name("results")
RECORD = 1024
PARTITIONS = 100
INTERVALS_MS = (None, 500, 100, 10)  # None: no transactions (idempotent)


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _io_written(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    return 0


def _metric(admin: str | None, name: str) -> float:
    if admin is None:
        return float("nan")
    text = urllib.request.urlopen(f"http://{admin}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return float("nan")


def _create(server: Server, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(60)
    deadline = time.monotonic() + 60
    while len(admin.list_topics(topic, timeout=10).topics[topic].partitions) < partitions:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{topic} has no {partitions} partitions on {server.name}")
        time.sleep(0.2)


class _Reader(threading.Thread):
    """A read_committed consumer measuring end-to-end latency from the send time
    each value starts with."""

    def __init__(self, server: Server, topic: str) -> None:
        super().__init__(daemon=True)
        self.consumer = Consumer({
            "bootstrap.servers": server.bootstrap, "group.id": f"reader-{topic}",
            "isolation.level": "read_committed", "auto.offset.reset": "earliest",
            "enable.auto.commit": False, "fetch.wait.max.ms": 10})
        self.consumer.subscribe([topic])
        self.latencies: list[float] = []
        self.records = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for message in self.consumer.consume(1000, timeout=0.1):
                if message.error() is None:
                    self.records += 1
                    if self.records % 20 == 0:
                        sent = float(message.value()[:20].decode())
                        self.latencies.append(time.time() - sent)
        self.consumer.close()


def rate(server: Server, interval_ms: int | None, seconds: float) -> dict[str, Any]:
    topic = f"rate-{interval_ms}-{int(time.time() * 1000)}"
    _create(server, topic, PARTITIONS)
    config = {"bootstrap.servers": server.bootstrap, "acks": "all", "linger.ms": 5,
              "enable.idempotence": True, "queue.buffering.max.messages": 200_000}
    if interval_ms is not None:
        config["transactional.id"] = topic
    producer = Producer(config)
    if interval_ms is not None:
        producer.init_transactions(30)
    reader = _Reader(server, topic)
    reader.start()
    acks: list[float] = []
    padding = b"x" * (RECORD - 20)
    sent = 0
    cpu0 = server.sample().cpu_s
    started = time.monotonic()
    window_end = started
    while time.monotonic() - started < seconds:
        if interval_ms is not None:
            producer.begin_transaction()
            window_end = time.monotonic() + interval_ms / 1000
        while time.monotonic() < (window_end if interval_ms is not None else started + seconds):
            for _ in range(200):
                value = f"{time.time():<20.6f}".encode() + padding
                if sent % 50 == 0:
                    t0 = time.perf_counter()
                    callback = (lambda err, _m, t0=t0:  # noqa: E731 - one sample in 50
                                err is None and acks.append(time.perf_counter() - t0))
                else:
                    callback = None
                while True:
                    try:
                        producer.produce(topic, value, partition=sent % PARTITIONS,
                                         on_delivery=callback)
                        break
                    except BufferError:
                        producer.poll(0.005)
                sent += 1
            producer.poll(0)
        if interval_ms is not None:
            producer.commit_transaction(60)
    producer.flush(60)
    elapsed = time.monotonic() - started
    cpu = server.sample().cpu_s - cpu0
    deadline = time.monotonic() + 30
    while reader.records < sent and time.monotonic() < deadline:
        time.sleep(0.05)
    reader.stop.set()
    reader.join(30)
    mb = sent * RECORD / 1e6
    return {
        "commit_every_ms": interval_ms, "records": sent, "MB_s": mb / elapsed,
        "ack_ms_p50": 1000 * _percentile(acks, 0.5), "ack_ms_p99": 1000 * _percentile(acks, 0.99),
        "ack_ms_p999": 1000 * _percentile(acks, 0.999),
        "e2e_ms_p50": 1000 * _percentile(reader.latencies, 0.5),
        "e2e_ms_p99": 1000 * _percentile(reader.latencies, 0.99),
        "read_committed_records": reader.records,
        "cpu_s_per_GB": cpu / (mb / 1000),
    }


def one_percent(server: Server) -> dict[str, Any]:
    """100 transactions of 100 x 1 KiB, one committed: what read_committed fetches."""
    topic = f"onepct-{int(time.time() * 1000)}"
    _create(server, topic, 1)
    producer = Producer({"bootstrap.servers": server.bootstrap, "transactional.id": topic,
                         "linger.ms": 5})
    producer.init_transactions(30)
    for n in range(100):
        producer.begin_transaction()
        for _ in range(100):
            producer.produce(topic, b"y" * RECORD, partition=0)
        producer.flush(30)
        (producer.commit_transaction if n == 50 else producer.abort_transaction)(30)
    stats: list[dict[str, Any]] = []
    consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": f"r-{topic}",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "statistics.interval.ms": 200,
                         "stats_cb": lambda raw: stats.append(json.loads(raw))})
    _low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
    consumer.assign([TopicPartition(topic, 0, 0)])
    records, deadline = 0, time.monotonic() + 60
    while time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is not None and message.error() is None:
            records += 1
        position = consumer.position([TopicPartition(topic, 0)])[0].offset
        if records >= 100 and position >= high:
            break
    settle = time.monotonic() + 1.0
    while time.monotonic() < settle:
        consumer.poll(0.1)
    consumer.close()
    fetched = max((sum(b.get("rxbytes", 0) for b in s["brokers"].values()) for s in stats),
                  default=0)
    return {"records_read": records, "bytes_committed": 100 * RECORD,
            "bytes_produced": 100 * 100 * RECORD, "bytes_fetched": fetched}


def commit_cost(server: Server, size_mib: float, admin: str | None) -> dict[str, Any]:
    topic = f"commit-{int(time.time() * 1000)}"
    _create(server, topic, 4)
    producer = Producer({"bootstrap.servers": server.bootstrap, "transactional.id": topic,
                         "linger.ms": 5, "queue.buffering.max.kbytes": 1 << 20})
    producer.init_transactions(30)
    producer.begin_transaction()
    records = max(1, int(size_mib * (1 << 20) / RECORD))
    for i in range(records):
        while True:
            try:
                producer.produce(topic, b"z" * RECORD, partition=i % 4)
                break
            except BufferError:
                producer.poll(0.005)
    producer.flush(120)
    time.sleep(0.5)  # let the server settle its writes of the data itself
    writes0 = _metric(admin, "kafka_gateway_store_writes_total")
    fsyncs0 = _metric(admin, "kafka_gateway_store_fsyncs_total")
    written0 = _io_written(server.pid)
    started = time.perf_counter()
    producer.commit_transaction(120)
    latency = time.perf_counter() - started
    time.sleep(0.5)  # Kafka writes its markers after answering
    return {"size_MiB": size_mib, "commit_ms": 1000 * latency,
            "bytes_written_by_commit": _io_written(server.pid) - written0,
            "store_writes": _metric(admin, "kafka_gateway_store_writes_total") - writes0,
            "store_fsyncs": _metric(admin, "kafka_gateway_store_fsyncs_total") - fsyncs0}


def run(servers: list[str], seconds: float, sizes_mib: list[float]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name in servers:
        admin_port = free_port()
        gateway_args = ["--admin-listen", f"127.0.0.1:{admin_port}"]
        with ServerSet([name], gateway_args) as started:
            server = started.servers[name]
            admin = f"127.0.0.1:{admin_port}" if name == GATEWAY else None
            results[name] = {
                "rate": [rate(server, interval, seconds) for interval in INTERVALS_MS],
                "one_percent": one_percent(server),
                "commit_cost": [commit_cost(server, size, admin)
                                for size in (1 / 1024, *sizes_mib)],
            }
            print(f"{name}: {json.dumps(results[name], indent=1)}", flush=True)
    return results


def markdown(results: dict[str, Any]) -> str:
    names = list(results)
    out = ["| workload | " + " | ".join(names) + " |", "| --- |" + " ---: |" * len(names)]
    for i, interval in enumerate(INTERVALS_MS):
        label = "no transactions" if interval is None else f"commit every {interval} ms"
        for key, unit in (("MB_s", "MB/s"), ("ack_ms_p50", "ack p50 ms"),
                          ("ack_ms_p99", "ack p99 ms"), ("ack_ms_p999", "ack p99.9 ms"),
                          ("e2e_ms_p50", "end-to-end p50 ms"), ("e2e_ms_p99", "end-to-end p99 ms"),
                          ("cpu_s_per_GB", "server CPU s/GB")):
            out.append(f"| {label}, {unit} | " + " | ".join(
                f"{results[n]['rate'][i][key]:.2f}" for n in names) + " |")
    out.append("| 1% committed: bytes fetched by read_committed | " + " | ".join(
        f"{results[n]['one_percent']['bytes_fetched']:,}" for n in names) + " |")
    for j, row in enumerate(results[names[0]]["commit_cost"]):
        size = f"{row['size_MiB'] * 1024:.0f} KiB" if row["size_MiB"] < 1 else \
            f"{row['size_MiB']:.0f} MiB"
        out.append(f"| commit of {size}: latency ms | " + " | ".join(
            f"{results[n]['commit_cost'][j]['commit_ms']:.1f}" for n in names) + " |")
        out.append(f"| commit of {size}: bytes written | " + " | ".join(
            f"{results[n]['commit_cost'][j]['bytes_written_by_commit']:,}" for n in names) + " |")
    gateway_rows = results.get(GATEWAY, {}).get("commit_cost", [])
    if gateway_rows:
        out.append("")
        out.append("Gateway RocksDB writes / fsyncs per commit: " + ", ".join(
            f"{r['store_writes']:.0f}/{r['store_fsyncs']:.0f}" for r in gateway_rows))
    one = results[names[0]]["one_percent"]
    out.append(f"\n1% committed: {one['bytes_produced']:,} bytes produced, "
               f"{one['bytes_committed']:,} committed.")
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", default=f"{GATEWAY},{KAFKA}")
    parser.add_argument("--seconds", type=float, default=5.0, help="per rate run (5)")
    parser.add_argument("--sizes-mib", default="1,16,100",
                        help="transaction sizes of the commit-cost runs, MiB (1,16,100)")
    args = parser.parse_args()
    results = run(args.servers.split(","), args.seconds,
                  [float(s) for s in args.sizes_mib.split(",")])
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "txn.json").write_text(json.dumps(results, indent=1))
    table = markdown(results)
    (RESULTS / "txn.md").write_text(table)
    print(table)
    for name, result in results.items():
        base = result["rate"][0]["MB_s"]
        for row in result["rate"][1:]:
            cost = 100 * (1 - row["MB_s"] / base)
            print(f"{name}: a commit every {row['commit_every_ms']} ms costs {cost:.1f}% of "
                  "its throughput without transactions")


if __name__ == "__main__":
    main()
