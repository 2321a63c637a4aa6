"""Topic configurations: every Kafka 3.4 topic config, its default and its type.

DescribeConfigs lists all of them, like Kafka. The ones that change how this
gateway stores data are enforced by the tablets (see TabletSettings); the
rest are accepted and stored so that tools which set them keep working, and
docs/compatibility.md says which are which. Values are kept as strings, as
the protocol carries them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class ConfigType(Enum):
    BOOLEAN = 1
    STRING = 2
    INT = 3
    SHORT = 4
    LONG = 5
    DOUBLE = 6
    LIST = 7
    CLASS = 8
    PASSWORD = 9


@dataclass(frozen=True, slots=True)
class ConfigDef:
    name: str
    default: str | None
    type: ConfigType
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    sensitive: bool = False


_T = ConfigType
TOPIC_CONFIGS: dict[str, ConfigDef] = {
    d.name: d
    for d in (
        ConfigDef("cleanup.policy", "delete", _T.LIST, choices=("compact", "delete")),
        ConfigDef("compression.type", "producer", _T.STRING,
                  choices=("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd")),
        ConfigDef("delete.retention.ms", "86400000", _T.LONG, minimum=0),
        ConfigDef("file.delete.delay.ms", "60000", _T.LONG, minimum=0),
        ConfigDef("flush.messages", "9223372036854775807", _T.LONG, minimum=1),
        ConfigDef("flush.ms", "9223372036854775807", _T.LONG, minimum=0),
        ConfigDef("follower.replication.throttled.replicas", "", _T.LIST),
        ConfigDef("index.interval.bytes", "4096", _T.INT, minimum=0),
        ConfigDef("leader.replication.throttled.replicas", "", _T.LIST),
        ConfigDef("local.retention.bytes", "-2", _T.LONG, minimum=-2),
        ConfigDef("local.retention.ms", "-2", _T.LONG, minimum=-2),
        ConfigDef("max.compaction.lag.ms", "9223372036854775807", _T.LONG, minimum=1),
        ConfigDef("max.message.bytes", "1048588", _T.INT, minimum=0),
        ConfigDef("message.downconversion.enable", "true", _T.BOOLEAN),
        ConfigDef("message.format.version", "3.0-IV1", _T.STRING),
        ConfigDef("message.timestamp.difference.max.ms", "9223372036854775807", _T.LONG,
                  minimum=0),
        ConfigDef("message.timestamp.type", "CreateTime", _T.STRING,
                  choices=("CreateTime", "LogAppendTime")),
        ConfigDef("min.cleanable.dirty.ratio", "0.5", _T.DOUBLE, minimum=0),
        ConfigDef("min.compaction.lag.ms", "0", _T.LONG, minimum=0),
        ConfigDef("min.insync.replicas", "1", _T.INT, minimum=1),
        ConfigDef("preallocate", "false", _T.BOOLEAN),
        ConfigDef("remote.storage.enable", "false", _T.BOOLEAN),
        ConfigDef("retention.bytes", "-1", _T.LONG),
        ConfigDef("retention.ms", "604800000", _T.LONG, minimum=-1),
        ConfigDef("segment.bytes", "1073741824", _T.INT, minimum=14),
        ConfigDef("segment.index.bytes", "10485760", _T.INT, minimum=4),
        ConfigDef("segment.jitter.ms", "0", _T.LONG, minimum=0),
        ConfigDef("segment.ms", "604800000", _T.LONG, minimum=1),
        ConfigDef("unclean.leader.election.enable", "false", _T.BOOLEAN),
    )
}

class InvalidConfig(ValueError):
    """A config name or value Kafka would reject (INVALID_CONFIG)."""


def validate(name: str, value: str | None) -> None:
    """Check one topic config the way Kafka's ConfigDef does."""
    definition = TOPIC_CONFIGS.get(name)
    if definition is None:
        raise InvalidConfig(f"Unknown topic config name: {name}")
    if value is None:
        raise InvalidConfig(f"Invalid value null for configuration {name}")
    if definition.type in (_T.INT, _T.LONG, _T.SHORT):
        try:
            number: float = int(value)
        except ValueError:
            raise InvalidConfig(
                f"Invalid value {value} for configuration {name}: Not a number of type "
                f"{definition.type.name}"
            ) from None
    elif definition.type is _T.DOUBLE:
        try:
            number = float(value)
        except ValueError:
            raise InvalidConfig(f"Invalid value {value} for configuration {name}") from None
    elif definition.type is _T.BOOLEAN:
        if value.lower() not in ("true", "false"):
            raise InvalidConfig(f"Invalid value {value} for configuration {name}: Expected "
                                "value to be either true or false")
        return
    else:
        number = 0
    if definition.minimum is not None and number < definition.minimum:
        raise InvalidConfig(
            f"Invalid value {value} for configuration {name}: Value must be at least "
            f"{definition.minimum:g}"
        )
    if definition.choices:
        items = [v.strip() for v in value.split(",")] if definition.type is _T.LIST else [value]
        for item in items:
            if item not in definition.choices:
                raise InvalidConfig(
                    f"Invalid value {value} for configuration {name}: String must be one of: "
                    f"{', '.join(definition.choices)}"
                )


def effective(overrides: dict[str, str], broker_defaults: dict[str, str]) -> dict[str, str]:
    """Every topic config's value: the topic's override, else the node's default."""
    values = {name: d.default or "" for name, d in TOPIC_CONFIGS.items()}
    values.update(broker_defaults)
    values.update(overrides)
    return values
