"""Gateway settings: one table, read from a properties file and from flags.

Each setting has a Kafka-style property name (usable in a ``server.properties``
style file passed with ``--config``) and a command-line flag derived from it.
DescribeConfigs on the broker resource reports the same table.

This module reads and checks them (the flags, the properties file, the
limits Kafka refuses at start-up); the tables themselves -- ``SETTINGS`` and
``GatewayConfig`` with its defaults -- are in ``settings_table.py``. This
module is the settings' one public entry: callers import those names from
here.
"""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

from .settings_table import SETTINGS, GatewayConfig, Setting

__all__ = [
    "SETTINGS",
    "STORE_SCHEMES",
    "GatewayConfig",
    "Setting",
    "add_arguments",
    "from_arguments",
    "read_properties",
    "validate_limits",
]

_LISTENER_PREFIX = "listener.name."
_PER_LISTENER = ("ssl.", "sasl.enabled.mechanisms")
# The ACL authorizer's names (security/authorizer.py): Kafka's two, or short.
_AUTHORIZERS = ("kafka.security.authorizer.AclAuthorizer",
                "org.apache.kafka.metadata.authorizer.StandardAuthorizer", "acl")


def _hostport(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host or "127.0.0.1", int(port)


def validate_limits(config: GatewayConfig) -> None:
    """Refuse limit settings that cannot work (Kafka refuses the same at start-up)."""
    from .quotas import parse_overrides  # quotas imports this module

    if config.max_connections < 0:
        raise ValueError("max.connections must be at least 0")
    if config.max_connections_per_ip < 0:
        raise ValueError("max.connections.per.ip must be at least 0")
    overrides = parse_overrides(config.max_connections_per_ip_overrides)
    if config.max_connections_per_ip == 0 and not overrides:
        # Kafka: "max.connections.per.ip can be set to zero only if
        # max.connections.per.ip.overrides property is set."
        raise ValueError("max.connections.per.ip can be 0 only if "
                         "max.connections.per.ip.overrides is set")
    if config.ssl_handshake_timeout_ms <= 0:
        raise ValueError("gateway.ssl.handshake.timeout.ms must be positive")
    if not 0 < config.transactional_id_max_bytes <= 32767:
        raise ValueError("gateway.transactional.id.max.bytes must be in 1..32767")
    if config.fetch_max_bytes < 1024:  # Kafka's own floor
        raise ValueError("fetch.max.bytes must be at least 1024")


def _parse_value(setting: Setting, raw: str) -> object:
    if setting.kind is bool:
        if raw.lower() not in ("true", "false"):
            raise ValueError(f"{setting.prop} must be true or false, got {raw!r}")
        return raw.lower() == "true"
    value = setting.kind(raw)
    if setting.choices and value not in setting.choices:
        raise ValueError(f"{setting.prop} must be one of {', '.join(setting.choices)}")
    return value


def read_properties(path: str) -> dict[str, str]:
    """A Java-style properties file: ``key=value`` lines, ``#`` comments."""
    props: dict[str, str] = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"{path}:{number}: expected key=value")
        props[key.strip()] = value.strip()
    return props


STORE_SCHEMES = ("postgresql://", "postgres://")


def _store_url(text: str) -> str:
    """A storage engine URL: PostgreSQL's (a libpq URL, multi-host allowed)."""
    if not text.startswith(STORE_SCHEMES):
        raise argparse.ArgumentTypeError(
            f"{text!r}: the store is a postgresql:// URL (without --store: RocksDB in "
            "--data-dir)")
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", type=_hostport, default=None,
                        help="HOST:PORT to accept Kafka clients on (default 127.0.0.1:9092) "
                             "[listeners]")
    parser.add_argument("--advertise", type=_hostport, default=None,
                        help="HOST:PORT clients are told to connect to (default: --listen) "
                             "[advertised.listeners]")
    parser.add_argument("--data-dir", default=None,
                        help="where the RocksDB store lives (default ./data) [log.dirs]")
    parser.add_argument("--store", type=_store_url, default=None, metavar="URL",
                        help="postgresql://USER@HOST:PORT/DB: keep everything in PostgreSQL "
                             "(docs/cluster.md) instead of RocksDB in --data-dir")
    parser.add_argument("--node-id", type=int, default=None, help="broker id (default 0) [node.id]")
    parser.add_argument("--config", default=None,
                        help="a server.properties-style file of the settings below, by the "
                             "names in brackets (flags win)")
    defaults = GatewayConfig()
    for setting in SETTINGS:
        default = getattr(defaults, setting.attr)
        shown = str(default).lower() if isinstance(default, bool) else default
        parser.add_argument(setting.flag, dest=setting.attr, default=None, metavar="VALUE",
                            choices=setting.choices or None,
                            help=f"{setting.help} (default {shown}) [{setting.prop}]")


def from_arguments(args: argparse.Namespace) -> GatewayConfig:
    values: dict[str, object] = {}
    if args.config:
        props = read_properties(args.config)
        by_prop = {s.prop: s for s in SETTINGS}
        for key, raw in props.items():
            if key in by_prop:
                values[by_prop[key].attr] = _parse_value(by_prop[key], raw)
            elif key.startswith(_LISTENER_PREFIX):
                name, _, prop = key.removeprefix(_LISTENER_PREFIX).partition(".")
                if not prop.startswith(_PER_LISTENER):
                    raise ValueError(f"{args.config}: {key!r}: only ssl.* and "
                                     "sasl.enabled.mechanisms can be set per listener")
                per_listener = values.setdefault("listener_settings", {})
                per_listener.setdefault(name.lower(), {})[prop] = raw  # type: ignore[union-attr]
            elif key in ("log.dirs", "log.dir"):
                values["data_dir"] = raw
            elif key in ("node.id", "broker.id"):
                values["node_id"] = int(raw)
            else:
                raise ValueError(f"{args.config}: unknown setting {key!r}")
    for setting in SETTINGS:
        raw = getattr(args, setting.attr, None)
        if raw is not None:
            values[setting.attr] = _parse_value(setting, raw)
    for name in ("listen", "advertise", "data_dir", "store", "node_id"):
        if getattr(args, name, None) is not None:
            values[name] = getattr(args, name)
    known = {f.name for f in fields(GatewayConfig)}
    config = GatewayConfig(**{k: v for k, v in values.items() if k in known})
    config.listener_list()  # a listener setting that cannot work stops the start here
    for limit in ("gateway.txn.pending.disk.bytes", "gateway.txn.max.bytes"):
        value = getattr(config, next(s.attr for s in SETTINGS if s.prop == limit))
        if value < -1:
            raise ValueError(f"{limit} must be -1 (no limit) or at least 0, got {value}")
    if config.sasl_server_max_receive_size <= 0:
        raise ValueError("sasl.server.max.receive.size must be positive")
    if config.failed_authentication_delay_ms < 0:  # Kafka: at least 0
        raise ValueError("connection.failed.authentication.delay.ms must be at least 0")
    validate_limits(config)
    if config.authorizer_class_name and config.authorizer_class_name not in _AUTHORIZERS:
        raise ValueError(f"authorizer.class.name: {config.authorizer_class_name!r} is not "
                         f"one of {', '.join(_AUTHORIZERS)}")
    return config
