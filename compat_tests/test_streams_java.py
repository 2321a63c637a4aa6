"""Kafka Streams 3.4.1 and 4.4.0 (``java_line_classes``) with exactly_once_v2, against the
gateway: a stateless reshard (source -> selectKey(user id from the value) ->
to(target), so the target is partitioned by user), run to completion, then
killed with SIGKILL mid-stream and restarted with the same application.id.
Afterwards every source record is in the target exactly once (read_committed)
and each user's records are in seq order. Program: jvm/src/javatxn/ReshardStreams.java.

A stateless app has no persistent store, so a restarted instance gets a new
process id and with it a new transactional id: the killed instance's open
transaction is not fenced by InitProducerId but aborted by its timeout
(Streams' default transaction.timeout.ms for EOS, 10 s), and until then the
new instance's offset fetch (require_stable) answers UNSTABLE_OFFSET_COMMIT
and it waits.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest
from compat_helpers import create_topic
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource
from group_helpers import group_gateway, wait_for
from java_helpers import JavaProcess, by_op, run_java, step

SOURCE_PARTITIONS, TARGET_PARTITIONS, USERS = 4, 3, 20
FIRST, SECOND = 1500, 2500
PROGRAM = "javatxn.ReshardStreams"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    """Timed-out transactions are aborted every 200 ms (the killed instance's)."""
    with group_gateway(tmp_path_factory.mktemp("streams-java") / "data",
                       "--transaction-abort-timed-out-transaction-cleanup-interval-ms",
                       "200", "--admin-listen", "127.0.0.1:0") as gw:
        yield gw


def _consumer(gateway, group: str) -> Consumer:
    return Consumer({"bootstrap.servers": gateway.bootstrap, "group.id": group,
                     "isolation.level": "read_uncommitted"})


def committed(gateway, group: str, topic: str) -> int | None:
    """The sum of the group's committed offsets on ``topic`` (pending
    transactional offsets not counted), or None if they cannot be read now."""
    consumer = _consumer(gateway, group)
    try:
        tps = [TopicPartition(topic, p) for p in range(SOURCE_PARTITIONS)]
        return sum(max(tp.offset, 0) for tp in consumer.committed(tps, timeout=10))
    except Exception:
        return None
    finally:
        consumer.close()


def caught_up(gateway, group: str, topics: list[str]) -> bool:
    """Every partition of ``topics`` has the group's offset at its end."""
    consumer = _consumer(gateway, group)
    try:
        tps = [TopicPartition(topic, p) for topic in topics for p in range(SOURCE_PARTITIONS)]
        return all(tp.offset >= consumer.get_watermark_offsets(tp, timeout=10)[1]
                   for tp in consumer.committed(tps, timeout=10))
    except Exception:
        return False
    finally:
        consumer.close()


def wait_committed(gateway, group: str, topic: str, at_least: int, timeout: float) -> int:
    return wait_for(lambda: (n := committed(gateway, group, topic)) is not None
                    and n >= at_least and n, timeout,
                    f"{group} to commit {at_least} offsets of {topic}", gateway, interval=0.5)


def wait_caught_up(gateway, group: str, topics: list[str], timeout: float) -> None:
    wait_for(lambda: caught_up(gateway, group, topics), timeout,
             f"{group} to reach the end of {topics}", gateway, interval=0.5)


def txn_metrics(gateway) -> dict[str, int]:
    """The gateway's kafka_gateway_txn_* counters (its /metrics)."""
    return {name.removeprefix("kafka_gateway_txn_"): int(value)
            for (name, labels), value in gateway.metrics().items()
            if name.startswith("kafka_gateway_txn_") and not labels}


def topic_configs(gateway, topic: str) -> dict[str, str]:
    admin = AdminClient({"bootstrap.servers": gateway.bootstrap})
    [future] = admin.describe_configs([ConfigResource("topic", topic)]).values()
    return {name: entry.value for name, entry in future.result(30).items()}


def keep_log(app: JavaProcess, path) -> None:
    """SIGKILL the app if it still runs; keep its log (stderr) beside the test."""
    app.kill()
    path.write_text(app.stderr())


def produce(gateway, classes, source: str, start: int, count: int) -> None:
    lines = run_java(gateway, classes, PROGRAM, "produce", "--source", source,
                     "--partitions", str(SOURCE_PARTITIONS), "--users", str(USERS),
                     "--from", str(start), "--count", str(count))
    assert step(lines, "produced") == {"count": count}


def check_exactly_once(records: list[list], total: int) -> None:
    """Every seq in [0, total) exactly once; a user's records in one target
    partition, in seq order; the key is the user."""
    seqs: Counter[int] = Counter()
    by_user: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for partition, offset, key, value in records:
        user, seq = value.split(" seq=")
        assert key == user, (key, value)
        seqs[int(seq)] += 1
        by_user[user].append((partition, offset, int(seq)))
    assert sorted(seqs) == list(range(total)), f"lost: {sorted(set(range(total)) - set(seqs))}"
    assert [s for s, n in seqs.items() if n > 1] == [], "duplicated"
    for user, rows in by_user.items():
        assert len({p for p, _o, _s in rows}) == 1, f"{user} in several target partitions"
        ordered = [s for _p, _o, s in sorted(rows)]
        assert ordered == sorted(ordered), f"{user} reordered"


@pytest.mark.parametrize("repartition", ["", "by-user"])
def test_streams_eos_v2_reshard_survives_sigkill(gateway, java_line_classes, tmp_path,
                                                 topic_name, repartition):
    """Run the app until the source is done; stop it; add records, start it
    slowed down, SIGKILL it mid-stream (some but not all of the new records
    committed), restart it with the same application.id and state dir; then
    the target holds every record once, per user in order. With
    ``by-user``, the records go through an explicit repartition topic first
    (an internal topic Streams creates with cleanup.policy=delete and purges
    with DeleteRecords)."""
    source, target, app_id = f"{topic_name}-src", f"{topic_name}-dst", f"app-{topic_name}"
    create_topic(gateway, source, partitions=SOURCE_PARTITIONS)
    create_topic(gateway, target, partitions=TARGET_PARTITIONS)
    produce(gateway, java_line_classes, source, 0, FIRST)
    args = ("--app-id", app_id, "--source", source, "--target", target,
            "--state-dir", str(tmp_path / "state"), "--repartition", repartition)

    # What the app consumes: the source, and the repartition topic if any
    # (Streams names it <application.id>-<name>-repartition; 4 partitions, as
    # the source has).
    inputs = [source] + ([f"{app_id}-{repartition}-repartition"] if repartition else [])

    app = JavaProcess(gateway, java_line_classes, PROGRAM, "run", *args)
    try:
        wait_committed(gateway, app_id, source, FIRST, 180)
        wait_caught_up(gateway, app_id, inputs, 120)
        first_run = app.finish()
    finally:
        keep_log(app, tmp_path / "run-1.log")
    assert step(first_run, "closed") == {"clean": True, "errors": []}
    assert [s["state"] for s in by_op(first_run)["state"]][-2:] == ["PENDING_SHUTDOWN",
                                                                     "NOT_RUNNING"]

    produce(gateway, java_line_classes, source, FIRST, SECOND)
    app = JavaProcess(gateway, java_line_classes, PROGRAM, "run", *args, "--delay-ms", "3")
    try:
        at_kill = wait_committed(gateway, app_id, source, FIRST + 100, 180)
    finally:
        keep_log(app, tmp_path / "run-2-killed.log")  # SIGKILL
    assert FIRST + 100 <= at_kill < FIRST + SECOND, "not killed mid-stream"

    before_restart = txn_metrics(gateway)
    app = JavaProcess(gateway, java_line_classes, PROGRAM, "run", *args)
    try:
        wait_committed(gateway, app_id, source, FIRST + SECOND, 240)
        wait_caught_up(gateway, app_id, inputs, 120)
        last_run = app.finish()
    finally:
        keep_log(app, tmp_path / "run-3.log")
    assert step(last_run, "closed") == {"clean": True, "errors": []}

    after = txn_metrics(gateway)
    print(f"\nstreams ({repartition or 'no repartition'}): killed at {at_kill} of "
          f"{FIRST + SECOND} committed; after the restart: "
          f"{after['timeouts_total'] - before_restart['timeouts_total']} transaction(s) "
          f"timed out, {after['commits_total'] - before_restart['commits_total']} committed; "
          f"txn metrics {after}")

    lines = run_java(gateway, java_line_classes, PROGRAM, "dump", "--target", target,
                     "--partitions", str(TARGET_PARTITIONS))
    check_exactly_once(step(lines, "records")["records"], FIRST + SECOND)

    # The internal topics Streams made: none for the plain app (no changelog,
    # no repartition); the repartition topic otherwise, with the configs
    # Streams asks for (cleanup.policy=delete, retention.ms=-1, ...).
    admin = AdminClient({"bootstrap.servers": gateway.bootstrap})
    internal = sorted(t for t in admin.list_topics(timeout=30).topics if t.startswith(app_id))
    assert internal == inputs[1:]
    if repartition:
        configs = topic_configs(gateway, inputs[1])
        assert {k: configs[k] for k in ("cleanup.policy", "retention.ms", "segment.bytes",
                                         "message.timestamp.type")} == {
            "cleanup.policy": "delete", "retention.ms": "-1", "segment.bytes": "52428800",
            "message.timestamp.type": "CreateTime"}
