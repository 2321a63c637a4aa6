"""The reshard job (spark_jobs/reshard.py) against the gateway, with Spark's
own Kafka source: end to end, a crash before Spark records a batch, zombie
tasks (two producers for the same batch, one delayed), and the driver killed
with SIGKILL mid-stream then restarted from its checkpoint. In every case the
target holds each committed source record exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from compat_helpers import create_topic
from pyspark.errors import StreamingQueryException

from spark_jobs import feed, reshard
from spark_jobs.__main__ import parser
from spark_jobs.common import kafka_reader
from testkit.spark import TEST_CONF, assert_resharded, committed, produce, read_topic, session

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def spark():
    return session()


def job_args(gateway, source: str, target: str, checkpoint: Path, *extra: str):
    return parser().parse_args(["reshard", "--bootstrap-servers", gateway.bootstrap,
                                "--source", source, "--target", target,
                                "--checkpoint", str(checkpoint), *extra])


def events(first: int, count: int, users: int = 11) -> list[bytes]:
    return [json.dumps(feed.event(seq, users)).encode() for seq in range(first, first + count)]


def test_reshard_end_to_end(spark, gateway, topic_name, tmp_path):
    source, target = topic_name, f"{topic_name}-by-user"
    feed.produce(gateway.bootstrap, source, 240, users=11, partitions=3)
    create_topic(gateway, target, 4)
    # Transactions in the source: a committed one (its COMMIT marker leaves an
    # offset gap) and an aborted one, which must not be resharded.
    txn = f"feeder-{uuid.uuid4().hex[:8]}"
    produce(gateway.bootstrap, source, events(1000, 10), partition=1, transactional_id=txn)
    produce(gateway.bootstrap, source, events(2000, 10), partition=1, transactional_id=txn,
            abort=True)
    args = job_args(gateway, source, target, tmp_path / "ckpt", "--once")
    group = f"reshard-{source}-{target}"
    outcomes: list[list[dict]] = []
    reshard.start(spark, args, lambda _id, batch: outcomes.append(batch)).awaitTermination()
    written = assert_resharded(gateway.bootstrap, source, target, group)
    assert len(written) == 250
    assert {o["status"] for batch in outcomes for o in batch} == {"committed"}
    assert {o["transactional_id"] for batch in outcomes for o in batch} == {
        f"{group}-{source}-{p}" for p in range(3)}
    assert sorted(json.loads(r.value)["seq"] for r in written) == [
        *range(240), *range(1000, 1010)]

    # More data, the same checkpoint: only the new records.
    feed.produce(gateway.bootstrap, source, 60, first_seq=240, users=11)
    reshard.start(spark, args).awaitTermination()
    assert len(assert_resharded(gateway.bootstrap, source, target, group)) == 310

    # The checkpoint lost: a new query starts from the group's offsets
    # (--starting-offsets group, the default), so nothing is written twice.
    fresh = job_args(gateway, source, target, tmp_path / "other-ckpt", "--once")
    feed.produce(gateway.bootstrap, source, 30, first_seq=300, users=11)
    reshard.start(spark, fresh).awaitTermination()
    assert len(assert_resharded(gateway.bootstrap, source, target, group)) == 340


def test_crash_before_spark_records_the_batch(spark, gateway, topic_name, tmp_path):
    """The batch's transactions commit, then the driver fails before Spark
    writes the batch to its commit log: the rerun replays the batch, every task
    finds its offsets in the group and skips, and nothing is duplicated."""
    source, target = topic_name, f"{topic_name}-by-user"
    feed.produce(gateway.bootstrap, source, 90, users=5, partitions=3)
    create_topic(gateway, target, 2)
    args = job_args(gateway, source, target, tmp_path / "ckpt", "--once",
                    "--max-offsets-per-trigger", "45")
    seen: list[tuple[int, list[dict]]] = []

    def crash_after_first(batch_id: int, batch: list[dict]) -> None:
        seen.append((batch_id, batch))
        if len(seen) == 1:
            raise RuntimeError("driver crash after the batch's transactions committed")

    with pytest.raises(StreamingQueryException, match="driver crash"):
        reshard.start(spark, args, crash_after_first).awaitTermination()
    [(crashed_id, crashed)] = seen
    assert {o["status"] for o in crashed} == {"committed"}
    assert len(read_topic(gateway.bootstrap, target)) == 45

    replays: list[tuple[int, list[dict]]] = []
    reshard.start(spark, args, lambda i, b: replays.append((i, b))).awaitTermination()
    replayed_id, replayed = replays[0]
    assert replayed_id == crashed_id
    assert {o["status"] for o in replayed} == {"skipped"}
    assert sorted((o["partition"], o["start"]) for o in replayed) == sorted(
        (o["partition"], o["start"]) for o in crashed)
    assert {o["status"] for _, b in replays[1:] for o in b} == {"committed"}
    assert len(assert_resharded(gateway.bootstrap, source, target,
                                f"reshard-{source}-{target}")) == 90


@pytest.mark.parametrize("stage", ["produced", "offsets-sent"])
@pytest.mark.parametrize("same_id", [True, False],
                         ids=["same-transactional-id", "other-transactional-id"])
def test_zombie_task_exactly_one_lands(spark, gateway, topic_name, same_id, stage):
    """Two producers write the same batch of a source partition; the zombie
    pauses (after producing, or after sending its offsets) until the other has
    committed. Both passed the group check, so only the gateway can stop the
    zombie: by fencing (same transactional id: the other's InitProducerId) or
    by the offset-range check (another id: its TxnOffsetCommit or EndTxn finds
    the range committed since its transaction began)."""
    source, target = topic_name, f"{topic_name}-by-user"
    feed.produce(gateway.bootstrap, source, 30, users=4, partitions=1)
    create_topic(gateway, target, 2)
    rows = sorted(reshard.source_rows(
        kafka_reader(spark.read, gateway.bootstrap, source, "earliest").load()).collect(),
        key=lambda r: r.offset)
    group = f"zombie-{source}"
    live = reshard.Writer(gateway.bootstrap, target, group, "reshard-live", timeout=30)
    zombie = reshard.Writer(gateway.bootstrap, target, group,
                            "reshard-live" if same_id else "reshard-other", timeout=30)
    paused, resume = threading.Event(), threading.Event()
    result: dict = {}

    def pause(at: str) -> None:
        if at == stage:
            paused.set()
            assert resume.wait(60)

    def run_zombie() -> None:
        try:
            result["outcome"] = reshard.write_partition(zombie, rows, pause)
        except BaseException as exc:  # reported by the test thread
            result["error"] = exc

    thread = threading.Thread(target=run_zombie)
    thread.start()
    assert paused.wait(60), result
    try:
        landed = reshard.write_partition(live, rows)
    finally:
        resume.set()
        thread.join(90)
    assert "error" not in result, result["error"]
    assert landed["status"] == "committed"
    outcome = result["outcome"]
    assert outcome["status"] == "lost", outcome
    stopped_by = "FENCED" if same_id else (
        "ILLEGAL_GENERATION" if stage == "produced" else "UNKNOWN_PRODUCER_ID")
    assert stopped_by in outcome["detail"], outcome
    assert len(assert_resharded(gateway.bootstrap, source, target, group)) == 30
    assert committed(gateway.bootstrap, group, source, 1) == {0: 30}


def test_driver_sigkill_mid_stream_then_restart(spark, gateway, topic_name, tmp_path):
    """`python -m spark_jobs reshard` in its own process, small micro-batches;
    the driver (Python and its JVM, the whole process group) is SIGKILLed once
    two batches are written, more data arrives, and the job restarts from its
    checkpoint with --once (in this process's Spark, to spare a JVM start):
    the target holds the source exactly once."""
    source, target = topic_name, f"{topic_name}-by-user"
    feed.produce(gateway.bootstrap, source, 450, users=9, partitions=3)
    create_topic(gateway, target, 3)
    conf = [arg for key, value in TEST_CONF.items() for arg in ("--conf", f"{key}={value}")]
    command = [sys.executable, "-m", "spark_jobs", "reshard", "--bootstrap-servers",
               gateway.bootstrap, "--source", source, "--target", target, "--checkpoint",
               str(tmp_path / "ckpt"), "--max-offsets-per-trigger", "45",
               "--master", "local[2]", *conf]
    log = tmp_path / "driver.log"
    with open(log, "w") as out:
        driver = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while log.read_text().count(" written: ") < 2:
            assert driver.poll() is None, log.read_text()[-5000:]
            assert time.monotonic() < deadline, log.read_text()[-5000:]
            time.sleep(0.2)
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(30)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(30)
    before = len(read_topic(gateway.bootstrap, target))
    assert before > 0, before  # the batches logged as written before the kill

    feed.produce(gateway.bootstrap, source, 90, first_seq=450, users=9)
    outcomes: list[dict] = []
    # No cap now: a batch logged before the kill is replayed with its logged
    # range, then the rest comes in one batch.
    restart = job_args(gateway, source, target, tmp_path / "ckpt", "--once")
    reshard.start(spark, restart, lambda _id, batch: outcomes.extend(batch)).awaitTermination()
    statuses = [o["status"] for o in outcomes]
    print(f"\nSIGKILL after {before} records; the restart: {statuses.count('skipped')} "
          f"partition-batches skipped, {statuses.count('committed')} committed")
    assert set(statuses) <= {"skipped", "committed"}
    assert len(assert_resharded(gateway.bootstrap, source, target,
                                f"reshard-{source}-{target}")) == 540
