"""The workloads: one function per workload, each doing ONE measured run on one server.

A run creates its own topics on that server (fresh ones, so runs never see each
other's data), measures inside a Meter, deletes what it no longer needs and returns a
flat dict of numbers. Repetition, alternation between servers and best-of-N are the
runner's job (bench/runner.py).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic

from bench import clients
from bench.meter import Meter
from bench.procs import Child, new_event, run_child
from bench.servers import Server

KIB = 1024
MIB = 1024 * KIB


@dataclass(frozen=True)
class Metric:
    name: str
    label: str
    unit: str
    better: str | None  # "higher", "lower", or None for numbers that explain the others
    show: bool = True   # in the terminal/Markdown table (everything is in the JSON)


@dataclass
class Settings:
    """Sizes and durations of one benchmark run (the CLI fills this in)."""

    seconds: float = 5.0
    repeat: int = 3
    partitions: tuple[int, ...] = (1, 8)
    consume_mb: float = 512.0          # MiB of 1 KiB records read by each consume run
    rates: tuple[float, ...] = (0.25, 0.5, 0.8)  # of the slowest server's max produce rate
    e2e_rate: float = 2000.0           # records/s for the end-to-end latency run
    many_partitions: int = 100
    small_batch_bytes: int = 16 * KIB  # batch.size of the many-partitions workload
    record_size: int = 1024
    ceiling_seconds: float = 3.0
    warmup_s: float = 1.0              # e2e: how long the tail consumer polls before data
    server_warmup_s: float = 15.0      # unmeasured produce+consume per server before all runs

    @property
    def latency_partitions(self) -> int:
        return max(self.partitions)

    @property
    def consume_records(self) -> int:
        return max(1, int(self.consume_mb * MIB) // self.record_size)


@dataclass
class Workload:
    id: str
    kind: str
    title: str
    params: dict[str, Any]
    primary: str  # the metric that picks the best of N runs
    metrics: tuple[Metric, ...]
    run: Callable[[Server, Context], dict[str, float]]
    prepare: Callable[[Server, Context], None] | None = None
    finish: Callable[[Server, Context], None] | None = None

    def metric(self, name: str) -> Metric:
        return next(m for m in self.metrics if m.name == name)


@dataclass
class Context:
    """What runs share: settings, servers, admin clients, results so far."""

    settings: Settings
    servers: dict[str, Server]
    best: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)
    _admins: dict[str, AdminClient] = field(default_factory=dict)
    _serial: itertools.count[int] = field(default_factory=itertools.count)

    def admin(self, server: Server) -> AdminClient:
        if server.name not in self._admins:
            # A producer-type handle (as the admin client is) asks for auto-creation when
            # it refreshes the metadata of topics it knows, which re-created every deleted
            # topic on Kafka and the gateway (both auto-create by default).
            self._admins[server.name] = AdminClient({"bootstrap.servers": server.bootstrap,
                                                     "allow.auto.create.topics": False})
        return self._admins[server.name]

    def create_topic(self, server: Server, label: str, partitions: int) -> str:
        """A fresh topic, created explicitly: the two servers auto-create differently."""
        topic = f"bench-{label}-{next(self._serial)}-{int(time.time() * 1000) % 10**8}"
        futures = self.admin(server).create_topics(
            [NewTopic(topic, num_partitions=partitions, replication_factor=1)],
            operation_timeout=30)
        futures[topic].result(timeout=60)
        self._await_leaders(server, topic, partitions)
        return topic

    def _await_leaders(self, server: Server, topic: str, partitions: int) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            # Ask for this topic only: a Metadata request for all topics is what some
            # servers get wrong, and it is not what this waits for.
            meta = self.admin(server).list_topics(topic, timeout=10).topics.get(topic)
            if (meta is not None and meta.error is None and len(meta.partitions) == partitions
                    and all(p.leader >= 0 for p in meta.partitions.values())):
                return
            time.sleep(0.1)
        raise TimeoutError(f"{server.name}: topic {topic} has no leaders after 30s")

    def delete_topic(self, server: Server, topic: str) -> None:
        # Frees Tansu's memory (its storage is memory://) and the others' disk.
        futures = self.admin(server).delete_topics([topic], operation_timeout=60)
        futures[topic].result(timeout=90)

    def reference_rate(self, partitions: int) -> float:
        """The slowest server's best produce rate (records/s) at this partition count in
        this run, so that every server can sustain every offered rate; measured here for
        a server whose produce workload did not run."""
        rates = []
        for name, server in self.servers.items():
            best = self.best.get(f"produce-{partitions}p", {}).get(name)
            if best is None:
                key = f"calibration-{name}-{partitions}p"
                if key not in self.notes:
                    print(f"  calibrating: max produce rate of {name}, {partitions} partitions")
                    self.notes[key] = {"server": name, **produce(server, self, partitions)}
                best = self.notes[key]
            rates.append(float(best["records_per_s"]))
        return min(rates)


def _timeout(settings: Settings, data_records: int = 0) -> float:
    # Generous: a stuck run should fail the run, not hang the benchmark.
    return 120.0 + settings.seconds * 10 + data_records * settings.record_size / 5e6


def _throughput_metrics(run: dict[str, float], meter: Meter) -> dict[str, float]:
    elapsed = run["elapsed_s"]
    out = dict(run)
    out.update(meter.metrics())
    out["mb_per_s"] = run["bytes"] / elapsed / 1e6
    out["records_per_s"] = run["records"] / elapsed
    out["client_cpu_util"] = run["client_cpu_s"] / elapsed
    out["server_cpu_s_per_gb"] = meter.server_cpu_s / (run["bytes"] / 1e9)
    if run.get("produce_requests"):
        out["records_per_request"] = run["records"] / run["produce_requests"]
    return out


# --- 0. warm-up (not measured) ---------------------------------------------------------

def warm_up(server: Server, ctx: Context) -> dict[str, float]:
    """Before anything is measured, produce flat out over 8 partitions and read it all
    back, in rounds of at most 256 MiB (a topic each, deleted after, so memory://
    storage is freed), for server_warmup_s in all: a JVM's JIT compiles its hot paths,
    caches and connections settle, as on a broker that has been running a while."""
    s = ctx.settings
    partitions, cap = 8, (256 * MIB) // s.record_size
    deadline = time.monotonic() + s.server_warmup_s
    records = rounds = 0
    while rounds == 0 or time.monotonic() < deadline:
        topic = ctx.create_topic(server, "warmup", partitions)
        seconds = max(0.1, min(2.0, deadline - time.monotonic()))
        sent = run_child(clients.produce_throughput, _timeout(s), bootstrap=server.bootstrap,
                         topic=topic, partitions=partitions, seconds=seconds,
                         max_records=cap, record_size=s.record_size)
        count = int(sent["records"])
        run_child(clients.consume_throughput, _timeout(s, count), bootstrap=server.bootstrap,
                  topic=topic, partitions=partitions, expected=count,
                  record_size=s.record_size, timeout_s=60 + count * s.record_size / 5e6)
        ctx.delete_topic(server, topic)
        records, rounds = records + count, rounds + 1
    return {"records": float(records), "rounds": float(rounds)}


# --- 1. produce MB/s -------------------------------------------------------------------

def produce(server: Server, ctx: Context, partitions: int, *, linger_ms: float = 5,
            batch_size: int = MIB, label: str = "produce") -> dict[str, float]:
    """Flat-out produce of 1 KiB records for `seconds`, acks=all (one run)."""
    s = ctx.settings
    topic = ctx.create_topic(server, f"{label}{partitions}", partitions)
    with Meter(server) as meter:
        run = run_child(clients.produce_throughput, _timeout(s),
                        bootstrap=server.bootstrap, topic=topic, partitions=partitions,
                        seconds=s.seconds, record_size=s.record_size,
                        linger_ms=linger_ms, batch_size=batch_size)
    ctx.delete_topic(server, topic)
    return _throughput_metrics(run, meter)


# --- 2. consume MB/s from earliest -----------------------------------------------------

def _consume_topic_key(server: Server, partitions: int) -> str:
    return f"consume-topic-{server.name}-{partitions}p"


def prepare_consume(server: Server, ctx: Context, partitions: int) -> None:
    """Write the same dataset to each server once: consume_records records, produced
    with the produce workload's settings (so batches have the same shape)."""
    s = ctx.settings
    topic = ctx.create_topic(server, f"consume{partitions}", partitions)
    run_child(clients.produce_throughput, _timeout(s, s.consume_records),
              bootstrap=server.bootstrap, topic=topic, partitions=partitions,
              seconds=1e9, max_records=s.consume_records, record_size=s.record_size)
    ctx.notes[_consume_topic_key(server, partitions)] = topic


def consume(server: Server, ctx: Context, partitions: int) -> dict[str, float]:
    """Read the whole prepared dataset from the earliest offset (one run)."""
    s = ctx.settings
    topic = ctx.notes[_consume_topic_key(server, partitions)]
    with Meter(server) as meter:
        run = run_child(clients.consume_throughput, _timeout(s, s.consume_records),
                        bootstrap=server.bootstrap, topic=topic, partitions=partitions,
                        expected=s.consume_records, record_size=s.record_size,
                        timeout_s=60 + s.consume_records * s.record_size / 5e6)
    return _throughput_metrics(run, meter)


def finish_consume(server: Server, ctx: Context, partitions: int) -> None:
    ctx.delete_topic(server, ctx.notes.pop(_consume_topic_key(server, partitions)))


# --- 3. produce latency at fixed rates -------------------------------------------------

def produce_latency(server: Server, ctx: Context, fraction: float) -> dict[str, float]:
    """Produce at `fraction` of the slowest server's max rate; latency = produce() to ack."""
    s = ctx.settings
    partitions = s.latency_partitions
    rate = fraction * ctx.reference_rate(partitions)
    topic = ctx.create_topic(server, f"latency{int(fraction * 100)}", partitions)
    with Meter(server) as meter:
        run = run_child(clients.produce_latency, _timeout(s), bootstrap=server.bootstrap,
                        topic=topic, partitions=partitions, rate=rate, seconds=s.seconds,
                        record_size=s.record_size)
    ctx.delete_topic(server, topic)
    return {**run, **meter.metrics()}


# --- 4. end-to-end latency -------------------------------------------------------------

def end_to_end(server: Server, ctx: Context) -> dict[str, float]:
    """Producer and tail consumer in two processes; latency = send to poll() return."""
    s = ctx.settings
    topic = ctx.create_topic(server, "e2e", 1)
    expected = max(1, int(s.e2e_rate * s.seconds))
    ready = new_event()
    timeout = _timeout(s)
    with Meter(server) as meter:
        consumer = Child(clients.e2e_consumer, bootstrap=server.bootstrap, topic=topic,
                         expected=expected, ready=ready, warmup_s=s.warmup_s,
                         timeout_s=s.seconds + 60, record_size=s.record_size)
        producer = Child(clients.e2e_producer, bootstrap=server.bootstrap, topic=topic,
                         rate=s.e2e_rate, seconds=s.seconds, ready=ready,
                         record_size=s.record_size)
        try:
            sent = producer.result(timeout)
        finally:
            received = consumer.result(timeout)
    ctx.delete_topic(server, topic)
    return {**received, "rate": sent["records"] / sent["elapsed_s"], **meter.metrics()}


# --- 5. many partitions, small batches -------------------------------------------------

def many_partitions(server: Server, ctx: Context) -> dict[str, float]:
    """Flat-out produce over 100 partitions with linger 0 and 16 KiB batches: each
    request carries many small batches, so per-request and per-batch costs dominate."""
    s = ctx.settings
    return produce(server, ctx, s.many_partitions, linger_ms=0,
                   batch_size=s.small_batch_bytes, label="partitions")


# --- workload table --------------------------------------------------------------------

_THROUGHPUT = (
    Metric("mb_per_s", "throughput", "MB/s", "higher"),
    Metric("records_per_s", "records/s", "rec/s", "higher", show=False),
    Metric("server_cpu_s_per_gb", "server CPU per GB", "CPU s/GB", "lower"),
    Metric("server_cpu_util", "server CPU", "cores", None),
    Metric("client_cpu_util", "client CPU", "cores", None),
    # CPU used meanwhile by processes outside the benchmark (a shared machine).
    Metric("other_cpu_util", "other processes' CPU", "cores", None),
)
_PRODUCE = (*_THROUGHPUT,
            Metric("records_per_request", "records per Produce request", "rec/req", None))
_LATENCY = (
    Metric("p50_ms", "p50", "ms", "lower"),
    Metric("p99_ms", "p99", "ms", "lower"),
    Metric("p999_ms", "p99.9", "ms", "lower"),
    Metric("max_ms", "max", "ms", "lower", show=False),
    Metric("server_cpu_util", "server CPU", "cores", None, show=False),
    Metric("other_cpu_util", "other processes' CPU", "cores", None),
)
EFFICIENCY = (
    Metric("produce_cpu_s_per_gb", "server CPU per GB produced", "CPU s/GB", "lower"),
    Metric("consume_cpu_s_per_gb", "server CPU per GB consumed", "CPU s/GB", "lower"),
    Metric("peak_rss_mb", "peak RSS (VmHWM)", "MB", "lower"),
)

WORKLOAD_GROUPS = ("ceiling", "produce", "consume", "latency", "e2e", "partitions",
                   "efficiency")


def build(settings: Settings, groups: set[str]) -> list[Workload]:
    """The workloads of the selected groups, in the order they run."""
    s = settings
    out: list[Workload] = []
    if "produce" in groups:
        out += [Workload(
            f"produce-{p}p", "produce", f"Produce, {p} partition{'s' * (p > 1)}",
            {"partitions": p, "record_bytes": s.record_size, "acks": "all", "linger_ms": 5,
             "batch_bytes": MIB, "seconds": s.seconds},
            "mb_per_s", _PRODUCE, run=partial(produce, partitions=p),
        ) for p in s.partitions]
    if "consume" in groups:
        out += [Workload(
            f"consume-{p}p", "consume", f"Consume from earliest, {p} partition{'s' * (p > 1)}",
            {"partitions": p, "records": s.consume_records, "record_bytes": s.record_size},
            "mb_per_s", _THROUGHPUT,
            run=partial(consume, partitions=p),
            prepare=partial(prepare_consume, partitions=p),
            finish=partial(finish_consume, partitions=p),
        ) for p in s.partitions]
    if "latency" in groups:
        out += [Workload(
            f"latency-{round(f * 100)}", "latency",
            f"Produce latency at {round(f * 100)}% of the slowest max, "
            f"{s.latency_partitions} partitions",
            {"fraction_of_slowest_max": f, "partitions": s.latency_partitions,
             "seconds": s.seconds, "acks": "all", "linger_ms": 5},
            "p99_ms", (*_LATENCY,
                       Metric("target_rate", "offered rate", "rec/s", None),
                       Metric("achieved_rate", "achieved rate", "rec/s", None, show=False)),
            run=partial(produce_latency, fraction=f),
        ) for f in s.rates]
    if "e2e" in groups:
        out.append(Workload(
            "e2e", "e2e", f"End-to-end latency at {s.e2e_rate:g} rec/s, producer to tail consumer",
            {"rate": s.e2e_rate, "partitions": 1, "linger_ms": 0, "seconds": s.seconds},
            "p99_ms", _LATENCY, run=end_to_end,
        ))
    if "partitions" in groups:
        out.append(Workload(
            f"partitions-{s.many_partitions}", "partitions",
            f"Produce, {s.many_partitions} partitions, small batches "
            f"(linger 0, {s.small_batch_bytes // KIB} KiB)",
            {"partitions": s.many_partitions, "linger_ms": 0,
             "batch_bytes": s.small_batch_bytes, "seconds": s.seconds},
            "mb_per_s", _PRODUCE, run=many_partitions,
        ))
    return out
