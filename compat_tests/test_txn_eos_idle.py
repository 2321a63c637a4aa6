"""Issue 18: after a rebalance, a transaction that carries an idle partition is
not refused for ever (docs/transactions.md, "The offset-range check").

Kafka's own EOS v2 pattern (``ExactlyOnceMessageProcessor``: one
transactional id per instance, the position of every assigned partition with
``groupMetadata()`` in every transaction) with the Java client 3.4.1 and with
confluent-kafka, each run against the gateway AND Apache Kafka 3.4.1: two
instances, a rebalance when the second joins and one when it leaves, each
leaving partitions idle whose offsets the other instance's transactional id
committed (compat_tests/eos_helpers.py). On both servers every record reaches
the read_committed target exactly once, and aborts stay few (before the fix
the gateway refused every transaction of such an instance: it aborted ~2 a
second and its records never arrived).

The same with ``enable.auto.commit`` left on in the EOS loop: the consumer's
own plain commits land while its transactions are open. Kafka lets both
land; the gateway too (a member's own commit is not a rival's), so no
transaction is aborted for it and no record is lost.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from eos_helpers import assert_exactly_once, names, run_scenario
from group_helpers import group_gateway
from java_helpers import JavaProcess, LinesProcess

from testkit import prom

WORKER = Path(__file__).with_name("eos_worker.py")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with group_gateway(tmp_path_factory.mktemp("eos-idle") / "data",
                       "--admin-listen", "127.0.0.1:0") as gw:
        yield gw


def offset_commits(gateway) -> float:
    """Plain OffsetCommit requests the gateway served so far."""
    return prom.value(gateway.metrics(), "kafka_gateway_requests_total", api="offset_commit")


def java_instances(classes, server, topics: dict[str, str], *extra: str):
    def start(name: str) -> LinesProcess:
        return JavaProcess(server, classes, "javatxn.EosProcessor", "run",
                           "--group", topics["group"], "--txn-id", f"{topics['txn']}-{name}",
                           "--source", topics["source"], "--target", topics["target"], *extra)
    return start


def confluent_instances(server, topics: dict[str, str], *extra: str):
    def start(name: str) -> LinesProcess:
        return LinesProcess(server, f"eos_worker {name}", [
            sys.executable, str(WORKER), server.bootstrap, topics["group"],
            f"{topics['txn']}-{name}", topics["source"], topics["target"], *extra])
    return start


def on_both(gateway, kafka_broker, instances) -> dict:
    """The scenario on each server (fresh names each); the outcomes."""
    outcomes = {}
    for server_name, server in (("gateway", gateway), ("kafka", kafka_broker)):
        topics = names()
        outcomes[server_name] = run_scenario(server.bootstrap, instances(server, topics), topics)
    return outcomes


def assert_same_outcome(outcomes: dict) -> None:
    figures = {name: outcome.figures for name, outcome in outcomes.items()}
    print(figures)  # the measured figures, with -s
    for name, outcome in outcomes.items():
        assert_exactly_once(outcome, f"{name} ({figures})")


@pytest.mark.timeout(600)  # both servers; a stalled phase waits COMMIT_WAIT_S
def test_java_eos_example_survives_rebalances_that_leave_partitions_idle(
        gateway, kafka_broker, java_classes):
    before = offset_commits(gateway)
    outcomes = on_both(gateway, kafka_broker,
                       lambda server, topics: java_instances(java_classes, server, topics))
    assert offset_commits(gateway) == before  # the loop commits through its transactions only
    assert_same_outcome(outcomes)


@pytest.mark.timeout(600)
def test_confluent_eos_loop_survives_rebalances_that_leave_partitions_idle(
        gateway, kafka_broker):
    before = offset_commits(gateway)
    outcomes = on_both(gateway, kafka_broker, confluent_instances)
    assert offset_commits(gateway) == before
    assert_same_outcome(outcomes)


@pytest.mark.timeout(600)
def test_confluent_eos_loop_with_auto_commit_left_on_loses_nothing(gateway, kafka_broker):
    """librdkafka auto-commits the offsets of the records it handed out (the
    end of the batch the open transaction is processing): were that commit
    taken for a rival's, the transaction would abort and the rewind would
    skip its records."""
    before = offset_commits(gateway)
    outcomes = on_both(gateway, kafka_broker,
                       lambda server, topics: confluent_instances(server, topics,
                                                                  "--auto-commit"))
    auto_commits = offset_commits(gateway) - before
    assert auto_commits >= 5, f"the consumers auto-committed only {auto_commits} times"
    assert_same_outcome(outcomes)


@pytest.mark.timeout(600)
def test_java_eos_example_with_auto_commit_left_on_loses_nothing(
        gateway, kafka_broker, java_classes):
    before = offset_commits(gateway)
    outcomes = on_both(gateway, kafka_broker,
                       lambda server, topics: java_instances(java_classes, server, topics,
                                                             "--auto-commit", "true"))
    auto_commits = offset_commits(gateway) - before
    assert auto_commits >= 5, f"the consumers auto-committed only {auto_commits} times"
    assert_same_outcome(outcomes)
