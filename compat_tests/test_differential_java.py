"""Differential: what the Java client (kafka-clients 3.4.1) sees, Apache Kafka 3.4.1 vs the gateway.

A small Java program (compat_tests/jvm/src/diff/DiffClient.java) runs one
scenario against one server and prints every value the client hands back as
JSON lines; it runs against both servers at once and the lines are compared
field by field:

- log: producing one record at a time and in batches with each codec (record
  metadata: partition, offset, timestamp, sizes), listOffsets (earliest,
  latest, max timestamp, by timestamp) at both isolation levels,
  beginningOffsets/endOffsets/offsetsForTimes, seek and poll inside batches,
  at the end, past it (OffsetOutOfRangeException), deleteRecords and reading
  after it, auto.offset.reset;
- admin: createTopics errors (names, replication factor, partitions, configs,
  a '.'/'_' collision), describeConfigs with synonyms of a default topic and
  of one with overrides, incrementalAlterConfigs errors, describeTopics,
  describeCluster, a record over max.message.bytes;
- group: a subscribed consumer reads and commits; describeConsumerGroups,
  listConsumerGroupOffsets, alter and delete offsets, deleteConsumerGroups.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from differences import EXPECTED

from testkit import jvm
from testkit.differential import Differ


def run_java(classes, bootstrap: str, scenario: str, prefix: str, t0: int) -> dict[str, list]:
    """The client's view, by step (a step may print several lines)."""
    done = subprocess.run(
        jvm.java_command("diff.DiffClient", bootstrap, scenario, prefix, str(t0),
                         classes=classes),
        capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"DiffClient {scenario} failed:\n{done.stdout[-3000:]}" \
                                 f"\n{done.stderr[-5000:]}"
    steps: dict[str, list] = {}
    for line in done.stdout.splitlines():
        if line.startswith('{"step":'):  # the rest is the client's log
            fields = json.loads(line)
            steps.setdefault(fields.pop("step"), []).append(fields)
    return steps


def compare_scenario(java_classes, kafka_broker, gateway, scenario: str) -> Differ:
    prefix = f"diff-java-{uuid.uuid4().hex[:8]}"
    t0 = (int(time.time()) - 60) * 1000  # a minute ago, the same for both runs
    with ThreadPoolExecutor(2) as pool:
        kafka, gw = pool.map(lambda server: run_java(java_classes, server.bootstrap, scenario,
                                                     prefix, t0), (kafka_broker, gateway))
    assert kafka, "the Java client printed nothing"
    differ = Differ(EXPECTED)
    for step in [*kafka, *(s for s in gw if s not in kafka)]:
        differ.compare(f"java-{scenario}/{step}:", kafka.get(step), gw.get(step))
    differ.verify()
    return differ


def test_java_client_log(java_classes, kafka_broker, gateway):
    compare_scenario(java_classes, kafka_broker, gateway, "log")


def test_java_client_admin(java_classes, kafka_broker, gateway):
    compare_scenario(java_classes, kafka_broker, gateway, "admin")


def test_java_client_group(java_classes, kafka_broker, gateway):
    compare_scenario(java_classes, kafka_broker, gateway, "group")
