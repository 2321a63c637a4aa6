"""/metrics of important consumers (a topic's gateway.important.consumer.groups).

Per important group and partition: its lag in records (live), the bytes and
age of what it holds back from retention (as the last retention pass saw
them), and how often and by how many records retention passed it under
gateway.important.consumer.max.bytes. A long-idle important consumer fills
the disk: docs/monitoring/alerts.yml watches these. Every listed group has
every series (counters from 0), so alerts see a group before it lags.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tablets.seam import NodeStorage

PREFIX = "kafka_gateway_important_group_"
LABELS = ["group", "topic", "partition"]


def important_families(engine: NodeStorage) -> Iterator[Metric]:
    lag = GaugeMetricFamily(
        PREFIX + "lag", "Records an important group has not committed (from its committed "
        "offset, or the log start where it never committed, to the high watermark)",
        labels=LABELS)
    held_bytes = GaugeMetricFamily(
        PREFIX + "held_bytes", "Bytes retention would have deleted but keeps for this "
        "important group (at the last retention pass)", labels=LABELS)
    held_age = GaugeMetricFamily(
        PREFIX + "held_age_seconds", "Age of the oldest record kept past retention for this "
        "important group (0: it holds nothing back)", labels=LABELS)
    passes = CounterMetricFamily(
        PREFIX + "retention_passes", "Retention passes that deleted records this important "
        "group had not committed (gateway.important.consumer.max.bytes)", labels=LABELS)
    passed = CounterMetricFamily(
        PREFIX + "records_deleted_unread", "Records retention deleted before this important "
        "group committed them (gateway.important.consumer.max.bytes)", labels=LABELS)
    for row in engine.important_groups():
        values = [row.group, row.topic, str(row.partition)]
        lag.add_metric(values, row.lag)
        held_bytes.add_metric(values, row.held_bytes)
        held_age.add_metric(values, row.held_age_ms / 1000)
        passes.add_metric(values, row.passed)
        passed.add_metric(values, row.records_passed)
    yield from (lag, held_bytes, held_age, passes, passed)
