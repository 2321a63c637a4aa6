"""Consumer groups with kafkajs (2.2): two members share partitions, commit
as they process, one leaves and the other takes over from the committed
offsets; the admin lists, describes, fetches offsets of and deletes the group.
The scenario runs in compat_tests/js/group.js (the kafkajs helper's package)."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from compat_helpers import create_topic
from confluent_kafka import Producer
from group_helpers import committed_offsets, group_gateway

JS = Path(__file__).with_name("js")
NODE = shutil.which("node")


@pytest.fixture(scope="module")
def kafkajs() -> Path:
    """The kafkajs package of compat_tests/js (tests/run_all.sh runs ``npm ci``)."""
    assert NODE, "Node.js is not installed (Debian: apt-get install -y nodejs npm)"
    assert (JS / "node_modules" / "kafkajs").is_dir(), (
        f"kafkajs is not installed in {JS}: run `cd compat_tests/js && npm ci` first")
    return JS


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with group_gateway(tmp_path_factory.mktemp("groups-kafkajs") / "data") as gw:
        yield gw


def test_kafkajs_group_shares_partitions_and_takes_over(gateway, topic_name, kafkajs):
    partitions, count, later = 4, 40, 20
    create_topic(gateway, topic_name, partitions=partitions)
    producer = Producer({"bootstrap.servers": gateway.bootstrap})
    for i in range(count):
        producer.produce(topic_name, f"v{i}".encode(), partition=i % partitions)
    assert producer.flush(30) == 0
    group = f"g-{uuid.uuid4().hex[:10]}"
    try:
        done = subprocess.run(
            [NODE, str(kafkajs / "group.js"), gateway.bootstrap, topic_name, group,
             str(partitions), str(count), str(later)],
            capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"group.js hung; stderr:\n{exc.stderr}\n"
                             f"gateway log tail:\n{gateway.output()[-3000:]}") from None
    assert done.returncode == 0, f"group.js failed:\n{done.stderr[-5000:]}"
    result = json.loads(done.stdout)

    # Both members held partitions of the same generation, without overlap.
    shared = result["shared"]
    held = {name: {(t, p) for t, ps in join["memberAssignment"].items() for p in ps}
            for name, join in shared.items()}
    assert held["a"] and held["b"] and not held["a"] & held["b"]
    assert held["a"] | held["b"] == {(topic_name, p) for p in range(partitions)}
    assert shared["a"]["groupProtocol"] == "RoundRobinAssigner"
    assert {g["groupId"] for g in result["listed"]} >= {group}
    (described,) = result["described"]
    assert described["state"] == "Stable"
    assert sorted(m["clientId"] for m in described["members"]) == ["kafkajs-a", "kafkajs-b"]

    # After b left, a held everything and read the later records, once each.
    takeover = result["takeover"]
    assert sum(len(ps) for ps in takeover["memberAssignment"].values()) == partitions
    values = [m["value"] for member in result["received"].values() for m in member]
    assert sorted(set(values)) == sorted([f"v{i}" for i in range(count)] +
                                         [f"later-{i}" for i in range(later)])
    later_seen = [m["value"] for m in result["received"]["a"] if m["value"].startswith("later-")]
    assert sorted(later_seen) == sorted(f"later-{i}" for i in range(later))

    assert sum(p["offset"] for p in result["committed"]) == count + later
    assert result["afterDelete"] == [-1] * partitions
    assert committed_offsets(gateway, group) == {}
