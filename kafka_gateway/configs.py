"""Describing configs the way Kafka does: value, source, type, synonyms.

Shared by DescribeConfigs and CreateTopics (v5+ returns the new topic's
configs). Topic configs are stored as overrides; everything else comes from
the node's settings or Kafka's defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

from tablets.topic_config import TOPIC_CONFIGS

RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
RESOURCE_BROKER_LOGGER = 8

SOURCE_DYNAMIC_TOPIC = 1
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5

# Topic config -> the broker property that sets its default (Kafka's synonyms).
BROKER_SYNONYMS = {
    "retention.ms": "log.retention.ms",
    "retention.bytes": "log.retention.bytes",
    "max.message.bytes": "message.max.bytes",
    "cleanup.policy": "log.cleanup.policy",
    "compression.type": "compression.type",
    "message.timestamp.type": "log.message.timestamp.type",
    "segment.bytes": "log.segment.bytes",
    "min.insync.replicas": "min.insync.replicas",
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


def topic_entries(overrides: dict[str, str], node_defaults: dict[str, str]) -> list[ConfigEntry]:
    entries = []
    for name, definition in TOPIC_CONFIGS.items():
        synonyms = []
        if name in overrides:
            synonyms.append((name, overrides[name], SOURCE_DYNAMIC_TOPIC))
        broker_name = BROKER_SYNONYMS.get(name)
        node_value = node_defaults.get(name)
        if broker_name and node_value is not None and node_value != definition.default:
            synonyms.append((broker_name, node_value, SOURCE_STATIC_BROKER))
        synonyms.append((broker_name or name, definition.default, SOURCE_DEFAULT))
        value, source = synonyms[0][1], synonyms[0][2]
        entries.append(
            ConfigEntry(name, value, source, definition.type.value,
                        sensitive=definition.sensitive, synonyms=tuple(synonyms))
        )
    return entries


def broker_entries(properties: dict[str, str]) -> list[ConfigEntry]:
    # Broker settings come from flags or the config file and are read-only
    # over the protocol (no dynamic broker configs).
    return [
        ConfigEntry(name, value, SOURCE_STATIC_BROKER, 2, read_only=True,
                    synonyms=((name, value, SOURCE_STATIC_BROKER),))
        for name, value in sorted(properties.items())
    ]
