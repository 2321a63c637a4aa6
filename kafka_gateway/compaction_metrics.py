"""The log cleaner's metrics, for /metrics: node-wide totals, and per
compacted partition what is cleanable now and how far compaction has got."""

from __future__ import annotations

from tablets import StorageEngine
from tablets.tablet import now_ms

from .metrics import label


def compaction_metrics(engine: StorageEngine) -> tuple[dict[str, float], list[str]]:
    """(totals, per-partition lines) in Prometheus text format."""
    stats = engine.cleaner.stats
    now = now_ms()
    lines: list[str] = []
    uncleanable = 0
    for topic in engine.topics.values():
        for tablet in topic.partitions:
            if tablet.cleanable(now) is None:
                continue
            status = tablet.compaction
            uncleanable += status.failure is not None
            lag = now - status.dirty_since_ms if status.dirty_since_ms > 0 else 0
            labels = f'topic="{label(topic.name)}",partition="{tablet.partition}"'
            lines += [
                f"kafka_gateway_compaction_cleanable_bytes{{{labels}}} {status.cleanable_bytes}\n",
                f"kafka_gateway_compaction_dirty_ratio{{{labels}}} {status.dirty_ratio}\n",
                f"kafka_gateway_compaction_lag_ms{{{labels}}} {max(lag, 0)}\n",
                f"kafka_gateway_compaction_clean_offset{{{labels}}} {tablet.clean_end}\n",
                f"kafka_gateway_compaction_partition_runs_total{{{labels}}} {status.runs}\n",
                f"kafka_gateway_compaction_partition_bytes_reclaimed_total{{{labels}}} "
                f"{status.bytes_reclaimed}\n",
            ]
    totals = {
        "compaction_runs_total": stats.runs,
        "compaction_chunks_total": stats.chunks,
        "compaction_bytes_read_total": stats.bytes_read,
        "compaction_bytes_reclaimed_total": stats.bytes_reclaimed,
        "compaction_seconds_total": stats.seconds,
        "compaction_failures_total": stats.failures,
        "compaction_running": int(stats.running),
        "compaction_uncleanable_partitions": uncleanable,
    }
    return totals, lines
