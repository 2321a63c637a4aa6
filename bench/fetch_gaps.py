"""Where a one-partition librdkafka consumer's time goes, fetch by fetch.

    python -m bench.fetch_gaps [--mb 1024] [--servers gateway,kafka]

For each server: writes ``--mb`` MiB of 1 KiB records to a one-partition topic,
then a confluent-kafka consumer (``assign`` at the earliest offset, librdkafka
defaults) reads it all with ``debug=protocol`` (its log on stderr, a
timestamp to the millisecond on each line). Each Fetch then has:
- **rtt**: from its FetchRequest sent to its FetchResponse received, as
  librdkafka measures it (``rtt`` on the "Received FetchResponse" line);
- **gap**: from a FetchResponse received to the next FetchRequest sent (what
  librdkafka waits for on its side);
- its size. Then the same at the head: the consumer at the end of the log while
  a producer writes at ``--head-mbps`` MB/s.
Prints per server and phase: fetches, MB per fetch, and the median and p90 of
rtt and gap. Not part of ``python -m bench``: a tool for the round trip alone.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from testkit.gateway import GatewayProcess
from testkit.kafka_broker import KafkaBroker

_LINE = re.compile(r"^%\d\|(\d+)\.(\d+)\|(\w+)\|[^|]*\| (.*)$")
_SENT = re.compile(r"Sent FetchRequest \(v\d+, \d+ bytes @ \d+, CorrId (\d+)\)")
_RECEIVED = re.compile(
    r"Received FetchResponse \(v\d+, (\d+) bytes, CorrId (\d+), rtt ([\d.]+)ms\)")

# The consumer, in a process of its own so its stderr is librdkafka's log alone.
_CONSUMER = textwrap.dedent("""
    import sys, time
    from confluent_kafka import Consumer, TopicPartition, OFFSET_BEGINNING, OFFSET_END
    bootstrap, topic, start, records, seconds = sys.argv[1:6]
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "fetch-gaps",
                         "enable.auto.commit": False, "debug": "protocol"})
    offset = OFFSET_BEGINNING if start == "earliest" else OFFSET_END
    consumer.assign([TopicPartition(topic, 0, offset)])
    wanted, got = int(records), 0
    deadline = time.monotonic() + float(seconds)
    while time.monotonic() < deadline and (wanted == 0 or got < wanted):
        for message in consumer.consume(10000, 0.5):
            if message.error() is None:
                got += 1
    print(got, flush=True)
    consumer.close()
""")


def _produce(bootstrap: str, topic: str, mb: int) -> int:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                         "batch.size": 1 << 20, "acks": "all"})
    value = b"x" * 1024
    records = mb * 1024
    for _ in range(records):
        while True:
            try:
                producer.produce(topic, value, partition=0)
                break
            except BufferError:
                producer.poll(0.01)
    producer.flush(120)
    return records


def _create(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(60)


def _consume(bootstrap: str, topic: str, start: str, records: int,
             seconds: float) -> tuple[int, list[str]]:
    done = subprocess.run([sys.executable, "-c", _CONSUMER, bootstrap, topic, start,
                           str(records), str(seconds)],
                          capture_output=True, text=True, timeout=seconds + 120, check=True)
    return int(done.stdout.split()[0]), done.stderr.splitlines()


def _fetches(lines: list[str]) -> dict[str, float]:
    sent: dict[int, float] = {}
    received: list[tuple[float, int, float]] = []  # (when, bytes, rtt ms)
    sends: list[float] = []
    for line in lines:
        match = _LINE.match(line)
        if match is None:
            continue
        when = int(match.group(1)) + int(match.group(2)) / 1000
        text = match.group(4)
        if (found := _SENT.search(text)) is not None:
            sent[int(found.group(1))] = when
            sends.append(when)
        elif (found := _RECEIVED.search(text)) is not None:
            received.append((when, int(found.group(1)), float(found.group(3))))
    gaps = []
    for when, _size, _rtt in received:
        following = [s for s in sends if s >= when]
        if following:
            gaps.append((following[0] - when) * 1000)
    rtts = [rtt for _w, _s, rtt in received]
    sizes = [size for _w, size, _r in received]

    def quantile(values: list[float], q: float) -> float:
        return statistics.quantiles(values, n=10)[int(q * 10) - 1] if len(values) > 1 else 0.0

    return {"fetches": len(received),
            "mb_per_fetch": statistics.mean(sizes) / 1e6 if sizes else 0.0,
            "rtt_p50": statistics.median(rtts) if rtts else 0.0,
            "rtt_p90": quantile(rtts, 0.9),
            "gap_p50": statistics.median(gaps) if gaps else 0.0,
            "gap_p90": quantile(gaps, 0.9)}


def _measure(name: str, bootstrap: str, mb: int, head_mbps: float, head_seconds: float) -> None:
    topic = f"gaps-{int(time.time())}"
    _create(bootstrap, topic)
    started = time.monotonic()
    records = _produce(bootstrap, topic, mb)
    print(f"{name}: wrote {mb} MiB in {time.monotonic() - started:.1f} s", flush=True)
    started = time.monotonic()
    got, lines = _consume(bootstrap, topic, "earliest", records, 600)
    took = time.monotonic() - started
    print(f"{name} from the start: {got} records, {mb / took:.0f} MiB/s (with start-up): "
          f"{_fetches(lines)}", flush=True)
    # At the head: a producer writes at head_mbps while the consumer follows.
    consumer = subprocess.Popen([sys.executable, "-c", _CONSUMER, bootstrap, topic, "latest",
                                 "0", str(head_seconds)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    time.sleep(3)  # the consumer has joined and sits at the end
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    value = b"y" * 1024
    per_tick = max(1, int(head_mbps * 1e6 / 1024 / 100))
    deadline = time.monotonic() + head_seconds - 5
    while time.monotonic() < deadline:
        tick = time.monotonic()
        for _ in range(per_tick):
            producer.produce(topic, value, partition=0)
        producer.poll(0)
        time.sleep(max(0.0, 0.01 - (time.monotonic() - tick)))
    producer.flush(60)
    out, err = consumer.communicate(timeout=head_seconds + 120)
    print(f"{name} at the head ({head_mbps} MB/s): {out.split()[0]} records: "
          f"{_fetches(err.splitlines())}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=1024)
    parser.add_argument("--servers", default="gateway,kafka")
    parser.add_argument("--head-mbps", type=float, default=5.0)
    parser.add_argument("--head-seconds", type=float, default=20.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fetch-gaps-") as work:
        for name in args.servers.split(","):
            directory = Path(work) / name
            directory.mkdir()
            if name == "gateway":
                with GatewayProcess(directory / "data") as gateway:
                    _measure(name, gateway.bootstrap, args.mb, args.head_mbps,
                             args.head_seconds)
            else:
                with KafkaBroker(directory) as kafka:
                    _measure(name, kafka.bootstrap, args.mb, args.head_mbps,
                             args.head_seconds)


if __name__ == "__main__":
    main()
