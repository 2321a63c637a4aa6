"""Describing configs the way Kafka does: value, source, type, synonyms.

Shared by DescribeConfigs and CreateTopics (v5+ returns the new topic's
configs). Topic configs are stored as overrides; everything else comes from
the node's settings or Kafka's defaults.

Synonyms follow Kafka 3.4's rules (ConfigHelper): a topic override first
(DYNAMIC_TOPIC_CONFIG), then the broker property that sets the topic's
default and its own synonyms, each where it has a value: set in the node's
settings (STATIC_BROKER_CONFIG), then Kafka's defaults (DEFAULT_CONFIG). The
broker list is cut before the first entry that is not the topic's own broker
property: ``retention.ms`` follows ``log.retention.ms``, which has no default
of its own (``log.retention.hours`` has), so unless the node sets
``log.retention.ms`` Kafka lists no broker synonym for it at all.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from tablets.topic_config import TOPIC_CONFIGS

RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
RESOURCE_BROKER_LOGGER = 8

SOURCE_DYNAMIC_TOPIC = 1
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5

# Topic config -> its broker properties in Kafka's synonym order, each with
# Kafka's default (None: no default of its own). No entry: no broker synonym.
_LONG_MAX = str((1 << 63) - 1)
BROKER_SYNONYMS: dict[str, tuple[tuple[str, str | None], ...]] = {
    "cleanup.policy": (("log.cleanup.policy", "delete"),),
    "compression.type": (("compression.type", "producer"),),
    "delete.retention.ms": (("log.cleaner.delete.retention.ms", "86400000"),),
    "file.delete.delay.ms": (("log.segment.delete.delay.ms", "60000"),),
    "flush.messages": (("log.flush.interval.messages", _LONG_MAX),),
    "flush.ms": (("log.flush.interval.ms", None), ("log.flush.scheduler.interval.ms", _LONG_MAX)),
    "index.interval.bytes": (("log.index.interval.bytes", "4096"),),
    "local.retention.bytes": (("log.local.retention.bytes", "-2"),),
    "local.retention.ms": (("log.local.retention.ms", "-2"),),
    "max.compaction.lag.ms": (("log.cleaner.max.compaction.lag.ms", _LONG_MAX),),
    "max.message.bytes": (("message.max.bytes", "1048588"),),
    "message.downconversion.enable": (("log.message.downconversion.enable", "true"),),
    "message.format.version": (("log.message.format.version", "3.0-IV1"),),
    "message.timestamp.difference.max.ms": (
        ("log.message.timestamp.difference.max.ms", _LONG_MAX),),
    "message.timestamp.type": (("log.message.timestamp.type", "CreateTime"),),
    "min.cleanable.dirty.ratio": (("log.cleaner.min.cleanable.ratio", "0.5"),),
    "min.compaction.lag.ms": (("log.cleaner.min.compaction.lag.ms", "0"),),
    "min.insync.replicas": (("min.insync.replicas", "1"),),
    "preallocate": (("log.preallocate", "false"),),
    "retention.bytes": (("log.retention.bytes", "-1"),),
    "retention.ms": (("log.retention.ms", None), ("log.retention.minutes", None),
                     ("log.retention.hours", "168")),
    "segment.bytes": (("log.segment.bytes", "1073741824"),),
    "segment.index.bytes": (("log.index.size.max.bytes", "10485760"),),
    "segment.jitter.ms": (("log.roll.jitter.ms", None), ("log.roll.jitter.hours", "0")),
    "segment.ms": (("log.roll.ms", None), ("log.roll.hours", "168")),
    "unclean.leader.election.enable": (("unclean.leader.election.enable", "false"),),
}


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    name: str
    value: str | None
    source: int
    config_type: int
    read_only: bool = False
    sensitive: bool = False
    synonyms: tuple[tuple[str, str | None, int], ...] = ()


def _broker_synonyms(name: str, node_defaults: dict[str, str]) -> list[tuple[str, str | None, int]]:
    chain = BROKER_SYNONYMS.get(name, ())
    if not chain:
        return []
    static = []
    node_value = node_defaults.get(name)
    if node_value is not None and node_value != TOPIC_CONFIGS[name].default:
        # The node sets the topic's own broker property (flag or config file).
        static.append((chain[0][0], node_value, SOURCE_STATIC_BROKER))
    defaults = [(prop, value, SOURCE_DEFAULT) for prop, value in chain if value is not None]
    listed = static + defaults
    while listed and listed[0][0] != chain[0][0]:
        listed.pop(0)
    return listed


def topic_entries(overrides: dict[str, str], node_defaults: dict[str, str],
                  include_internal: bool = False,
                  named: Collection[str] = ()) -> list[ConfigEntry]:
    """Every topic config; Kafka's DescribeConfigs leaves out the internal
    ones the topic does not set, which CreateTopics still reports
    (``include_internal``). The gateway's own (``gateway.*``) are listed
    where the topic sets them or they are ``named``: a topic without them
    is described exactly as Kafka describes it."""
    entries = []
    for name, definition in TOPIC_CONFIGS.items():
        if definition.internal and not include_internal and name not in overrides:
            continue
        if definition.gateway and name not in overrides and name not in named:
            continue
        synonyms = _broker_synonyms(name, node_defaults)
        if name in overrides:
            synonyms.insert(0, (name, overrides[name], SOURCE_DYNAMIC_TOPIC))
        value = overrides.get(name, node_defaults.get(name, definition.default))
        source = synonyms[0][2] if synonyms else SOURCE_DEFAULT
        entries.append(
            ConfigEntry(name, value, source, definition.type.value,
                        sensitive=definition.sensitive, synonyms=tuple(synonyms))
        )
    return entries


# The node's settings by Kafka's type (BOOLEAN 1, STRING 2, INT 3, SHORT 4, LONG 5).
_BROKER_TYPES = {
    "auto.create.topics.enable": 1, "num.partitions": 3, "log.retention.ms": 5,
    "log.retention.bytes": 5, "log.retention.check.interval.ms": 5, "message.max.bytes": 3,
    "socket.request.max.bytes": 3, "group.initial.rebalance.delay.ms": 3,
    "group.min.session.timeout.ms": 3, "group.max.session.timeout.ms": 3,
    "offsets.retention.minutes": 3, "offsets.retention.check.interval.ms": 5,
    "offset.metadata.max.bytes": 3, "broker.id": 3, "node.id": 3,
    "default.replication.factor": 3, "offsets.topic.replication.factor": 4,
    "transaction.state.log.replication.factor": 4, "min.insync.replicas": 3,
    "gateway.tail.cache.bytes": 5,
}
# A broker property's own synonyms (log.retention.ms: minutes, hours), as above.
_BROKER_CHAINS = {chain[0][0]: chain for chain in BROKER_SYNONYMS.values()}


def broker_entries(properties: dict[str, str], defaults: dict[str, str]) -> list[ConfigEntry]:
    """The node's settings; ``defaults`` are those of a node started without
    any. Set ones are STATIC_BROKER_CONFIG, the others DEFAULT_CONFIG, with
    synonyms by the rule above. Read-only over the protocol: the settings come
    from flags or the config file (no dynamic broker configs)."""
    entries = []
    for name, value in sorted(properties.items()):
        chain = _BROKER_CHAINS.get(name, ((name, defaults.get(name)),))
        synonyms = [(name, value, SOURCE_STATIC_BROKER)] if value != defaults.get(name) else []
        synonyms += [(prop, default, SOURCE_DEFAULT) for prop, default in chain
                     if default is not None]
        while synonyms and synonyms[0][0] != name:
            synonyms.pop(0)
        source = SOURCE_STATIC_BROKER if value != defaults.get(name) else SOURCE_DEFAULT
        entries.append(ConfigEntry(name, value, source, _BROKER_TYPES.get(name, 2),
                                   read_only=True, synonyms=tuple(synonyms)))
    return entries
