"""The admin/metrics side over HTTP (aiohttp).

- ``GET /health``   200 while the store accepts writes, 503 after a storage failure
- ``GET /metrics``  Prometheus text: requests and latency per API, bytes in and
  out, connections, store writes and fsyncs, per-partition watermarks, and
  consumer lag per group and partition (high watermark - committed offset),
  the log cleaner's work and each compacted partition's cleanable bytes and lag
- ``GET /topics``   topics, partitions and watermarks as JSON
"""

from __future__ import annotations

from aiohttp import web

from .broker import Broker
from .compaction_metrics import compaction_metrics
from .metrics import label


class AdminHttp:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.app = web.Application()
        self.app.add_routes([
            web.get("/health", self.health),
            web.get("/metrics", self.metrics),
            web.get("/topics", self.topics),
        ])
        self._runner: web.AppRunner | None = None
        self.address = ""

    async def start(self, host: str, port: int) -> None:
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        sockets = site._server.sockets  # type: ignore[union-attr]
        self.address = "{}:{}".format(*sockets[0].getsockname()[:2])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def health(self, _request: web.Request) -> web.Response:
        writer = self.broker.engine.writer
        if writer is not None and writer.failed is not None:
            return web.json_response({"status": "failed", "error": str(writer.failed)}, status=503)
        return web.json_response({"status": "ok"})

    async def metrics(self, _request: web.Request) -> web.Response:
        stats = self.broker.engine.store.stats
        extra: dict[str, float] = {
            "store_writes_total": stats.writes,
            "store_changes_total": stats.changes,
            "store_fsyncs_total": stats.fsyncs,
            "store_written_bytes_total": stats.bytes,
            "store_write_seconds_total": stats.write_seconds,
            "topics": len(self.broker.engine.topics),
        }
        if self.broker.groups is not None:
            extra["group_rebalances_total"] = self.broker.groups.rebalances
        if self.broker.txns is not None:
            extra.update(self._transactions())
        compaction, compaction_lines = compaction_metrics(self.broker.engine)
        extra.update(compaction)
        lines = [self.broker.metrics.render(extra), *compaction_lines]
        for topic in self.broker.engine.topics.values():
            for tablet in topic.partitions:
                labels = f'topic="{label(topic.name)}",partition="{tablet.partition}"'
                lines.append(f"kafka_gateway_high_watermark{{{labels}}} {tablet.high_watermark}\n")
                lines.append(f"kafka_gateway_log_start_offset{{{labels}}} "
                             f"{tablet.log_start_offset}\n")
                lines.append(f"kafka_gateway_partition_bytes{{{labels}}} {tablet.size_bytes}\n")
        lines.extend(self._consumer_lag())
        return web.Response(text="".join(lines), content_type="text/plain")

    def _transactions(self) -> dict[str, float]:
        txns = self.broker.txns
        assert txns is not None
        stats = txns.stats
        kept, evicted = self.broker.engine.producer_stats()
        return {
            "txn_commits_total": stats.commits,
            "txn_aborts_total": stats.aborts,
            "txn_timeouts_total": stats.timeouts,
            "txn_conflicts_total": stats.conflicts,
            "txn_fenced_total": stats.fenced,
            "txn_stale_end_txn_total": stats.stale_end_txn,
            "txn_open": txns.open_count,
            "txn_pending_bytes": txns.pending_bytes,
            "producer_ids": kept,
            "producer_ids_evicted_total": evicted,
        }

    def _consumer_lag(self) -> list[str]:
        """Per group and partition: high watermark minus the committed offset."""
        offsets = self.broker.engine.consumer_offsets
        if offsets is None:
            return []
        lines = []
        for group in offsets.groups():
            for (topic, partition), committed in offsets.group_offsets(group).items():
                if not self.broker.engine.has_partition(topic, partition):
                    continue
                tablet = self.broker.engine.partition(topic, partition)
                lag = max(tablet.high_watermark - max(committed.offset, tablet.log_start_offset), 0)
                lines.append(f'kafka_gateway_consumer_lag{{group="{label(group)}",'
                             f'topic="{label(topic)}",partition="{partition}"}} {lag}\n')
        return lines

    async def topics(self, _request: web.Request) -> web.Response:
        return web.json_response({
            topic.name: {
                "id": str(topic.topic_id),
                "configs": topic.configs,
                "partitions": [
                    {"partition": t.partition, "log_start_offset": t.log_start_offset,
                     "high_watermark": t.high_watermark, "bytes": t.size_bytes}
                    for t in topic.partitions
                ],
            }
            for topic in self.broker.engine.topics.values()
        })
