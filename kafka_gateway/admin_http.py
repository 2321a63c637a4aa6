"""The admin/metrics side over HTTP (aiohttp).

- ``GET /health``   200 while the store accepts writes, 503 after a storage failure
- ``GET /metrics``  Prometheus text (prometheus.py): requests, errors and
  latency per API, bytes in and out per topic, connections, store writes and
  their latency, per-partition watermarks and sizes, consumer lag per group
  and partition, transactions, event-loop lag, the log cleaner's work and
  each compacted partition's cleanable bytes and lag
- ``GET /topics``   topics, partitions and watermarks as JSON
- ``GET /ui/``      a read-only web console (webui/)

While it runs, the event loop's lag is sampled (metrics.watch_event_loop).

It has no authentication: it listens on loopback unless ``--admin-listen``
names another address (the server then warns at start-up). Failed TLS
handshakes, SASL authentications and ACL checks are counted in /metrics
(``*_failures_total``).
"""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from .context import HandlerContext
from .prometheus import render
from .webui import add_console


class AdminHttp:
    def __init__(self, broker: HandlerContext) -> None:
        self.broker = broker
        self.app = web.Application()
        self.app.add_routes([
            web.get("/health", self.health),
            web.get("/metrics", self.metrics),
            web.get("/topics", self.topics),
        ])
        add_console(self.app, broker)
        self._runner: web.AppRunner | None = None
        self._loop_watch: asyncio.Task[None] | None = None
        self.address = ""

    async def start(self, host: str, port: int) -> None:
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        sockets = site._server.sockets  # type: ignore[union-attr]
        self.address = "{}:{}".format(*sockets[0].getsockname()[:2])
        self._loop_watch = asyncio.get_running_loop().create_task(
            self.broker.metrics.watch_event_loop())

    async def stop(self) -> None:
        if self._loop_watch is not None:
            self._loop_watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_watch
        if self._runner is not None:
            await self._runner.cleanup()

    async def health(self, _request: web.Request) -> web.Response:
        failed = self.broker.engine.store_failure()
        if failed is not None:
            return web.json_response({"status": "failed", "error": str(failed)}, status=503)
        return web.json_response({"status": "ok"})

    async def metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=render(self.broker),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

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
            for topic in self.broker.engine.list_topics()
        })
