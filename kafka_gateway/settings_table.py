"""The gateway's settings as tables: ``SETTINGS``, each setting's Kafka-style
property name, flag and help, and ``GatewayConfig``, their values with
Kafka's defaults (and what DescribeConfigs on the broker resource reports).

Reading them from a properties file and from flags, and refusing values
that cannot work, is ``settings.py``; callers import these names from
there, the settings' one public entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .security.listeners import Listener, parse_listeners


@dataclass(frozen=True, slots=True)
class Setting:
    prop: str  # Kafka-style property name
    attr: str  # GatewayConfig attribute
    kind: type
    help: str
    choices: tuple[str, ...] = ()

    @property
    def flag(self) -> str:
        return "--" + self.prop.replace(".", "-").removeprefix("gateway-")


SETTINGS: tuple[Setting, ...] = (
    Setting("auto.create.topics.enable", "auto_create_topics", bool,
            "create a topic when a client's Metadata request names it and allows it (as "
            "Kafka; Produce and Fetch never create one)"),
    Setting("num.partitions", "num_partitions", int, "partitions of auto-created topics"),
    Setting("log.retention.ms", "retention_ms", int,
            "default retention.ms of topics (-1: keep forever)"),
    Setting("log.retention.bytes", "retention_bytes", int,
            "default retention.bytes per partition (-1: no limit)"),
    Setting("log.retention.check.interval.ms", "retention_check_interval_ms", int,
            "how often retention runs"),
    Setting("message.max.bytes", "message_max_bytes", int,
            "default max.message.bytes of topics (largest batch accepted)"),
    Setting("fetch.max.bytes", "fetch_max_bytes", int,
            "most bytes of record batches in one Fetch answer, whatever the client asks "
            "(its first batch is still sent whole when larger)"),
    Setting("socket.request.max.bytes", "max_frame_bytes", int,
            "largest request frame; a larger one closes the connection"),
    Setting("queued.max.request.bytes", "queued_max_request_bytes", int,
            "memory for request frames being received or served, all connections together; "
            "reading pauses while it is spent (-1: no limit)"),
    Setting("connections.max.idle.ms", "connections_max_idle_ms", int,
            "close a connection with no request or response for this long (-1: never)"),
    Setting("gateway.partial.request.timeout.ms", "partial_request_timeout_ms", int,
            "close a connection whose half-received request gets no new byte for this long "
            "(-1: never)"),
    Setting("gateway.ssl.handshake.timeout.ms", "ssl_handshake_timeout_ms", int,
            "close a connection to a TLS listener whose TLS handshake has not finished this "
            "long after it was accepted"),
    Setting("max.connections", "max_connections", int,
            "client connections open at once, all listeners together; a new one past it is "
            "closed at once (the open ones stay)"),
    Setting("max.connections.per.ip", "max_connections_per_ip", int,
            "client connections open at once from one address; a new one past it is closed "
            "at once (the open ones stay)"),
    Setting("max.connections.per.ip.overrides", "max_connections_per_ip_overrides", str,
            "HOST_OR_IP:COUNT,... per-address exceptions to max.connections.per.ip"),
    Setting("gateway.request.max.array.items", "request_max_array_items", int,
            "most array items (topics, partitions, resources, ...) in one request body; "
            "a larger request closes the connection, as one over socket.request.max.bytes "
            "(-1: no limit)"),
    Setting("gateway.fsync", "fsync", str,
            "never: acked data is in the WAL (survives a process crash); "
            "always: fsync each group commit (survives power loss)",
            choices=("never", "always")),
    Setting("gateway.tail.cache.bytes", "tail_cache_bytes", int,
            "memory for the newest batches, shared evenly by the partitions read in the "
            "last minute (the others keep their newest batch only), "
            "served to consumers at the head without reading the store"),
    Setting("gateway.admin.listen", "admin_listen", str,
            "HOST:PORT of the HTTP admin/metrics endpoint, or 'off'"),
    Setting("group.initial.rebalance.delay.ms", "group_initial_rebalance_delay_ms", int,
            "how long a new (empty) group waits for more members before its first rebalance"),
    Setting("group.min.session.timeout.ms", "group_min_session_timeout_ms", int,
            "smallest session timeout a group member may ask for"),
    Setting("group.max.session.timeout.ms", "group_max_session_timeout_ms", int,
            "largest session timeout a group member may ask for"),
    Setting("offsets.retention.minutes", "offsets_retention_minutes", int,
            "committed offsets of a group without members are deleted this long after the "
            "group emptied (or, for assign()-only groups, after the commit)"),
    Setting("offsets.retention.check.interval.ms", "offsets_retention_check_interval_ms", int,
            "how often expired committed offsets are looked for"),
    Setting("offset.metadata.max.bytes", "offset_metadata_max_bytes", int,
            "largest metadata string an offset commit may carry"),
    Setting("transaction.max.timeout.ms", "transaction_max_timeout_ms", int,
            "largest transaction timeout a producer may ask for (INVALID_TRANSACTION_TIMEOUT "
            "above it)"),
    Setting("transaction.abort.timed.out.transaction.cleanup.interval.ms",
            "transaction_timeout_check_interval_ms", int,
            "how often open transactions past their timeout are aborted (and their "
            "producers fenced)"),
    Setting("transactional.id.expiration.ms", "transactional_id_expiration_ms", int,
            "a transactional id without a transaction for this long is forgotten"),
    Setting("gateway.transactional.id.max.bytes", "transactional_id_max_bytes", int,
            "longest transactional id (UTF-8 bytes) InitProducerId accepts (INVALID_REQUEST "
            "above it); at most 32767, the protocol's limit and Kafka's"),
    Setting("broker.session.timeout.ms", "broker_session_timeout_ms", int,
            "PostgreSQL store (docs/cluster.md): the gateway's lease in the cluster, renewed "
            "every third of it; a gateway that stops renewing is replaced as leader of its "
            "partitions and coordinator of its groups within it plus a third"),
    Setting("producer.id.expiration.ms", "producer_id_expiration_ms", int,
            "a partition forgets an idempotent producer idle for this long (its next batch, "
            "mid-sequence, gets UNKNOWN_PRODUCER_ID and the client bumps its epoch)"),
    Setting("gateway.producer.state.max.per.partition", "max_producers_per_partition", int,
            "producer ids whose sequences one partition keeps; past it the least recently "
            "used is forgotten"),
    Setting("gateway.txn.pending.memory.bytes", "txn_pending_memory_bytes", int,
            "memory for open transactions' batches (node-wide), so a commit serves them "
            "from the in-memory tails; beyond it they are read from the store"),
    Setting("gateway.txn.pending.disk.bytes", "txn_pending_disk_bytes", int,
            "bytes of open transactions' batches stored until their commit, node-wide; a "
            "batch past it is refused (POLICY_VIOLATION) and its transaction can only abort "
            "(-1: no limit)"),
    Setting("gateway.txn.max.bytes", "txn_max_bytes", int,
            "bytes of batches one open transaction may store; a batch past it is refused "
            "(POLICY_VIOLATION) and the transaction can only abort (-1: no limit)"),
    # Security (docs/security.md). listeners and advertised.listeners in Kafka's
    # syntax; --listen/--advertise remain the one-PLAINTEXT-listener shorthand.
    Setting("listeners", "listeners", str,
            "NAME://HOST:PORT,... listeners, each with the security protocol its name maps "
            "to (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL); overrides --listen"),
    Setting("advertised.listeners", "advertised_listeners", str,
            "NAME://HOST:PORT,... what Metadata tells the clients of each listener "
            "(default: the listener's own address)"),
    Setting("listener.security.protocol.map", "listener_security_protocol_map", str,
            "NAME:PROTOCOL,... for listener names that are not protocol names"),
    Setting("ssl.keystore.location", "ssl_keystore_location", str,
            "PEM file with the server's private key and certificate chain (TLS listeners)"),
    Setting("ssl.keystore.type", "ssl_keystore_type", str,
            "format of ssl.keystore.location", choices=("PEM",)),
    Setting("ssl.key.password", "ssl_key_password", str,
            "password of an encrypted private key in ssl.keystore.location"),
    Setting("ssl.truststore.location", "ssl_truststore_location", str,
            "PEM file of the CA certificates client certificates must chain to (mTLS)"),
    Setting("ssl.truststore.type", "ssl_truststore_type", str,
            "format of ssl.truststore.location", choices=("PEM",)),
    Setting("ssl.client.auth", "ssl_client_auth", str,
            "client certificates on SSL listeners: required, requested or none; the "
            "principal of a client with one is User:<its subject>",
            choices=("none", "requested", "required")),
    Setting("ssl.enabled.protocols", "ssl_enabled_protocols", str,
            "TLS versions accepted (TLSv1.2 and up only)"),
    Setting("ssl.cipher.suites", "ssl_cipher_suites", str,
            "OpenSSL cipher list for TLS 1.2 (empty: OpenSSL's defaults)"),
    Setting("sasl.enabled.mechanisms", "sasl_enabled_mechanisms", str,
            "SASL mechanisms of SASL listeners: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"),
    Setting("sasl.server.max.receive.size", "sasl_server_max_receive_size", int,
            "largest frame a SASL listener reads before the client has authenticated; a "
            "larger size prefix fails the authentication (the connection closes unanswered)"),
    Setting("connection.failed.authentication.delay.ms", "failed_authentication_delay_ms",
            int, "a failed SASL authentication is answered and its connection closed this "
            "long after the failure, the connection muted meanwhile (0: at once)"),
    Setting("authorizer.class.name", "authorizer_class_name", str,
            "set (to kafka.security.authorizer.AclAuthorizer, "
            "org.apache.kafka.metadata.authorizer.StandardAuthorizer or 'acl') to check "
            "ACLs; empty: everything is allowed"),
    Setting("super.users", "super_users", str,
            "principals allowed everything, ';'-separated (User:admin;User:CN=ops)"),
    Setting("allow.everyone.if.no.acl.found", "allow_everyone_if_no_acl_found", bool,
            "with an authorizer: allow an operation on a resource no ACL matches"),
    Setting("log.cleaner.enable", "cleaner_enable", bool,
            "compact the partitions of topics whose cleanup.policy has compact"),
    Setting("log.cleaner.backoff.ms", "cleaner_backoff_ms", int,
            "how often the log cleaner looks for partitions due for compaction"),
    Setting("log.cleaner.dedupe.buffer.size", "cleaner_dedupe_buffer_size", int,
            "memory for one compaction run's map of keys (about 140 bytes a key); a run "
            "whose dirty keys do not fit stops there and the next one goes on"),
    Setting("log.cleaner.io.max.bytes.per.second", "cleaner_io_max_bytes_per_second", float,
            "what the log cleaner reads and writes, together, per second at most"),
    Setting("log.cleaner.io.buffer.size", "cleaner_io_buffer_size", int,
            "compacted batches swapped into a log at once (one write each)"),
)


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    listen: tuple[str, int] = ("127.0.0.1", 9092)
    advertise: tuple[str, int] | None = None
    data_dir: str = "./data"
    # The storage engine, picked by URL (as Tansu's --storage-engine):
    # postgresql://... (or postgres://...) for the PostgreSQL store
    # (docs/cluster.md); empty: RocksDB in data_dir.
    store: str = ""
    node_id: int = 0
    auto_create_topics: bool = True
    num_partitions: int = 1
    retention_ms: int = 604_800_000
    retention_bytes: int = -1
    retention_check_interval_ms: int = 300_000
    message_max_bytes: int = 1_048_588
    fetch_max_bytes: int = 57_671_680  # Kafka's default: 55 MiB
    max_frame_bytes: int = 104_857_600
    queued_max_request_bytes: int = 134_217_728
    connections_max_idle_ms: int = 600_000
    partial_request_timeout_ms: int = 30_000
    ssl_handshake_timeout_ms: int = 10_000
    max_connections: int = 2_147_483_647  # Kafka's Int.MaxValue: no limit
    max_connections_per_ip: int = 2_147_483_647
    max_connections_per_ip_overrides: str = ""
    request_max_array_items: int = 50_000
    fsync: str = "never"
    tail_cache_bytes: int = 256 << 20
    admin_listen: str = "off"
    group_initial_rebalance_delay_ms: int = 3000
    group_min_session_timeout_ms: int = 6000
    group_max_session_timeout_ms: int = 1_800_000
    offsets_retention_minutes: int = 10_080
    offsets_retention_check_interval_ms: int = 600_000
    offset_metadata_max_bytes: int = 4096
    transaction_max_timeout_ms: int = 900_000
    transaction_timeout_check_interval_ms: int = 10_000
    transactional_id_expiration_ms: int = 604_800_000
    transactional_id_max_bytes: int = 4096
    producer_id_expiration_ms: int = 86_400_000
    broker_session_timeout_ms: int = 9_000  # Kafka's (KRaft) default
    max_producers_per_partition: int = 10_000
    txn_pending_memory_bytes: int = 64 << 20
    txn_pending_disk_bytes: int = 4 << 30
    txn_max_bytes: int = 1 << 30
    listeners: str = ""
    advertised_listeners: str = ""
    listener_security_protocol_map: str = ""
    ssl_keystore_location: str = ""
    ssl_keystore_type: str = "PEM"
    ssl_key_password: str = ""
    ssl_truststore_location: str = ""
    ssl_truststore_type: str = "PEM"
    ssl_client_auth: str = "none"
    ssl_enabled_protocols: str = "TLSv1.2,TLSv1.3"
    ssl_cipher_suites: str = ""
    sasl_enabled_mechanisms: str = "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512"
    sasl_server_max_receive_size: int = 524_288
    failed_authentication_delay_ms: int = 100
    authorizer_class_name: str = ""
    super_users: str = ""
    allow_everyone_if_no_acl_found: bool = False
    # listener.name.<name>.<setting> from a properties file: listener -> setting -> value
    listener_settings: dict[str, dict[str, str]] = field(default_factory=dict)
    cleaner_enable: bool = True
    cleaner_backoff_ms: int = 15_000
    cleaner_dedupe_buffer_size: int = 128 << 20
    cleaner_io_max_bytes_per_second: float = 1.7976931348623157e308  # Kafka's Double.MaxValue
    cleaner_io_buffer_size: int = 512 << 10
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def advertised(self) -> tuple[str, int]:
        return self.advertise or self.listen

    def listener_list(self) -> list[Listener]:
        """The listeners to open: ``listeners``, or the one PLAINTEXT ``--listen``."""
        if self.listeners:
            return parse_listeners(self.listeners, self.advertised_listeners,
                                   self.listener_security_protocol_map, self.listener_settings)
        (host, port), (ad_host, ad_port) = self.listen, self.advertised
        return [Listener("PLAINTEXT", "PLAINTEXT", host, port, ad_host, ad_port)]

    def properties(self) -> dict[str, str]:
        """The broker configs as DescribeConfigs reports them."""
        out = {
            "broker.id": str(self.node_id),
            "node.id": str(self.node_id),
            "log.dirs": self.data_dir,
            "default.replication.factor": "1",
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "min.insync.replicas": "1",
        }
        for setting in SETTINGS:
            value = getattr(self, setting.attr)
            out[setting.prop] = str(value).lower() if isinstance(value, bool) else str(value)
        listeners = self.listener_list()
        out["listeners"] = ",".join(listener.url() for listener in listeners)
        out["advertised.listeners"] = ",".join(listener.url(advertised=True)
                                               for listener in listeners)
        for secret in ("ssl.key.password",):  # Kafka reports passwords as null
            out.pop(secret, None)
        return out

    def topic_defaults(self) -> dict[str, str]:
        """Node settings that are the defaults of topic configs."""
        return {
            "retention.ms": str(self.retention_ms),
            "retention.bytes": str(self.retention_bytes),
            "max.message.bytes": str(self.message_max_bytes),
        }
