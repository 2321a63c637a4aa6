"""/metrics as an operator uses it: the values after real traffic, and the example
alert rules and Grafana dashboard of docs/monitoring/ naming only metrics a live
gateway exports."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Consumer, Producer, TopicPartition

from testkit import prom
from testkit.cli import run_cli
from testkit.gateway import GatewayProcess

DOCS = Path(__file__).resolve().parent.parent / "docs" / "monitoring"
TIMEOUT = 30
_ADMIN = re.compile(r"admin http ([\d.]+:\d+)")
_METRIC = re.compile(r"\bkafka_gateway_[a-z0-9_]+\b")


@pytest.fixture(scope="module")
def traffic(tmp_path_factory):
    """A gateway that has served produce, fetch, a group, a transaction and an error."""
    data = tmp_path_factory.mktemp("monitoring") / "data"
    with GatewayProcess(data, "--admin-listen", "127.0.0.1:0",
                        "--group-initial-rebalance-delay-ms", "0") as gateway:
        admin = _ADMIN.search(gateway.output()).group(1)
        run_cli(gateway.bootstrap, "topics", "create", "orders", "--partitions", "2",
                "--config", "gateway.important.consumer.groups=billing,audit")
        producer = Producer({"bootstrap.servers": gateway.bootstrap})
        for i in range(20):
            producer.produce("orders", key=str(i).encode(), value=b"v" * 100, partition=i % 2)
        assert producer.flush(TIMEOUT) == 0

        consumer = Consumer({"bootstrap.servers": gateway.bootstrap, "group.id": "billing",
                             "auto.offset.reset": "earliest", "enable.auto.commit": False})
        consumer.assign([TopicPartition("orders", 0)])
        read = 0
        deadline = time.monotonic() + TIMEOUT
        while read < 10:
            assert time.monotonic() < deadline, "records not consumed"
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                read += 1
        consumer.commit(offsets=[TopicPartition("orders", 0, 4), TopicPartition("orders", 1, 0)],
                        asynchronous=False)
        consumer.close()

        txn = Producer({"bootstrap.servers": gateway.bootstrap, "transactional.id": "mon"})
        txn.init_transactions(TIMEOUT)
        txn.begin_transaction()
        txn.produce("orders", value=b"t", partition=0)
        txn.commit_transaction(TIMEOUT)

        missing = run_cli(gateway.bootstrap, "topics", "describe", "no-such-topic", check=False)
        assert "UNKNOWN_TOPIC_OR_PARTITION" in missing.stderr
        # the event loop's lag is sampled every 250 ms: wait for a first sample
        deadline = time.monotonic() + TIMEOUT
        while prom.value(prom.samples(prom.scrape(admin)),
                         "kafka_gateway_event_loop_lag_seconds_count") < 1:
            assert time.monotonic() < deadline, "no event loop lag sample"
            time.sleep(0.1)
        yield prom.scrape(admin)


def test_metrics_after_traffic(traffic):
    values = prom.samples(traffic)  # the parser refuses a malformed page

    def value(name: str, **labels: str) -> float:
        return prom.value(values, name, **labels)

    stored = value("kafka_gateway_partition_bytes", topic="orders", partition="0") + \
        value("kafka_gateway_partition_bytes", topic="orders", partition="1")
    produced = value("kafka_gateway_topic_bytes_in_total", topic="orders")
    # what was stored is what was produced, plus the transaction's commit marker
    assert produced > 2000 and 0 < stored - produced <= 100
    # the consumer read partition 0 (10 records and more), not partition 1
    assert value("kafka_gateway_topic_bytes_out_total", topic="orders") >= \
        value("kafka_gateway_partition_bytes", topic="orders", partition="0") // 2
    assert value("kafka_gateway_high_watermark", topic="orders", partition="0") == 12  # 10 + txn
    assert value("kafka_gateway_consumer_lag", group="billing", topic="orders",
                 partition="0") == 8
    assert value("kafka_gateway_consumer_lag", group="billing", topic="orders",
                 partition="1") == 10
    assert value("kafka_gateway_groups", state="Empty") >= 1
    assert value("kafka_gateway_response_errors_total", api="metadata",
                 error="UNKNOWN_TOPIC_OR_PARTITION") >= 1
    assert value("kafka_gateway_requests_total", api="produce") >= 1
    assert value("kafka_gateway_requests_total", api="delete_groups") == 0  # present at 0
    assert value("kafka_gateway_request_seconds_count", api="produce") == \
        value("kafka_gateway_requests_total", api="produce")
    assert value("kafka_gateway_request_seconds_bucket", api="metadata", le="+Inf") == \
        value("kafka_gateway_requests_total", api="metadata")
    writes = value("kafka_gateway_store_writes_total")
    assert value("kafka_gateway_store_write_latency_seconds_count") == writes > 0
    assert value("kafka_gateway_store_group_commit_changes_sum") == \
        value("kafka_gateway_store_changes_total")
    assert value("kafka_gateway_store_group_commit_changes_bucket", le="+Inf") == writes
    assert value("kafka_gateway_store_failed") == 0
    assert value("kafka_gateway_event_loop_lag_seconds_count") >= 1
    assert value("kafka_gateway_txn_commits_total") == 1
    assert value("kafka_gateway_txn_conflicts_total") == 0
    # the one transaction committed: nothing of open transactions is stored or held
    assert value("kafka_gateway_txn_pending_stored_bytes") == 0
    assert value("kafka_gateway_txn_pending_memory_bytes") == 0
    for limit in ("transaction", "node"):
        assert value("kafka_gateway_txn_pending_limit_doomed_total", limit=limit) == 0
    assert value("kafka_gateway_producer_ids") >= 1
    # important consumers of orders: billing committed 4 on partition 0, audit nothing
    # (it holds from the log start); retention is a week, so nothing is held back yet
    important = "kafka_gateway_important_group_"
    assert value(important + "lag", group="billing", topic="orders", partition="0") == 8
    assert value(important + "lag", group="audit", topic="orders", partition="1") == 10
    for group in ("billing", "audit"):
        for partition in ("0", "1"):
            labels = {"group": group, "topic": "orders", "partition": partition}
            assert value(important + "held_bytes", **labels) == 0
            assert value(important + "held_age_seconds", **labels) == 0
            assert value(important + "retention_passes_total", **labels) == 0
            assert value(important + "records_deleted_unread_total", **labels) == 0


def _exprs_of_rules() -> list[str]:
    rules = yaml.safe_load((DOCS / "alerts.yml").read_text())
    exprs = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    alerts = {rule["alert"] for group in rules["groups"] for rule in group["rules"]}
    # what the issue asks an operator to be told of
    assert {"KafkaGatewaySimpleRequestsSlow", "KafkaGatewayConsumerLagGrowing",
            "KafkaGatewayStorageFailed", "KafkaGatewayEventLoopLag"} <= alerts
    return exprs


def _exprs_of_dashboard() -> list[str]:
    dashboard = json.loads((DOCS / "grafana-dashboard.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"]
             for target in panel.get("targets", [])]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"] if "query" in v]
    assert len(exprs) > 20
    return exprs


@pytest.mark.parametrize("source", ["alerts.yml", "grafana-dashboard.json"])
def test_monitoring_examples_name_only_live_metrics(traffic, source):
    exprs = _exprs_of_rules() if source == "alerts.yml" else _exprs_of_dashboard()
    live = {name for name, _labels in prom.samples(traffic)}
    named = {name for expr in exprs for name in _METRIC.findall(expr)}
    assert named and named <= live, sorted(named - live)
    for expr in exprs:
        assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), expr
