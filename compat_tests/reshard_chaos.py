"""The exactly-once resharding check, shared by its test and by longer runs.

Several worker processes in one group read a source topic, route each record
by the user id in its value to a target topic, and commit the offsets, all in
one transaction per batch. Meanwhile, at random moments, the check SIGKILLs a
worker (and starts a new one), SIGSTOPs one past its session timeout and then
SIGCONTs it (the seeds' zombie), and kills the gateway with ``kill -9`` and
restarts it. Afterwards every source record must be in the target exactly
once, each source partition's records in order within each target
partition, and the group's committed offsets at the source's ends.

On a cluster (``KAFKA_GATEWAY_TEST_STORE=postgresql-cluster``: the gateway
has siblings) the clients bootstrap through all three, the restart is a
restart of all three, and a ``plan`` can add the cluster's own fault,
"gateway": ``kill -9`` of one gateway while the others carry on
(``testkit.cluster_faults``: the victim's pid gone, its partitions and
coordinators taken by the survivors, the workers committing through them),
then the victim started again.

    python -m compat_tests.reshard_chaos --rounds 40   # a longer run by hand
    python -m compat_tests.reshard_chaos --client java  # with Java-client workers
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from testkit import cluster_faults, jvm
from testkit.gateway import GatewayProcess

SESSION_TIMEOUT_S = 6.0
FAULTS = ("kill", "hang", "restart")  # drawn at random without a plan
CARRY_ON_S = 90.0  # bound on the workers' first commit with one gateway dead
WORKER = Path(__file__).with_name("reshard_worker.py")


@dataclass
class ChaosReport:
    messages: int = 0
    kills: int = 0
    hangs: int = 0
    restarts: int = 0
    lost: int = 0
    duplicated: int = 0
    reordered: int = 0
    aborted: int = 0  # transactions the workers aborted (zombies, conflicts, restarts)
    client_hangs: int = 0  # workers restarted by their watchdog (reshard_worker.Watchdog)
    misrouted: int = 0  # target records not in their user's partition (crc32 % partitions)
    gateway_kills: int = 0  # one gateway of a cluster killed while the others carry on
    committed: dict[int, int] = field(default_factory=dict)  # source partition -> offset
    offsets_wrong: int = 0  # source partitions whose committed offset is not their end
    seconds: float = 0.0
    events: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (f"messages={self.messages} kills={self.kills} hangs={self.hangs} "
                f"restarts={self.restarts} lost={self.lost} duplicated={self.duplicated} "
                f"reordered={self.reordered} aborted={self.aborted} "
                f"gateway_kills={self.gateway_kills} offsets_wrong={self.offsets_wrong} "
                f"client_hangs={self.client_hangs} "
                f"seconds={self.seconds:.1f}")


class Workers:
    """Worker processes, started by a command builder, logging to files."""

    def __init__(self, command: Callable[[str], list[str]], log_dir: Path) -> None:
        self.command = command
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._next = 0

    def start(self) -> str:
        name = f"w{self._next}"
        self._next += 1
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - the child owns it
        self.procs[name] = subprocess.Popen(self.command(name), stdout=log,
                                            stderr=subprocess.STDOUT)
        return name

    def kill(self, name: str) -> None:
        self.procs.pop(name).kill()

    def stop_all(self) -> None:
        for proc in self.procs.values():
            proc.send_signal(signal.SIGCONT)
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.procs.clear()

    def count(self, pattern: str) -> int:
        """Lines of the workers' logs that start with ``pattern``."""
        return sum(line.startswith(pattern) for p in self.log_dir.glob("*.log")
                   for line in p.read_text(errors="replace").splitlines())

    def logs(self) -> str:
        return "".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                       for p in sorted(self.log_dir.glob("*.log")))


def python_worker(bootstrap: str, group: str, source: str, target: str,
                  target_partitions: int) -> Callable[[str], list[str]]:
    return lambda name: [sys.executable, str(WORKER), bootstrap, group, source, target,
                         str(target_partitions), name]


def java_worker(bootstrap: str, group: str, source: str, target: str,
                target_partitions: int) -> Callable[[str], list[str]]:
    """The same worker with the Java client 3.4.1 (jvm/src/javatxn/ReshardWorker.java)."""
    classes = jvm.compile_java()
    return lambda name: jvm.java_command(
        "javatxn.ReshardWorker", "run", "--bootstrap", bootstrap, "--group", group,
        "--source", source, "--target", target, "--target-partitions", str(target_partitions),
        "--worker", name, classes=classes, heap="256m")


WORKERS = {"python": python_worker, "java": java_worker}


def produce_source(bootstrap: str, source: str, partitions: int, messages: int,
                   users: int = 50, start: int = 0) -> None:
    """Source records ``start`` to ``messages`` - 1 (record ``seq`` on partition
    ``seq`` % ``partitions``)."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 5})
    for seq in range(start, messages):
        user = f"u{seq % users}"
        producer.produce(source, partition=seq % partitions,
                         value=f"{user} seq={seq}".encode())
        if seq % 1000 == 999:
            producer.flush(30)
    assert producer.flush(60) == 0, "the source could not be written"


def committed_everything(bootstrap: str, group: str, source: str, partitions: int) -> bool:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "isolation.level": "read_committed"})
    try:
        tps = [TopicPartition(source, p) for p in range(partitions)]
        committed = consumer.committed(tps, timeout=10)
        return all(tp.offset >= consumer.get_watermark_offsets(tp, timeout=10)[1]
                   for tp in committed)
    except Exception:
        return False
    finally:
        consumer.close()


# What a read may be answered while a partition's leader or the group's
# coordinator moves (on a cluster, a gateway started again takes its share
# back): asked again, as clients do.
MOVING = {KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE,
          KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.NOT_LEADER_FOR_PARTITION,
          KafkaError.LEADER_NOT_AVAILABLE}
T = TypeVar("T")


def asked_again(read: Callable[[], T], timeout: float = 60.0) -> T:
    """``read()``, again while it fails with a ``MOVING`` error; the last
    error after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return read()
        except KafkaException as exc:
            if exc.args[0].code() not in MOVING or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def committed_offsets(bootstrap: str, group: str, source: str,
                      partitions: int) -> dict[int, int]:
    """The group's committed offset of each source partition (fails loudly)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        found = asked_again(lambda: consumer.committed(
            [TopicPartition(source, p) for p in range(partitions)], timeout=30))
        return {tp.partition: tp.offset for tp in found}
    finally:
        consumer.close()


def stalled(gateway: GatewayProcess, pool: Workers, group: str, source: str,
            partitions: int) -> str:
    """What a stalled run's failure says: the committed offsets as the
    workers' consumers ask for them (require_stable), and each worker's
    stacks, dumped into its log (SIGUSR1: faulthandler in reshard_worker.py;
    SIGQUIT: the JVM's thread dump)."""
    for proc in pool.procs.values():
        java = "javatxn.ReshardWorker" in " ".join(map(str, proc.args))  # type: ignore[arg-type]
        proc.send_signal(signal.SIGQUIT if java else signal.SIGUSR1)
    time.sleep(2.0)
    try:
        offsets: object = cluster_faults.stable_offsets(gateway, group, source, partitions)
    except Exception as error:  # the diagnosis must not hide the failure
        offsets = repr(error)
    return f"OffsetFetch(require_stable) of {source}: {offsets}"


def kill_one_gateway(gateway: GatewayProcess, rng: random.Random, pool: Workers,
                     topics: tuple[str, str], source_partitions: int, group: str,
                     produce: Callable[[], None], report: ChaosReport) -> None:
    """kill -9 of one gateway of the cluster (one that leads some of
    ``topics``' partitions), the round's records produced while it is dead,
    the workers committing through the survivors, then the gateway started
    again."""
    members = gateway.members
    assert len(members) > 1, "the fault 'gateway' needs a cluster"
    transactional_ids = [f"reshard-{name}" for name in sorted(pool.procs)]
    view = cluster_faults.cluster_view(members[0], topics, [group], transactional_ids)
    leading = set(view.leaders.values())
    victim = rng.choice([m for m in members if cluster_faults.node_of(m) in leading])
    commits: list[int] = []

    def during() -> None:
        commits.append(pool.count("committed"))
        produce()

    outage = cluster_faults.kill_one(gateway, victim, topics, [group], transactional_ids,
                                     during=during)
    waited = time.monotonic()
    while pool.count("committed") <= commits[0]:
        if time.monotonic() - waited > CARRY_ON_S:
            raise AssertionError(
                f"node {outage.node} killed: no worker committed through the survivors in "
                f"{CARRY_ON_S} s ({report.line()}; {report.events}); "
                f"{stalled(gateway, pool, group, topics[0], source_partitions)}:\n{pool.logs()}")
        time.sleep(0.2)
    carried_on = time.monotonic() - waited + outage.failover_s
    time.sleep(rng.uniform(0.5, 2.0))
    rejoined = cluster_faults.start_again(gateway, victim)
    report.gateway_kills += 1
    ids = [key for key in outage.coordinated if key != group]
    report.events.append(
        f"kill -9 node {outage.node} (pid {outage.pid}; led {len(outage.led)} partitions, "
        f"coordinated {'the group and ' if group in outage.coordinated else ''}"
        f"transactional ids {ids}): survivors served all after "
        f"{outage.failover_s:.1f} s, a worker committed by {carried_on:.1f} s; "
        f"started again, listed by all in {rejoined:.1f} s")


def check_target(bootstrap: str, target: str, target_partitions: int, source_partitions: int,
                 source_counts: dict[int, int], report: ChaosReport) -> None:
    """Every (source partition, offset) exactly once; per target partition, each
    source partition's offsets increasing; each record in its user's partition."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{target}",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    seen: Counter[tuple[int, int]] = Counter()
    for partition in range(target_partitions):
        tp = TopicPartition(target, partition, 0)
        _low, high = asked_again(partial(consumer.get_watermark_offsets, tp, timeout=10))
        consumer.assign([tp])
        last: dict[int, int] = {}
        position = 0
        while position < high - 1:  # the last offset is a COMMIT marker
            message = consumer.poll(5)
            if message is None:
                break
            if message.error():
                continue
            position = message.offset()
            src_partition, src_offset, rest = message.value().split(b":", 2)
            key = (int(src_partition), int(src_offset))
            if zlib.crc32(rest.split(b" ", 1)[0]) % target_partitions != partition:
                report.misrouted += 1
            seen[key] += 1
            if last.get(key[0], -1) > key[1]:
                report.reordered += 1
            last[key[0]] = key[1]
    consumer.close()
    expected = {(p, o) for p in range(source_partitions) for o in range(source_counts[p])}
    report.lost = len(expected - set(seen))
    report.duplicated = sum(n - 1 for n in seen.values() if n > 1)


WorkerCommand = Callable[[str, str, str, str, int], Callable[[str], list[str]]]


def run(gateway: GatewayProcess, workers_command: WorkerCommand,
        rounds: int = 6, messages: int = 3000, seed: int = 7, workers: int = 3,
        deadline_s: float = 150.0, log_dir: Path | None = None,
        plan: Sequence[str] | None = None) -> ChaosReport:
    """Run the check against a ``testkit.gateway.GatewayProcess`` (and its
    cluster siblings): ``rounds`` faults drawn from ``FAULTS``, or those of
    ``plan`` in order (``FAULTS`` and "gateway")."""
    if plan is not None:
        rounds = len(plan)
    rng = random.Random(seed)
    bootstrap = ",".join(member.bootstrap for member in gateway.members)
    started = time.monotonic()
    report = ChaosReport(messages=messages)
    suffix = f"{seed}-{int(time.time() * 1000) % 10**8}"
    source, target, group = f"src-{suffix}", f"dst-{suffix}", f"reshard-{suffix}"
    source_partitions, target_partitions = 4, 3
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(source, source_partitions),
                                       NewTopic(target, target_partitions)]).values():
        future.result(30)
    # The source is written in rounds + 1 chunks: one before the workers start
    # and one just before each fault, so every fault lands while the workers
    # are busy (written at once, it is all processed before the first fault).
    bounds = [messages * i // (rounds + 1) for i in range(rounds + 2)]
    produce_source(bootstrap, source, source_partitions, bounds[1])
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="reshard-"))
    pool = Workers(workers_command(bootstrap, group, source, target,
                                   target_partitions), log_dir)
    try:
        for _ in range(workers):
            pool.start()
        for chunk in range(rounds):
            time.sleep(rng.uniform(1.0, 3.0))
            action = plan[chunk] if plan is not None else None

            def produce(chunk: int = chunk) -> None:
                produce_source(bootstrap, source, source_partitions, bounds[chunk + 2],
                               start=bounds[chunk + 1])

            if action == "gateway":  # this round's records written with it dead
                kill_one_gateway(gateway, rng, pool, (source, target), source_partitions,
                                 group, produce, report)
                continue
            produce()
            time.sleep(rng.uniform(0.0, 0.5))
            action = action or rng.choice(FAULTS)
            if action == "kill" and pool.procs:
                victim = rng.choice(sorted(pool.procs))
                pool.kill(victim)
                pool.start()
                report.kills += 1
                report.events.append(f"SIGKILL {victim}")
            elif action == "hang" and pool.procs:
                victim = rng.choice(sorted(pool.procs))
                pool.procs[victim].send_signal(signal.SIGSTOP)
                time.sleep(SESSION_TIMEOUT_S + rng.uniform(1.0, 3.0))
                pool.procs[victim].send_signal(signal.SIGCONT)
                report.hangs += 1
                report.events.append(f"SIGSTOP/SIGCONT {victim}")
            elif action == "restart":
                gateway.kill()
                time.sleep(rng.uniform(0.0, 1.0))
                gateway.start()
                report.restarts += 1
                report.events.append("kill -9 gateway" if len(gateway.members) == 1
                                     else "kill -9 all gateways")
            else:
                raise ValueError(f"no fault {action!r} with workers {sorted(pool.procs)}")
        while not committed_everything(bootstrap, group, source, source_partitions):
            if time.monotonic() - started > deadline_s:
                raise AssertionError(f"the workers did not finish in {deadline_s}s "
                                     f"({report.line()}; {report.events}); "
                                     f"{stalled(gateway, pool, group, source, source_partitions)}"
                                     f":\n{pool.logs()}")
            time.sleep(1.0)
    finally:
        pool.stop_all()
    report.aborted = pool.count("abort") + pool.count("fatal") + pool.count("retriable")
    report.client_hangs = pool.count("hung")
    counts = {p: len(range(p, messages, source_partitions)) for p in range(source_partitions)}
    report.committed = committed_offsets(bootstrap, group, source, source_partitions)
    report.offsets_wrong = sum(report.committed[p] != counts[p] for p in counts)
    check_target(bootstrap, target, target_partitions, source_partitions, counts, report)
    report.seconds = time.monotonic() - started
    return report


def main() -> None:
    from testkit.gateway import GatewayProcess

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--client", choices=sorted(WORKERS), default="python",
                        help="the workers' client: confluent-kafka or the Java client")
    args = parser.parse_args()
    with GatewayProcess(Path(tempfile.mkdtemp()) / "data") as gateway:
        report = run(gateway, WORKERS[args.client], args.rounds, args.messages, args.seed,
                     args.workers, deadline_s=60 + 10 * args.rounds)
    print(report.line())
    print(json.dumps(report.events))
    sys.exit(0 if report.lost == report.duplicated == report.reordered == 0 else 1)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
