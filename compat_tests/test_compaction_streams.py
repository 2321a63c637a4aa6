"""Kafka Streams 3.4.1 and 4.4.0, exactly_once_v2, counting per key with its state on
the gateway: the store's changelog (a compacted topic Streams creates) and
the repartition topic of the groupBy. Program: jvm/src/compaction/CountStreams.java.

The app counts the first records and stops cleanly; the gateway compacts the
changelog meanwhile (the app asks for a segment every 200 ms of record time
and cleaning as soon as anything is dirty; a commit marker bears the time of
its commit, so a segment rolls at the first commit 200 ms after it began).
More records come; a slowed instance is killed with SIGKILL mid-stream, once
its changelog writes have closed the segment holding the first run's last
counts and the cleaner has compacted past them; a new instance starts with
an empty state directory, so its store can only come back by restoring the
changelog, which it reads compacted (the test waits for the cleaner to reach
the changelog's head segments first). "Counted" means the app committed past
every record of the source and of the repartition topic, not only of the
source: the counting sub-topology lags behind the one feeding it. Afterwards
each user's last count in the output (read_committed) is exactly its number
of input records.

The killed instance's transaction is aborted by its timeout (Streams' 10 s
for EOS): the new instance has another transactional id (a new state
directory, a new process id), as in test_streams_java.py.
"""

from __future__ import annotations

from collections import Counter

import pytest
from compaction_helpers import partition_metric
from compat_helpers import create_topic
from confluent_kafka.admin import AdminClient
from group_helpers import committed_offsets, group_gateway, wait_for
from java_helpers import JavaProcess, by_op, run_java, step

from testkit import prom
from testkit.compaction import now_ms

PARTITIONS, USERS = 2, 40
FIRST, SECOND = 1500, 1500
PROGRAM = "compaction.CountStreams"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with group_gateway(tmp_path_factory.mktemp("compaction-streams") / "data",
                       "--log-cleaner-backoff-ms", "100",
                       "--transaction-abort-timed-out-transaction-cleanup-interval-ms", "200",
                       "--admin-listen", "127.0.0.1:0") as gw:
        yield gw


def consumed(gateway, group: str, topic: str) -> int:
    """How many records of ``topic`` the group has committed past."""
    return sum(max(offset, 0) for (name, _p), (offset, _m)
               in committed_offsets(gateway, group).items() if name == topic)


def counted(gateway, group: str, source: str, total: int, repartition: str) -> bool:
    """Whether the app has counted all ``total`` records of ``source``.

    Consuming the source is not enough: the app is two sub-topologies, and
    the stateless one (source -> repartition topic) runs ahead of the
    counting one (repartition topic -> store -> output), which may still be
    restoring its store. Once the whole source is committed, so is every
    record it put in the repartition topic (one transaction commits both),
    and that topic's end is final; its last entry in each partition is a
    transaction's COMMIT marker, so the counting task has committed past
    every record there once its offset reaches that marker.
    """
    if consumed(gateway, group, source) < total:
        return False
    ends = {p: high_watermark(gateway, repartition, p) for p in range(PARTITIONS)}
    committed = committed_offsets(gateway, group)
    return all(committed.get((repartition, p), (-1, ""))[0] >= end - 1
               for p, end in ends.items())


def test_streams_counts_restore_from_the_compacted_changelog(gateway, java_line_classes, tmp_path,
                                                            topic_name):
    source, output, app_id = f"{topic_name}-in", f"{topic_name}-out", f"app-{topic_name}"
    changelog, repartition = f"{app_id}-counts-changelog", f"{app_id}-by-user-repartition"
    create_topic(gateway, source, partitions=PARTITIONS)
    create_topic(gateway, output, partitions=PARTITIONS)
    base_ms = now_ms() - 60_000 - 10 * (FIRST + SECOND)

    def produce(start: int, count: int, *extra: str) -> None:
        lines = run_java(gateway, java_line_classes, PROGRAM, "produce", "--input", source,
                         "--users", str(USERS), "--from", str(start), "--count", str(count),
                         "--base-ms", str(base_ms), *extra)
        assert step(lines, "produced") == {"count": count}

    def run(state: str, *extra: str) -> JavaProcess:
        return JavaProcess(gateway, java_line_classes, PROGRAM, "run", "--app-id", app_id,
                           "--input", source, "--output", output,
                           "--state-dir", str(tmp_path / state), *extra)

    def reclaimed() -> float:
        return sum(partition_metric(gateway, "partition_bytes_reclaimed_total", changelog, p)
                   for p in range(PARTITIONS))

    produce(0, FIRST)
    app = run("state-1")
    try:
        wait_for(lambda: counted(gateway, app_id, source, FIRST, repartition), 180,
                 f"{app_id} to count {FIRST}", gateway, 0.5)
        wait_for(lambda: reclaimed() > 0, 60, "the changelog compacted", gateway, 0.5)
        first_run = app.finish()
    finally:
        app.kill()
        (tmp_path / "run-1.log").write_text(app.stderr())
    assert step(first_run, "closed") == {"clean": True, "errors": []}

    # A segment rolls only when a later batch arrives (as in Kafka), and the
    # cleaner never touches the head segment: whatever of the first run's
    # counts is still in it (all it committed in its last 200 ms, often
    # most of them) is compacted only once the next instance writes to the
    # changelog. The killed instance must get that far, or the new one
    # restores the first run's counts uncompacted. Its counting tasks get
    # repartitioned records only once its main consumer has handed out what
    # it fetched before them: the whole backlog of the source in one fetch
    # of 1 MB a partition (the Java client drains one partition's fetch
    # before the next), 5 s of the slowed processing. Small batches (about
    # 30 records) fetched one a partition let them count while the source
    # is still being read. The first run's last entry in each changelog
    # partition is a COMMIT marker: compacted up to it is compacted past
    # every count of the first run.
    first_end = [high_watermark(gateway, changelog, p) for p in range(PARTITIONS)]

    def going() -> int:
        n = consumed(gateway, app_id, source)
        past_first = all(partition_metric(gateway, "clean_offset", changelog, p) >= end - 1
                         for p, end in enumerate(first_end))
        return n if n >= FIRST + 100 and past_first else 0

    produce(FIRST, SECOND, "--batch-size", "1024")
    app = run("state-1", "--delay-ms", "3",
              "--main-consumer-config", "max.partition.fetch.bytes=1")
    try:
        at_kill = wait_for(going, 180, "the slowed instance to get going and the changelog "
                           "compacted past the first run's counts", gateway, 0.2)
    finally:
        app.kill()  # SIGKILL
        (tmp_path / "run-2-killed.log").write_text(app.stderr())
    assert FIRST + 100 <= at_kill < FIRST + SECOND, "not killed mid-stream"
    # The cleaner (every 100 ms) compacts what the killed instance committed,
    # up to each partition's head segment, before the new instance restores.
    wait_for(lambda: all(partition_metric(gateway, "cleanable_bytes", changelog, p) == 0
                         for p in range(PARTITIONS)),
             60, "the changelog compacted up to its head", gateway, 0.2)

    app = run("state-2")  # empty: everything comes back from the changelog
    try:
        wait_for(lambda: counted(gateway, app_id, source, FIRST + SECOND, repartition), 240,
                 f"{app_id} to count everything", gateway, 0.5)
        last_run = app.finish()
    finally:
        app.kill()
        (tmp_path / "run-3.log").write_text(app.stderr())
    assert step(last_run, "closed") == {"clean": True, "errors": []}

    counts = step(run_java(gateway, java_line_classes, PROGRAM, "dump", "--output", output,
                           "--partitions", str(PARTITIONS)), "counts")["counts"]
    expected = Counter(f"user-{n % USERS}" for n in range(FIRST + SECOND))
    assert counts == dict(expected)

    restored = [line for line in by_op(last_run)["restored"] if line["topic"] == changelog]
    assert sorted(line["partition"] for line in restored) == list(range(PARTITIONS))
    restored_records = sum(line["records"] for line in restored)
    changelog_offsets = sum(high_watermark(gateway, changelog, p) for p in range(PARTITIONS))
    print(f"\nstreams: killed at {at_kill} of {FIRST + SECOND} consumed; the new instance "
          f"restored {restored_records} changelog records of the {changelog_offsets} offsets "
          f"written to it; {reclaimed():.0f} bytes reclaimed from the changelog")
    assert 0 < restored_records < changelog_offsets / 4, "the changelog was not compacted"
    assert partition_metric(gateway, "partition_runs_total", changelog) > 0
    assert internal_topics(gateway, app_id) == sorted([changelog, repartition])


def high_watermark(gateway, topic: str, partition: int) -> int:
    return int(prom.value(gateway.metrics(), "kafka_gateway_high_watermark", topic=topic,
                          partition=str(partition)))


def internal_topics(gateway, app_id: str) -> list[str]:
    admin = AdminClient({"bootstrap.servers": gateway.bootstrap})
    return sorted(t for t in admin.list_topics(timeout=30).topics if t.startswith(app_id))
