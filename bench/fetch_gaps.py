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
    bootstrap, topic, start, records, seconds, debug, extra = sys.argv[1:8]
    settings = dict(pair.split("=", 1) for pair in extra.split(",") if pair)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "fetch-gaps",
                         "enable.auto.commit": False, "debug": debug, **settings})
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


KEEP_LOG: str | None = None
CONSUMER_SETTINGS = ""  # name=value,... for the consumer (--consumer)
DEBUG = "protocol"  # with --debug-fetch also "fetch": why librdkafka holds a fetch back


def _consume(bootstrap: str, topic: str, start: str, records: int,
             seconds: float) -> tuple[int, list[str]]:
    done = subprocess.run([sys.executable, "-c", _CONSUMER, bootstrap, topic, start,
                           str(records), str(seconds), DEBUG, CONSUMER_SETTINGS],
                          capture_output=True, text=True, timeout=seconds + 120, check=True)
    return int(done.stdout.split()[0]), done.stderr.splitlines()


def _fetches(lines: list[str]) -> dict[str, float]:
    """Per Fetch that brought data: rtt, and the gap before the next was sent."""
    sent: dict[int, float] = {}
    received: dict[int, tuple[float, int, float]] = {}  # corr id: (when, bytes, rtt ms)
    for line in lines:
        match = _LINE.match(line)
        if match is None:
            continue
        when = int(match.group(1)) + int(match.group(2)) / 1000
        text = match.group(4)
        if (found := _SENT.search(text)) is not None:
            sent[int(found.group(1))] = when
        elif (found := _RECEIVED.search(text)) is not None:
            received[int(found.group(2))] = (when, int(found.group(1)), float(found.group(3)))
    # Fetches with data, each followed by another: a last long-poll at the end
    # of the log (max.wait) is no round trip.
    full = [corr for corr, (_w, size, _r) in received.items()
            if size > 1000 and corr in sent and corr + 1 in sent]
    rtts = [received[corr][2] for corr in full]
    logged = [(received[corr][0] - sent[corr]) * 1000 for corr in full]
    gaps = [(sent[corr + 1] - received[corr][0]) * 1000 for corr in full]
    cycles = [(sent[corr + 1] - sent[corr]) * 1000 for corr in full]
    sizes = [received[corr][1] for corr in full]

    def quantile(values: list[float], q: float) -> float:
        return statistics.quantiles(values, n=10)[int(q * 10) - 1] if len(values) > 1 else 0.0

    def mean(values: list[float]) -> float:
        return round(statistics.mean(values), 3) if values else 0.0

    return {"fetches": len(full), "mb_per_fetch": round(mean(sizes) / 1e6, 3),
            "ms_per_fetch": mean(cycles),  # from one FetchRequest sent to the next
            "rtt_p50": statistics.median(rtts) if rtts else 0.0,
            "rtt_p90": round(quantile(rtts, 0.9), 3), "rtt_mean": mean(rtts),
            "sent_to_received_mean": mean(logged),  # by the log's clock (1 ms steps)
            "gap_mean": mean(gaps), "gap_p90": round(quantile(gaps, 0.9), 3),
            "gaps_over_5ms": sum(gap > 5 for gap in gaps),
            "ms_in_gaps_over_5ms": round(sum(gap for gap in gaps if gap > 5), 1)}


def _measure(name: str, bootstrap: str, mb: int, head_mbps: float, head_seconds: float) -> None:
    topic = f"gaps-{int(time.time())}"
    _create(bootstrap, topic)
    started = time.monotonic()
    records = _produce(bootstrap, topic, mb)
    print(f"{name}: wrote {mb} MiB in {time.monotonic() - started:.1f} s", flush=True)
    started = time.monotonic()
    got, lines = _consume(bootstrap, topic, "earliest", records, 600)
    took = time.monotonic() - started
    if KEEP_LOG:
        Path(f"{KEEP_LOG}.{name}").write_text("\n".join(lines))
    print(f"{name} from the start: {got} records, {mb / took:.0f} MiB/s (with start-up): "
          f"{_fetches(lines)}", flush=True)
    if head_seconds <= 0:
        return
    # At the head: a producer writes at head_mbps while the consumer follows.
    consumer = subprocess.Popen([sys.executable, "-c", _CONSUMER, bootstrap, topic, "latest",
                                 "0", str(head_seconds), DEBUG, CONSUMER_SETTINGS],
                                stdout=subprocess.PIPE,
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
    parser.add_argument("--debug-fetch", action="store_true",
                        help="also librdkafka's fetch debug: slower, says why it waits")
    parser.add_argument("--keep-log", help="write the consumer's log from the start here")
    parser.add_argument("--consumer", default="",
                        help="consumer settings, name=value,... (fetch.queue.backoff.ms=10)")
    parser.add_argument("--skip-head", action="store_true")
    args = parser.parse_args()
    global DEBUG, KEEP_LOG, CONSUMER_SETTINGS
    CONSUMER_SETTINGS = args.consumer
    if args.debug_fetch:
        DEBUG = "protocol,fetch"
    KEEP_LOG = args.keep_log
    with tempfile.TemporaryDirectory(prefix="fetch-gaps-") as work:
        for name in args.servers.split(","):
            directory = Path(work) / name
            directory.mkdir()
            if name == "gateway":
                with GatewayProcess(directory / "data") as gateway:
                    _measure(name, gateway.bootstrap, args.mb, args.head_mbps,
                             0 if args.skip_head else args.head_seconds)
            else:
                with KafkaBroker(directory) as kafka:
                    _measure(name, kafka.bootstrap, args.mb, args.head_mbps,
                             0 if args.skip_head else args.head_seconds)


if __name__ == "__main__":
    main()
