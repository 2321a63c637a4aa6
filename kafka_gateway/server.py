"""The gateway process: storage engine, Kafka listener, admin HTTP, retention."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal

from tablets import CleanerSettings, EngineSettings, StorageEngine
from txn import TransactionCoordinator, TxnSettings

from .admin_http import AdminHttp
from .broker import Broker
from .config import GatewayConfig
from .connection import KafkaConnection
from .connection import log as connection_log
from .groups import GroupCoordinator, GroupOffsets
from .limits import ConnectionLimits

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_SECONDS = 10.0


class GatewayServer:
    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.engine = StorageEngine(
            config.data_dir,
            EngineSettings(
                fsync=config.fsync,  # type: ignore[arg-type]
                tail_cache_bytes=config.tail_cache_bytes,
                topic_defaults=config.topic_defaults(),
                producer_id_expiration_ms=config.producer_id_expiration_ms,
                max_producers_per_partition=config.max_producers_per_partition,
                cleaner=CleanerSettings(config.cleaner_enable, config.cleaner_backoff_ms,
                                        config.cleaner_dedupe_buffer_size,
                                        config.cleaner_io_max_bytes_per_second,
                                        config.cleaner_io_buffer_size),
            ),
        )
        self.broker = Broker(config, self.engine)
        self.connections: set[KafkaConnection] = set()
        self.limits = ConnectionLimits.from_config(config, self.broker.metrics, connection_log)
        self._server: asyncio.Server | None = None
        self._retention: asyncio.Task[None] | None = None
        self._txn_expiry: asyncio.Task[None] | None = None
        self._admin: AdminHttp | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.engine.start(loop)
        assert self.engine.consumer_offsets is not None
        self.broker.groups = GroupCoordinator(self.config, self.engine.consumer_offsets)
        self.broker.group_offsets = GroupOffsets(self.config, self.broker.groups,
                                                 self.engine.consumer_offsets)
        self.broker.group_offsets.start()
        self.broker.txns = TransactionCoordinator(
            self.engine,
            TxnSettings(self.config.transaction_max_timeout_ms,
                        self.config.transactional_id_expiration_ms,
                        self.config.txn_pending_memory_bytes),
            newest_connection=lambda: self.broker.newest_connection)
        self.broker.txns.load()
        self._txn_expiry = loop.create_task(self._txn_expiry_loop())
        host, port = self.config.listen
        self._server = await loop.create_server(
            lambda: KafkaConnection(self.broker, self.connections, self.limits), host, port,
            reuse_address=True, backlog=1024,
        )
        bound_port = self._server.sockets[0].getsockname()[1]
        if port == 0:  # a port chosen at run time is also the advertised one
            listen = (host, bound_port)
            advertise = self.config.advertise or listen
            self.config = dataclasses.replace(self.config, listen=listen, advertise=advertise)
            self.broker.config = self.config
        self._retention = loop.create_task(self._retention_loop())
        if self.config.admin_listen != "off":
            admin_host, _, admin_port = self.config.admin_listen.rpartition(":")
            self._admin = AdminHttp(self.broker)
            await self._admin.start(admin_host or "127.0.0.1", int(admin_port))

    def ready_line(self) -> str:
        host, port = self.config.listen
        adv_host, adv_port = self.config.advertised
        admin = f", admin http {self._admin.address}" if self._admin else ""
        return (
            f"kafka-gateway ready: listening on {host}:{port}, advertised as "
            f"{adv_host}:{adv_port}, node {self.config.node_id}, data dir "
            f"{self.config.data_dir}{admin}"
        )

    async def _retention_loop(self) -> None:
        interval = self.config.retention_check_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                await self.engine.enforce_retention()
            except Exception:
                log.exception("retention pass failed")

    async def _txn_expiry_loop(self) -> None:
        assert self.broker.txns is not None
        interval = self.config.transaction_timeout_check_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                await self.broker.txns.expire()
            except Exception:
                log.exception("transaction expiry pass failed")

    async def stop(self) -> None:
        """Stop accepting, answer what was read, then close the store."""
        self.broker.stopping = True
        if self._server is not None:
            self._server.close()
        for topic in self.engine.topics.values():
            for tablet in topic.partitions:
                tablet.wake_waiters()
        if self.broker.groups is not None:
            self.broker.groups.stop()  # answers waiting JoinGroup/SyncGroup
        if self.broker.group_offsets is not None:
            self.broker.group_offsets.stop()
        if self.connections:
            await asyncio.wait(
                [asyncio.ensure_future(c.drain(SHUTDOWN_GRACE_SECONDS))
                 for c in list(self.connections)],
                timeout=SHUTDOWN_GRACE_SECONDS,
            )
        for task in (self._retention, self._txn_expiry):
            if task is not None:
                task.cancel()
        if self._admin is not None:
            await self._admin.stop()
        self.engine.close()
        log.info("stopped")


async def serve(config: GatewayConfig) -> None:
    """Run until SIGTERM or SIGINT, then stop cleanly."""
    server = GatewayServer(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    print(server.ready_line(), flush=True)
    await stop.wait()
    log.info("signal received, stopping")
    await server.stop()
