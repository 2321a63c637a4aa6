"""The archive and aggregate jobs end to end with exact results, and the
launcher (`python -m spark_jobs`): help, the connector from the cache, and the
message when there is none."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from compat_helpers import create_topic

from spark_jobs import aggregate, archive, feed, session
from spark_jobs.__main__ import JOBS, parser
from testkit.spark import produce, read_topic
from testkit.spark import session as spark_session

ROOT = Path(__file__).resolve().parent.parent
# The Scala build pip's pyspark ships, by Spark major; the Kafka client each
# tested connector brings (docs/spark.md).
SCALA = {"3": "2.12", "4": "2.13"}
KAFKA_CLIENTS = {"3.5.7": "3.4.1", "4.2.0": "3.9.2"}


@pytest.fixture(scope="module")
def spark():
    return spark_session()


def args(job: str, gateway, *extra: str):
    return parser().parse_args([job, "--bootstrap-servers", gateway.bootstrap, *extra])


def archived(spark, output: Path) -> list[tuple[int, int, int]]:
    """(partition, offset, seq) of every archived row, sorted."""
    return sorted((r.partition, r.offset, json.loads(bytes(r.value))["seq"])
                  for r in spark.read.parquet(str(output)).collect())


def source_index(gateway, topic: str) -> list[tuple[int, int, int]]:
    return sorted((r.partition, r.offset, json.loads(r.value)["seq"])
                  for r in read_topic(gateway.bootstrap, topic))


def test_archive_stream_available_now_exactly_once(spark, gateway, topic_name, tmp_path):
    feed.produce(gateway.bootstrap, topic_name, 90, partitions=3)
    produce(gateway.bootstrap, topic_name,
            [json.dumps(feed.event(seq, 20)).encode() for seq in range(500, 505)],
            partition=2, transactional_id=f"archive-{topic_name}")
    run = args("archive", gateway, "--topic", topic_name, "--output", str(tmp_path / "out"),
               "--checkpoint", str(tmp_path / "ckpt"))
    archive.run(spark, run)
    assert archived(spark, tmp_path / "out") == source_index(gateway, topic_name)
    assert len(archived(spark, tmp_path / "out")) == 95

    feed.produce(gateway.bootstrap, topic_name, 30, first_seq=90)
    archive.run(spark, run)
    archive.run(spark, run)  # nothing new: nothing written
    rows = archived(spark, tmp_path / "out")
    assert rows == source_index(gateway, topic_name)
    assert len(rows) == len(set(rows)) == 125
    columns = spark.read.parquet(str(tmp_path / "out")).columns
    assert columns == list(archive.COLUMNS)


def test_archive_batch_with_offset_bounds(spark, gateway, topic_name, tmp_path):
    feed.produce(gateway.bootstrap, topic_name, 120, partitions=3)
    start = json.dumps({topic_name: {"0": 5, "1": 10, "2": 0}})
    end = json.dumps({topic_name: {"0": 25, "1": 40, "2": -1}})  # -1: latest
    run = args("archive", gateway, "--topic", topic_name, "--output", str(tmp_path / "out"),
               "--mode", "batch", "--starting-offsets", start, "--ending-offsets", end)
    expected = [(p, o, s) for p, o, s in source_index(gateway, topic_name)
                if (p, o) in {(0, o) for o in range(5, 25)} | {(1, o) for o in range(10, 40)}
                | {(2, o) for o in range(0, 40)}]
    archive.run(spark, run)
    assert archived(spark, tmp_path / "out") == expected
    assert len(expected) == 90
    # Rerun after three more events: the output is replaced, each record once;
    # partition 2's bound is "latest", which now takes in its new record.
    feed.produce(gateway.bootstrap, topic_name, 3, first_seq=120)
    archive.run(spark, run)
    assert archived(spark, tmp_path / "out") == [*expected, (2, 40, 122)]


def test_aggregate_events_per_user_per_minute(spark, gateway, topic_name, tmp_path):
    create_topic(gateway, topic_name, 2)
    target = f"{topic_name}-per-minute"
    minute = 60_000
    base = (int(time.time()) // 60 - 60) * minute  # an hour ago, on a minute
    plan = [(0, "alice", 3), (0, "bob", 1), (1, "alice", 2), (2, "bob", 4), (2, "carol", 2)]
    for n, (m, user, count) in enumerate(plan):
        produce(gateway.bootstrap, topic_name,
                [json.dumps({"user_id": user}).encode()] * count, partition=n % 2,
                timestamps=[base + m * minute + 1000 * i for i in range(count)])
    # No user id: left out. Minute 10 moves the watermark past minutes 0-2.
    produce(gateway.bootstrap, topic_name, [b'{"amount": 1}', b"not json"],
            timestamps=[base + 500, base + 600])
    produce(gateway.bootstrap, topic_name, [b'{"user_id": "alice"}'],
            timestamps=[base + 10 * minute])
    run = args("aggregate", gateway, "--source", topic_name, "--target", target,
               "--checkpoint", str(tmp_path / "ckpt"), "--once")
    aggregate.run(spark, run)

    def results() -> dict[bytes, dict]:
        out: dict[bytes, dict] = {}
        for r in read_topic(gateway.bootstrap, target):
            assert r.key not in out, f"{r.key} emitted twice"
            out[r.key] = json.loads(r.value)
        return out

    def window(user: str, m: int, events: int) -> tuple[bytes, dict]:
        start = base + m * minute
        return f"{user}@{start}".encode(), {"user_id": user, "window_start": start,
                                            "window_end": start + minute, "events": events}

    expected = dict(window(u, m, c) for m, u, c in plan)
    assert results() == expected
    # A late event for minute 1 (behind the watermark: dropped) and one at
    # minute 20, which closes minute 10's window.
    produce(gateway.bootstrap, topic_name, [b'{"user_id": "alice"}'] * 2,
            timestamps=[base + minute + 5000, base + 20 * minute])
    aggregate.run(spark, run)
    assert results() == {**expected, **dict([window("alice", 10, 1)])}


def test_launcher_help_for_every_job():
    for job in [*JOBS, "feed"]:
        done = subprocess.run([sys.executable, "-m", "spark_jobs", job, "--help"], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "--bootstrap-servers" in done.stdout
        if job != "feed":
            assert "--packages" in done.stdout and "--master" in done.stdout


def test_launcher_without_connector_says_how_to_get_it(tmp_path):
    env = {**os.environ, "KAFKA_GATEWAY_JVM_CACHE": str(tmp_path / "empty-cache")}
    done = subprocess.run(
        [sys.executable, "-m", "spark_jobs", "reshard", "--bootstrap-servers", "127.0.0.1:9",
         "--source", "a", "--target", "b", "--checkpoint", str(tmp_path / "ckpt")],
        cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2
    version = session.spark_version()
    coordinates = f"org.apache.spark:spark-sql-kafka-0-10_{SCALA[version[0]]}:{version}"
    assert coordinates in done.stderr
    assert f"-f {session.connector_pom(version)} " in done.stderr
    assert "dependency:copy-dependencies" in done.stderr and "--packages" in done.stderr
    assert not (tmp_path / "ckpt").exists()


def test_connector_from_the_cache_leaves_out_what_spark_ships():
    """The connector of the installed pyspark's line, with the Kafka client it
    brings: 3.4.1 under Spark 3.5, 3.9 under Spark 4."""
    spark_session()  # resolves the connector into the cache
    version = session.spark_version()
    scala = SCALA[version[0]]
    jars = session.cached_connector(version)
    names = sorted(jar.name.rsplit("-", 1)[0] for jar in jars)
    assert names == ["commons-pool2", "kafka-clients", f"spark-sql-kafka-0-10_{scala}",
                     f"spark-token-provider-kafka-0-10_{scala}"]
    assert any(jar.name == f"kafka-clients-{KAFKA_CLIENTS[version]}.jar" for jar in jars)
    assert session.connector_conf(packages=True) == {
        "spark.jars.packages": f"org.apache.spark:spark-sql-kafka-0-10_{scala}:{version}"}
