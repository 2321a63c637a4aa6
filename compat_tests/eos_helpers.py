"""The idle-partition scenario of EOS v2 apps, for any client (issue 18).

Kafka's own EOS v2 example (and most EOS v2 apps) runs one transactional id
per instance and sends, in every transaction, the position of EVERY assigned
partition with the consumer's group metadata (KIP-447). After a rebalance an
instance thus re-sends, unchanged, the offset another instance's
transactional id committed for a partition it took over and has no new
records of. ``run_scenario`` drives two instances (``start(name)`` starts
one: a ``LinesProcess`` printing ``assigned``/``committed``/``aborted``/
``done`` lines, compat_tests/eos_worker.py or javatxn.EosProcessor) through

1. A alone: records on every source partition, A commits them all;
2. B joins (a rebalance): records on one partition of each, so each
   instance's transactions carry an idle partition A's id committed;
3. B leaves (a rebalance): records on one partition A kept, so A's
   transactions carry B's former partitions, idle, committed by B's id;

then reads the target with a read_committed consumer. Every wait is bounded.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from java_helpers import LinesProcess

SOURCE_PARTITIONS = 4
PHASES = (200, 150, 150)  # records produced in each phase
TOTAL = sum(PHASES)
WAIT_S = 120  # for a rebalance
# For each phase's records to be committed (seconds when nothing is refused);
# a stalled phase is reported with the figures, within the test's timeout.
COMMIT_WAIT_S = 60
# A rebalance may cost an instance a transaction or two (Kafka: none); a
# transaction refused for ever costs one every poll (~90 in 45 s measured).
MAX_ABORTS = 4


@dataclass
class Outcome:
    delivered: list[bytes]  # the target's values, read_committed, in log order
    aborts: dict[str, int]  # instance -> aborted transactions
    produced: list[bytes]
    stalled: list[str]  # the phases whose records were not all committed in time

    @property
    def figures(self) -> str:
        counts = Counter(self.delivered)
        return (f"delivered {len(set(self.delivered) & set(self.produced))}/{len(self.produced)} "
                f"distinct, {len(self.delivered)} in all, "
                f"{sum(n - 1 for n in counts.values())} duplicates, aborts {self.aborts}, "
                f"stalled: {self.stalled or 'none'}")


def names() -> dict[str, str]:
    u = uuid.uuid4().hex[:10]
    return {"source": f"eos-src-{u}", "target": f"eos-dst-{u}", "group": f"eos-g-{u}",
            "txn": f"eos-{u}"}


def create_topics(bootstrap: str, source: str, target: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(source, SOURCE_PARTITIONS, 1),
                                   NewTopic(target, 1, 1)], operation_timeout=30)
    for future in futures.values():
        future.result(60)


def produce(bootstrap: str, topic: str, phase: int, partitions: list[int],
            count: int) -> list[bytes]:
    """``count`` records spread over ``partitions``, acknowledged; their values."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    values = []
    for i in range(count):
        partition = partitions[i % len(partitions)]
        value = f"{phase}:{partition}:{i}".encode()
        producer.produce(topic, value=value, partition=partition)
        values.append(value)
    assert producer.flush(60) == 0, "records left unacknowledged"
    return values


def read_target(bootstrap: str, topic: str, expected: int, quiet_s: float = 3.0) -> list[bytes]:
    """Every value of partition 0 at read_committed: until ``expected`` were read
    and nothing more came for ``quiet_s`` (a duplicate would), or 60 s."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4().hex}",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, -2)])  # OFFSET_BEGINNING
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    last = time.monotonic()
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                values.append(message.value())
                last = time.monotonic()
            elif len(values) >= expected and time.monotonic() - last > quiet_s:
                break
    finally:
        consumer.close()
    return values


def latest(process: LinesProcess, op: str) -> dict | None:
    found = [line for line in list(process.lines) if line.get("op") == op]
    return found[-1] if found else None


def assignment(process: LinesProcess) -> list[int]:
    line = latest(process, "assigned")
    return line["partitions"] if line else []


def committed_total(*processes: LinesProcess) -> int:
    return sum((latest(p, "committed") or {"total": 0})["total"] for p in processes)


def settle(condition: Callable[[], bool], timeout: float = COMMIT_WAIT_S) -> bool:
    """Whether ``condition`` holds within ``timeout`` (a stalled phase is
    reported with the figures, not raised here)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def run_scenario(bootstrap: str, start: Callable[[str], LinesProcess], topics: dict[str, str]
                 ) -> Outcome:
    """The three phases above; returns what the target holds and each
    instance's aborts. ``start(name)`` starts instance ``name`` ("A", "B")."""
    source, target = topics["source"], topics["target"]
    create_topics(bootstrap, source, target)
    everything = list(range(SOURCE_PARTITIONS))
    stalled: list[str] = []
    a = start("A")
    processes = {"A": a}
    try:
        a.wait_until(lambda _lines: assignment(a) == everything, WAIT_S, "A's assignment")
        produced = produce(bootstrap, source, 1, everything, PHASES[0])
        if not settle(lambda: committed_total(a) == PHASES[0]):
            stalled.append(f"phase 1: {committed_total(a)}/{PHASES[0]} committed")
        b = processes["B"] = start("B")
        b.wait_until(lambda _lines: bool(assignment(b)) and sorted(
            assignment(a) + assignment(b)) == everything, WAIT_S, "the rebalance to A and B")
        busy = [min(assignment(a)), min(assignment(b))]
        # The premise: each instance keeps a partition that gets no records
        # now, whose offset A's transactional id committed in phase 1.
        assert set(assignment(a)) - set(busy) and set(assignment(b)) - set(busy), (
            f"no idle partition: A {assignment(a)}, B {assignment(b)}")
        produced += produce(bootstrap, source, 2, busy, PHASES[1])
        phase2 = sum(PHASES[:2])
        if not settle(lambda: committed_total(a, b) == phase2):
            stalled.append(f"phase 2: {committed_total(a, b)}/{phase2} committed")
        b_lines = b.finish()
        a.wait_until(lambda _lines: assignment(a) == everything, WAIT_S,
                     "A's assignment after B left")
        produced += produce(bootstrap, source, 3, [busy[0]], PHASES[2])
        if not settle(lambda: committed_total(a) + done(b_lines)["total"] == TOTAL):
            stalled.append(f"phase 3: {committed_total(a) + done(b_lines)['total']}/{TOTAL} "
                           "committed")
        a_lines = a.finish()
    finally:
        for process in processes.values():
            process.kill()
    delivered = read_target(bootstrap, target, TOTAL)
    return Outcome(delivered, {"A": done(a_lines)["aborts"], "B": done(b_lines)["aborts"]},
                   produced, stalled)


def done(lines: list[dict]) -> dict:
    [line] = [line for line in lines if line.get("op") == "done"]
    return line


def assert_exactly_once(outcome: Outcome, server: str) -> None:
    """Every produced record in the target once, and a bounded number of aborts."""
    counts = Counter(outcome.delivered)
    assert sorted(counts) == sorted(outcome.produced) and set(counts.values()) == {1}, (
        f"{server}: {outcome.figures}")
    assert sum(outcome.aborts.values()) <= MAX_ABORTS, f"{server}: {outcome.figures}"
