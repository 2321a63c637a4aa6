"""The exactly-once resharding check (compat_tests/reshard_chaos.py) with
confluent-kafka workers and with Java-client workers: workers SIGKILLed, hung past their session
timeout and resumed (zombies), the gateway killed with ``kill -9`` - and
afterwards every source record is in the target exactly once, in order, and
the group's committed offsets are at the source's ends.

On a cluster of three gateways (``KAFKA_GATEWAY_TEST_STORE=postgresql-cluster``,
the cluster step of tests/run_all.sh) the faults are ``CLUSTER_PLAN``:
three times ``kill -9`` of one gateway while the workers carry on through
the other two (its partitions and coordinators taken by them, checked) and
the gateway started again, plus a worker killed, a worker hung and all
three gateways killed and restarted (docs/cluster.md).
"""

from __future__ import annotations

import pytest
from reshard_chaos import java_worker, python_worker, run

CLUSTER_PLAN = ("gateway", "kill", "gateway", "hang", "restart", "gateway")


def plan_for(gateway):
    """``CLUSTER_PLAN`` on a cluster; faults drawn at random on one gateway."""
    return CLUSTER_PLAN if gateway.siblings else None


def check(report, gateway) -> None:
    plan = plan_for(gateway)
    assert report.kills + report.hangs + report.restarts + report.gateway_kills == 6
    assert report.gateway_kills == (plan.count("gateway") if plan else 0), report.events
    assert (report.lost, report.duplicated, report.reordered) == (0, 0, 0), report.line()
    assert report.misrouted == 0
    assert report.offsets_wrong == 0, report.committed


def deadline(gateway) -> float:
    """The bound on the whole run: each one-gateway kill adds its failover."""
    plan = plan_for(gateway)
    return 150.0 + 60.0 * (plan.count("gateway") if plan else 0)


@pytest.mark.timeout(600)  # above deadline(): a stalled run fails with its diagnosis
def test_reshard_exactly_once_under_chaos(gateway, tmp_path):
    report = run(gateway, python_worker, rounds=6, messages=3000, seed=20261123,
                 log_dir=tmp_path, plan=plan_for(gateway), deadline_s=deadline(gateway))
    print("\nreshard (confluent-kafka workers):", report.line(), report.events)
    check(report, gateway)


@pytest.mark.timeout(600)
def test_reshard_exactly_once_under_chaos_with_java_workers(gateway, tmp_path):
    """The same check with Java-client 3.4.1 workers (jvm/src/javatxn/ReshardWorker.java):
    KafkaConsumer (read_committed) and a transactional KafkaProducer per worker,
    sendOffsetsToTransaction with the consumer's groupMetadata()."""
    report = run(gateway, java_worker, rounds=6, messages=3000, seed=20261124,
                 log_dir=tmp_path, plan=plan_for(gateway), deadline_s=deadline(gateway))
    print("\nreshard (Java workers):", report.line(), report.events)
    check(report, gateway)
