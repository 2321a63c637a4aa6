"""Client-side measurement code. Every public function here runs in its own child process
(see bench/procs.py) so that librdkafka's threads, queues and CPU time belong to one
measured run only, and returns a plain dict of numbers.

Per-record Python work is kept to the produce()/consume() calls themselves: one shared
1 KiB value, partitions taken round-robin from a precomputed list.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
)

MIB = 1024 * 1024
STATS_INTERVAL_MS = 250
# One ProduceRequest chunk of the hot loop: the deadline is checked once per chunk,
# not once per record.
_CHUNK = 1024
# librdkafka's poll() takes whole milliseconds: anything below 1 ms is a busy spin that
# would steal a core from the servers under test.
_TICK_S = 0.001

DeliveryCallback = Callable[[KafkaError | None, Message], None]


def producer_config(bootstrap: str, *, linger_ms: float = 5, batch_size: int = MIB,
                    extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The producer settings of the throughput workloads (acks=all, linger, 1 MiB batches)."""
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "linger.ms": linger_ms,
        "batch.size": batch_size,
        # A request may carry a full batch for several partitions; the default 1 MB cap
        # would split them into more requests than the batch size asks for.
        "message.max.bytes": max(4 * MIB, batch_size + 64 * 1024),
        "queue.buffering.max.messages": 100_000,
        "queue.buffering.max.kbytes": 1024 * 1024,
        "compression.type": "none",
        "enable.idempotence": False,
    }
    config.update(extra or {})
    return config


def percentiles_ms(latencies_s: Sequence[float]) -> dict[str, float]:
    """Nearest-rank p50/p99/p99.9 and max, in milliseconds."""
    ordered = sorted(latencies_s)
    if not ordered:
        raise RuntimeError("no latency samples")

    def rank(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))] * 1e3

    return {"p50_ms": rank(0.50), "p99_ms": rank(0.99), "p999_ms": rank(0.999),
            "max_ms": ordered[-1] * 1e3, "samples": float(len(ordered))}


def _cpu_s() -> float:
    times = os.times()
    return times.user + times.system  # this process, all its threads (librdkafka's too)


class _Stats:
    """Keeps librdkafka's latest statistics JSON, to count the Produce requests sent."""

    def __init__(self) -> None:
        self.latest: dict[str, Any] = {}
        self.count = 0

    def __call__(self, raw: str) -> None:
        self.latest = json.loads(raw)
        self.count += 1

    def produce_requests(self, producer: Producer, wait_s: float = 2.0) -> int:
        # Statistics arrive on a timer; wait for one emitted after the final flush.
        seen = self.count
        deadline = time.monotonic() + wait_s
        while self.count == seen and time.monotonic() < deadline:
            producer.poll(0.02)
        brokers = self.latest.get("brokers", {}).values()
        return sum(int(b.get("req", {}).get("Produce", 0)) for b in brokers)


class _Errors:
    """Delivery-report callback for failures only (delivery.report.only.error)."""

    def __init__(self) -> None:
        self.count = 0
        self.first = ""

    def __call__(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self.count += 1
            self.first = self.first or str(err)

    def check(self) -> None:
        if self.count:
            raise RuntimeError(f"{self.count} records failed, first: {self.first}")


def _round_robin(partitions: int) -> list[int]:
    # A whole number of rounds, so that consecutive chunks continue the rotation evenly.
    length = max(partitions, _CHUNK - _CHUNK % partitions)
    return [i % partitions for i in range(length)]


def _produce_when_room(producer: Producer, topic: str, value: bytes, partition: int,
                       on_delivery: DeliveryCallback | None = None) -> None:
    # The local queue is full: the server (or the network) is the limit right now.
    while True:
        producer.poll(_TICK_S)
        try:
            producer.produce(topic, value, partition=partition, on_delivery=on_delivery)
            return
        except BufferError:
            continue


def _produce_flat_out(producer: Producer, topic: str, value: bytes, partitions: int,
                      deadline: float, max_records: int) -> int:
    """produce() as fast as the client can until the deadline or max_records; returns count."""
    produce, poll, clock = producer.produce, producer.poll, time.perf_counter
    chunk = _round_robin(partitions)
    sent = 0
    while sent < max_records and clock() < deadline:
        parts = chunk if max_records - sent >= len(chunk) else chunk[: max_records - sent]
        for part in parts:
            try:
                produce(topic, value, partition=part)
            except BufferError:
                _produce_when_room(producer, topic, value, part)
        sent += len(parts)
        poll(0)
    return sent


def produce_throughput(bootstrap: str, topic: str, partitions: int, seconds: float,
                       record_size: int = 1024, max_records: int = 2**62,
                       linger_ms: float = 5, batch_size: int = MIB) -> dict[str, float]:
    """Produce flat out for `seconds` (or exactly max_records), then flush.

    Throughput counts from the first produce() to the last acknowledgement, so records
    still queued in the client when the deadline passes are included, and waited for.
    """
    stats, errors = _Stats(), _Errors()
    producer = Producer(producer_config(
        bootstrap, linger_ms=linger_ms, batch_size=batch_size,
        extra={"statistics.interval.ms": STATS_INTERVAL_MS, "stats_cb": stats,
               "delivery.report.only.error": True, "on_delivery": errors}))
    producer.list_topics(topic, timeout=10)  # connect and learn leaders before the clock
    value = b"x" * record_size
    cpu0, t0 = _cpu_s(), time.perf_counter()
    sent = _produce_flat_out(producer, topic, value, partitions, t0 + seconds, max_records)
    left = producer.flush(max(60.0, seconds * 10))
    elapsed, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
    if left:
        raise RuntimeError(f"{left} records still unacknowledged after the flush timeout")
    errors.check()
    requests = stats.produce_requests(producer)
    return {"records": float(sent), "bytes": float(sent * record_size), "elapsed_s": elapsed,
            "client_cpu_s": cpu, "produce_requests": float(requests)}


def client_ceiling(seconds: float, partitions: int = 8, record_size: int = 1024,
                   max_records: int = 3_000_000) -> dict[str, float]:
    """Rate of produce() calls with nothing listening: the Python client's own limit.

    The bootstrap port is closed, so librdkafka only queues records (with a queue big
    enough never to push back); what is measured is the client-side cost per record.
    """
    from bench.servers import free_port  # a port nobody listens on

    producer = Producer(producer_config(
        f"127.0.0.1:{free_port()}",
        extra={"queue.buffering.max.messages": max_records + _CHUNK,
               "queue.buffering.max.kbytes": 2**31 - 1, "message.timeout.ms": 600_000,
               "log_level": 0, "error_cb": lambda _err: None}))
    value = b"x" * record_size
    cpu0, t0 = _cpu_s(), time.perf_counter()
    sent = _produce_flat_out(producer, "bench-ceiling", value, partitions, t0 + seconds,
                             max_records)
    elapsed, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
    producer.purge()
    return {"records": float(sent), "bytes": float(sent * record_size), "elapsed_s": elapsed,
            "client_cpu_s": cpu}


def consume_throughput(bootstrap: str, topic: str, partitions: int, expected: int,
                       record_size: int = 1024, timeout_s: float = 60.0) -> dict[str, float]:
    """Read from the earliest offset until `expected` records arrived (or time out).

    Records are counted as they arrive rather than trusting the server's high watermark
    (Tansu's is known to be wrong for multi-record batches).
    """
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": "bench-consume",
        "enable.auto.commit": False, "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        # librdkafka stops fetching for fetch.queue.backoff.ms (1 s by default)
        # whenever its prefetch queue is full, which a server that answers
        # faster than this Python loop drains it reaches often: the run then
        # measures those pauses, not the server (docs/performance.md, "the
        # one-partition consume round trip"). Every server gets the same value.
        "fetch.queue.backoff.ms": 10,
    })
    consumer.list_topics(topic, timeout=10)  # connect before the clock starts
    cpu0, t0 = _cpu_s(), time.perf_counter()
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    received, errors, first_error = 0, 0, ""
    deadline = t0 + timeout_s
    while received < expected and time.perf_counter() < deadline:
        # Ask for no more than what is left: consume() otherwise waits out its timeout.
        batch = consumer.consume(min(10_000, expected - received), 1.0)
        bad = [m for m in batch if m.error() is not None]
        received += len(batch) - len(bad)
        if bad:
            errors += len(bad)
            first_error = first_error or str(bad[0].error())
    elapsed, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
    consumer.close()
    if received < expected:
        raise RuntimeError(f"consumed {received} of {expected} records in {timeout_s}s"
                           f" ({errors} errors, first: {first_error or 'none'})")
    return {"records": float(received), "bytes": float(received * record_size),
            "elapsed_s": elapsed, "client_cpu_s": cpu, "fetch_errors": float(errors)}


def _paced(total: int, rate: float, send: Callable[[int], None], poll: Callable[[float], Any],
           ) -> float:
    """Call send(i) for i in range(total) at `rate` per second; returns the seconds taken.

    Records due are sent in a burst every ~1 ms (poll doubles as the sleep), which is
    finer than the 5 ms linger and keeps the offered load steady.
    """
    clock = time.perf_counter
    t0 = clock()
    sent = 0
    while sent < total:
        due = min(total, int((clock() - t0) * rate) + 1)
        while sent < due:
            send(sent)
            sent += 1
        poll(_TICK_S)
    return clock() - t0


def produce_latency(bootstrap: str, topic: str, partitions: int, rate: float, seconds: float,
                    record_size: int = 1024, max_samples: int = 50_000) -> dict[str, float]:
    """Produce at a fixed rate; latency = produce() call to acknowledgement (librdkafka's
    own per-message timestamp, so the Python poll loop's delay is not counted)."""
    producer = Producer(producer_config(bootstrap))
    producer.list_topics(topic, timeout=10)
    total = max(1, int(rate * seconds))
    every = max(1, total // max_samples)  # sample evenly: p99.9 needs >= ~10k samples
    latencies: list[float] = []
    errors = _Errors()

    def on_sampled(err: KafkaError | None, msg: Message) -> None:
        if err is None:
            latency = msg.latency()
            if latency is not None:
                latencies.append(latency)
        else:
            errors(err, msg)

    value = b"x" * record_size
    chunk = _round_robin(partitions)

    def send(i: int) -> None:
        callback = on_sampled if i % every == 0 else None  # None: no report at all
        partition = chunk[i % len(chunk)]
        try:
            producer.produce(topic, value, partition=partition, on_delivery=callback)
        except BufferError:
            _produce_when_room(producer, topic, value, partition, callback)

    cpu0 = _cpu_s()
    offered_s = _paced(total, rate, send, producer.poll)
    t_flush = time.perf_counter()
    left = producer.flush(max(60.0, seconds * 10))
    drain_s = time.perf_counter() - t_flush
    cpu = _cpu_s() - cpu0
    if left:
        raise RuntimeError(f"{left} records unacknowledged after the flush timeout")
    errors.check()
    return {**percentiles_ms(latencies), "target_rate": rate,
            "achieved_rate": total / offered_s, "records": float(total),
            "bytes": float(total * record_size), "elapsed_s": offered_s + drain_s,
            "client_cpu_s": cpu}


def e2e_producer(bootstrap: str, topic: str, rate: float, seconds: float, ready: Any,
                 record_size: int = 1024) -> dict[str, float]:
    """Produce at a fixed rate with the send time (CLOCK_MONOTONIC, shared by all
    processes of this machine) in the key, once the tail consumer is ready."""
    producer = Producer(producer_config(bootstrap, linger_ms=0))
    producer.list_topics(topic, timeout=10)
    if not ready.wait(60):
        raise RuntimeError("the tail consumer never became ready")
    total = max(1, int(rate * seconds))
    value = b"x" * record_size

    def send(_i: int) -> None:
        producer.produce(topic, value, key=time.monotonic_ns().to_bytes(8, "big"), partition=0)

    cpu0 = _cpu_s()
    offered_s = _paced(total, rate, send, producer.poll)
    left = producer.flush(60)
    if left:
        raise RuntimeError(f"{left} records unacknowledged after the flush timeout")
    return {"records": float(total), "elapsed_s": offered_s, "client_cpu_s": _cpu_s() - cpu0}


def e2e_consumer(bootstrap: str, topic: str, expected: int, ready: Any, warmup_s: float,
                 timeout_s: float, record_size: int = 1024) -> dict[str, float]:
    """Sit at the tail of an empty topic, then time each record from send to poll()."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": "bench-e2e",
        "enable.auto.commit": False, "enable.auto.offset.store": False,
    })
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])  # empty topic: the tail
    warm_until = time.monotonic() + warmup_s
    while time.monotonic() < warm_until:  # let fetch sessions reach their long poll
        if consumer.poll(0.05) is not None:
            raise RuntimeError("the e2e topic was not empty")
    ready.set()
    latencies: list[float] = []
    cpu0 = _cpu_s()
    deadline = time.monotonic() + timeout_s
    while len(latencies) < expected and time.monotonic() < deadline:
        msg = consumer.poll(0.1)
        if msg is None or msg.error() is not None:
            continue
        now = time.monotonic_ns()
        latencies.append((now - int.from_bytes(msg.key() or b"", "big")) / 1e9)
    cpu = _cpu_s() - cpu0
    consumer.close()
    if len(latencies) < expected:
        raise RuntimeError(f"tail consumer got {len(latencies)} of {expected} records")
    return {**percentiles_ms(latencies), "records": float(len(latencies)),
            "bytes": float(len(latencies) * record_size), "client_cpu_s": cpu}
