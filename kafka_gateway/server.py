"""The gateway process: storage engine, Kafka listeners, admin HTTP, retention."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import ipaddress
import logging
import signal

from pgstore.cluster import ClusterSettings
from pgstore.consumer_offsets import PgConsumerOffsets
from pgstore.membership import Listener as NodeListener
from pgstore.node import PgNodeSettings, PgNodeStorage
from pgstore.node_records import PgNodeRecords
from tablets import CleanerSettings, EngineSettings, StorageEngine
from txn import TransactionCoordinator, TxnSettings
from txn.remote_produce import RemoteTransactions

from .acceptor import Acceptor, listening_sockets
from .admin_http import AdminHttp
from .connection import KafkaConnection
from .connection import log as connection_log
from .connection_limits import ConnectionLimits
from .context import HandlerContext
from .groups import GroupCoordinator, GroupOffsets
from .metrics import Metrics
from .quotas import ConnectionQuotas
from .security.authorizer import Authorizer, parse_super_users
from .security.listeners import Listener
from .security.sasl import enabled_mechanisms
from .security.scram import Credentials
from .security.tls import HandshakeWatch, server_context
from .settings import GatewayConfig

log = logging.getLogger(__name__)


def is_loopback(host: str) -> bool:
    """Does ``host`` (an address or name) only reach this machine?"""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False

SHUTDOWN_GRACE_SECONDS = 10.0


def open_engine(config: GatewayConfig) -> StorageEngine | PgNodeStorage:
    """The storage engine ``--store`` picks: PostgreSQL by URL, else RocksDB in
    ``--data-dir`` (the default)."""
    cleaner = CleanerSettings(config.cleaner_enable, config.cleaner_backoff_ms,
                              config.cleaner_dedupe_buffer_size,
                              config.cleaner_io_max_bytes_per_second,
                              config.cleaner_io_buffer_size)
    if config.store:
        return PgNodeStorage(
            config.store,
            PgNodeSettings(tail_cache_bytes=config.tail_cache_bytes,
                           topic_defaults=config.topic_defaults(),
                           producer_id_expiration_ms=config.producer_id_expiration_ms,
                           max_producers_per_partition=config.max_producers_per_partition,
                           cluster=ClusterSettings(
                               node_id=config.node_id,
                               lease_seconds=config.broker_session_timeout_ms / 1000),
                           cleaner=cleaner),
            offsets=PgConsumerOffsets, records=PgNodeRecords,
        )
    return StorageEngine(
        config.data_dir,
        EngineSettings(
            fsync=config.fsync,  # type: ignore[arg-type]
            tail_cache_bytes=config.tail_cache_bytes,
            topic_defaults=config.topic_defaults(),
            producer_id_expiration_ms=config.producer_id_expiration_ms,
            max_producers_per_partition=config.max_producers_per_partition,
            cleaner=cleaner,
        ),
    )


class GatewayServer:
    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.engine = open_engine(config)
        self.metrics = Metrics()
        # The handlers' context, complete once the engine has loaded (start()).
        self._context: HandlerContext | None = None
        self.connections: set[KafkaConnection] = set()
        self.limits = ConnectionLimits.from_config(config, self.metrics, connection_log)
        self.quotas = ConnectionQuotas.from_config(config, self.metrics,
                                                   self.limits.bad_input)
        self._acceptors: list[Acceptor] = []
        self.listeners: list[Listener] = config.listener_list()  # bound ports once started
        self._retention: asyncio.Task[None] | None = None
        self._txn_expiry: asyncio.Task[None] | None = None
        self._admin: AdminHttp | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        if isinstance(self.engine, PgNodeStorage):
            await self.engine.start()
        else:
            self.engine.start(loop)
        groups = GroupCoordinator(self.config, self.engine.consumer_offsets)
        cluster = self.engine.cluster()
        if cluster is not None:  # groups whose coordinator slot moves away are dropped
            cluster.watch_coordination(groups.drop_groups)
            groups.coordinates = cluster.coordinates
        txns = TransactionCoordinator(
            self.engine,
            TxnSettings(self.config.transaction_max_timeout_ms,
                        self.config.transactional_id_expiration_ms,
                        self.config.txn_pending_memory_bytes,
                        self.config.txn_pending_disk_bytes, self.config.txn_max_bytes),
            newest_connection=lambda: self.broker.newest_connection)
        if cluster is not None:  # transactional ids follow their coordinator slots
            txns.in_cluster(cluster.coordinates)
            cluster.watch_coordination(txns.drop, txns.load_gained)
            txns.reload = cluster.reload_coordinated  # after a write in doubt
        if cluster is not None and isinstance(self.engine, PgNodeStorage):
            # Produce to a partition led here for a transaction coordinated
            # elsewhere, and this coordinator's part of such transactions.
            txns.remote = RemoteTransactions(self.engine.remote_transactions(),
                                             cluster.coordinates)
        group_offsets = GroupOffsets(self.config, groups, self.engine.consumer_offsets,
                                     pending=txns.pending_offsets)
        authorizer = Authorizer(
            self.engine.node_records("acl"),
            parse_super_users(self.config.super_users),
            self.config.allow_everyone_if_no_acl_found, self.metrics,
            self.limits.bad_input) if self.config.authorizer_class_name else None
        self._context = HandlerContext(
            self.config, self.engine, self.metrics, groups, group_offsets, txns,
            Credentials(self.engine.node_records("scram")),
            authorizer)
        txns.load()  # open transactions' pending offsets, before offset expiry starts
        group_offsets.start()
        self._txn_expiry = loop.create_task(self._txn_expiry_loop())
        for index, listener in enumerate(self.listeners):
            await self._listen(index, listener)
        if isinstance(self.engine, PgNodeStorage):
            # Advertised once bound (a port 0 is known only now).
            await self.engine.join_cluster([
                NodeListener(item.name, item.advertised_host, item.advertised_port,
                             item.protocol) for item in self.listeners])
        self._retention = loop.create_task(self._retention_loop())
        if self.config.admin_listen != "off":
            admin_host, _, admin_port = self.config.admin_listen.rpartition(":")
            self._admin = AdminHttp(self.broker)
            await self._admin.start(admin_host or "127.0.0.1", int(admin_port))
            if is_loopback(admin_host or "127.0.0.1"):
                log.info("admin HTTP on %s: loopback only", self._admin.address)
            else:
                log.warning("admin HTTP on %s is reachable from the network and has no "
                            "authentication: /metrics and /topics show topic and group names",
                            self._admin.address)

    async def _listen(self, index: int, listener: Listener) -> None:
        """Open one listener; a port 0 becomes the port bound (and advertised)."""
        context = None
        if listener.tls:
            watch = HandshakeWatch(listener, self.metrics, self.limits.bad_input)
            context = server_context(self.config, listener, watch)
        if listener.sasl:
            enabled_mechanisms(self.config, listener)  # refuse bad settings at start-up

        def connection() -> KafkaConnection:
            return KafkaConnection(self.broker, self.connections, self.limits,
                                   self.listeners[index])

        acceptor = Acceptor(listening_sockets(listener.host, listener.port), connection,
                            self.quotas, self.metrics, context,
                            self.config.ssl_handshake_timeout_ms / 1000)
        acceptor.start()
        self._acceptors.append(acceptor)
        if listener.port == 0:  # a port chosen at run time is also the advertised one
            bound = listener.bound(acceptor.port)
            self.listeners[index] = bound
            if self.config.listeners:
                config = dataclasses.replace(
                    self.config,
                    listeners=",".join(item.url() for item in self.listeners),
                    advertised_listeners=",".join(item.url(advertised=True)
                                                  for item in self.listeners))
            else:
                config = dataclasses.replace(self.config, listen=(bound.host, bound.port),
                                             advertise=bound.advertised)
            self.config = self.broker.config = config

    def store_description(self) -> str:
        if isinstance(self.engine, PgNodeStorage):
            return f"PostgreSQL store (schema {self.engine.settings.schema})"
        return f"data dir {self.config.data_dir}"

    @property
    def broker(self) -> HandlerContext:
        """The handlers' context (the server has started)."""
        assert self._context is not None, "the gateway has not started"
        return self._context

    def ready_line(self) -> str:
        first = self.listeners[0]
        admin = f", admin http {self._admin.address}" if self._admin else ""
        listeners = ",".join(f"{item.url()} ({item.protocol})" for item in self.listeners)
        return (
            f"kafka-gateway ready: listening on {first.host or '0.0.0.0'}:{first.port}, "
            f"advertised as {first.advertised_host}:{first.advertised_port}, listeners "
            f"{listeners}, node {self.config.node_id}, {self.store_description()}{admin}"
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
        interval = self.config.transaction_timeout_check_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                await self.broker.txns.expire()
            except Exception:
                log.exception("transaction expiry pass failed")

    async def stop(self) -> None:
        """Stop accepting, answer what was read, then close the store."""
        if self._context is not None:
            self._context.stopping = True
        for acceptor in self._acceptors:
            await acceptor.close()
        for topic in self.engine.list_topics():
            for tablet in topic.partitions:
                tablet.wake_waiters()
        if self._context is not None:
            self._context.groups.stop()  # answers waiting JoinGroup/SyncGroup
            self._context.group_offsets.stop()
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
        if isinstance(self.engine, PgNodeStorage):
            await self.engine.close()
        else:
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
    # What startup made (modules, kio's schemas, the loaded state) lives as long
    # as the process: out of the collector's way, so that a full collection,
    # which holds the event loop, scans only what requests made since (slicing.py).
    gc.freeze()
    print(server.ready_line(), flush=True)
    await stop.wait()
    log.info("signal received, stopping")
    await server.stop()
