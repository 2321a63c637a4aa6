"""Topic configurations: every Kafka 3.4 topic config, its type, default and
validator, and the gateway's own (named ``gateway.*``).

DescribeConfigs lists all of Kafka's, like Kafka, and the gateway's own where
a topic sets them or a request names them. The ones that change how this
gateway stores data are enforced by the tablets (see TabletSettings); the
rest are accepted and stored so that tools which set them keep working, and
docs/compatibility.md says which are which.

Values are checked as Kafka's ConfigDef checks them: parsed with Java's rules
(tablets/config_parsing.py), then each config's validator (ranges, allowed
strings, Kafka's own list and version validators), then the rules that tie
configs together. What is stored is the value as Kafka shows it back
(``+0100`` is stored as ``100``), so DescribeConfigs answers as Kafka does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from .config_parsing import (
    ParseError,
    equals_ignore_case,
    is_metadata_version,
    is_throttled_replica_list,
    java_double_string,
    java_trim,
    parse_double,
    parse_integer,
    parse_list,
)


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


class InvalidConfig(ValueError):
    """A config name or value Kafka would reject (INVALID_CONFIG)."""


def _quote(value: object) -> str:
    # Values are quoted in messages; a huge one must not make a huge error
    # (Kafka's clients refuse protocol strings over 32767 bytes).
    text = str(value)
    return text if len(text) <= 200 else f"{text[:200]}... ({len(text)} characters)"


# A validator gets the parsed value and returns why it is wrong, or None.
Validator = Callable[[Any], str | None]


def at_least(minimum: int) -> Validator:
    return lambda v: f"Value must be at least {minimum}" if v < minimum else None


def between(low: int, high: int) -> Validator:
    # Comparisons with NaN are false, so Kafka's Range lets NaN through: so do we.
    def check(value: float) -> str | None:
        if value < low:
            return f"Value must be at least {low}"
        if value > high:
            return f"Value must be no more than {high}"
        return None
    return check


def one_of(*allowed: str) -> Validator:
    return lambda v: None if v in allowed else f"String must be one of: {', '.join(allowed)}"


def each_one_of(*allowed: str) -> Validator:
    def check(items: list[str]) -> str | None:
        bad = next((i for i in items if i not in allowed), None)
        return None if bad is None else f"String must be one of: {', '.join(allowed)}"
    return check


def _metadata_version(value: str) -> str | None:
    return None if is_metadata_version(value) else f"Version {_quote(value)} is not a valid version"


def _throttled_replicas(items: list[str]) -> str | None:
    return None if is_throttled_replica_list(items) else (
        "must be the literal '*' or a list of replicas in the following format: "
        "[partitionId]:[brokerId],[partitionId]:[brokerId],...")


IMPORTANT_GROUPS = "gateway.important.consumer.groups"
IMPORTANT_MAX_BYTES = "gateway.important.consumer.max.bytes"
MAX_IMPORTANT_GROUPS = 100


def _group_names(items: list[str]) -> str | None:
    # Group ids are free strings in Kafka, but in this list one cannot be
    # empty (",," or a trailing comma is a typo, not a group) or hold a comma.
    if any(not item for item in items):
        return "a consumer group name cannot be empty"
    if len(set(items)) != len(items):
        return "a consumer group is named twice"
    if len(items) > MAX_IMPORTANT_GROUPS:
        return f"at most {MAX_IMPORTANT_GROUPS} important consumer groups"
    return None


@dataclass(frozen=True, slots=True)
class ConfigDef:
    name: str
    default: str | None
    type: ConfigType
    validator: Validator | None = None
    sensitive: bool = False
    # Kafka 3.4 defines these (tiered storage, early access) but leaves them
    # out of DescribeConfigs; CreateTopics still reports them.
    internal: bool = False
    # The gateway's own configs (``gateway.*``, not Kafka's): listed only on a
    # topic that sets them, or when asked for by name, so a topic that does
    # not use them describes exactly as on Kafka.
    gateway: bool = False


_T = ConfigType

# What a transactional Produce answers as base offset (the batch gets its
# offsets only at the commit): -1 as today ("unknown"), or a lower bound of
# the offset the commit will give it ("lower-bound", exact for a partition
# with one writer such as a Kafka Streams changelog). Opt-in because every
# other client reads a Produce answer's offset as the record's own.
TXN_PRODUCE_OFFSET = "gateway.transactional.produce.offset"
TXN_OFFSET_UNKNOWN = "unknown"
TXN_OFFSET_LOWER_BOUND = "lower-bound"
_LONG_MAX = str((1 << 63) - 1)
TOPIC_CONFIGS: dict[str, ConfigDef] = {
    d.name: d
    for d in (
        ConfigDef("cleanup.policy", "delete", _T.LIST, each_one_of("compact", "delete")),
        ConfigDef("compression.type", "producer", _T.STRING,
                  one_of("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")),
        ConfigDef("delete.retention.ms", "86400000", _T.LONG, at_least(0)),
        ConfigDef("file.delete.delay.ms", "60000", _T.LONG, at_least(0)),
        ConfigDef("flush.messages", _LONG_MAX, _T.LONG, at_least(1)),
        ConfigDef("flush.ms", _LONG_MAX, _T.LONG, at_least(0)),
        ConfigDef("follower.replication.throttled.replicas", "", _T.LIST, _throttled_replicas),
        ConfigDef("index.interval.bytes", "4096", _T.INT, at_least(0)),
        ConfigDef("leader.replication.throttled.replicas", "", _T.LIST, _throttled_replicas),
        ConfigDef("local.retention.bytes", "-2", _T.LONG, at_least(-2), internal=True),
        ConfigDef("local.retention.ms", "-2", _T.LONG, at_least(-2), internal=True),
        ConfigDef("max.compaction.lag.ms", _LONG_MAX, _T.LONG, at_least(1)),
        ConfigDef("max.message.bytes", "1048588", _T.INT, at_least(0)),
        ConfigDef("message.downconversion.enable", "true", _T.BOOLEAN),
        ConfigDef("message.format.version", "3.0-IV1", _T.STRING, _metadata_version),
        ConfigDef("message.timestamp.difference.max.ms", _LONG_MAX, _T.LONG, at_least(0)),
        ConfigDef("message.timestamp.type", "CreateTime", _T.STRING,
                  one_of("CreateTime", "LogAppendTime")),
        ConfigDef("min.cleanable.dirty.ratio", "0.5", _T.DOUBLE, between(0, 1)),
        ConfigDef("min.compaction.lag.ms", "0", _T.LONG, at_least(0)),
        ConfigDef("min.insync.replicas", "1", _T.INT, at_least(1)),
        ConfigDef("preallocate", "false", _T.BOOLEAN),
        ConfigDef("remote.storage.enable", "false", _T.BOOLEAN, internal=True),
        ConfigDef("retention.bytes", "-1", _T.LONG),
        ConfigDef("retention.ms", "604800000", _T.LONG, at_least(-1)),
        ConfigDef("segment.bytes", "1073741824", _T.INT, at_least(14)),
        ConfigDef("segment.index.bytes", "10485760", _T.INT, at_least(4)),
        ConfigDef("segment.jitter.ms", "0", _T.LONG, at_least(0)),
        ConfigDef("segment.ms", "604800000", _T.LONG, at_least(1)),
        ConfigDef("unclean.leader.election.enable", "false", _T.BOOLEAN),
        # The gateway's own: outside Kafka's names, so no Kafka tool means them.
        ConfigDef(TXN_PRODUCE_OFFSET, TXN_OFFSET_UNKNOWN, _T.STRING,
                  one_of(TXN_OFFSET_UNKNOWN, TXN_OFFSET_LOWER_BOUND), gateway=True),
        # Important consumers (tablets/important.py): retention never deletes
        # what these groups have not committed, up to an optional ceiling.
        ConfigDef(IMPORTANT_GROUPS, "", _T.LIST, _group_names, gateway=True),
        ConfigDef(IMPORTANT_MAX_BYTES, "-1", _T.LONG, at_least(-1), gateway=True),
    )
}

_BITS = {_T.SHORT: 16, _T.INT: 32, _T.LONG: 64}


def _invalid(name: str, value: object, why: str | None = None) -> InvalidConfig:
    suffix = f": {why}" if why else ""
    return InvalidConfig(f"Invalid value {_quote(value)} for configuration {name}{suffix}")


def parse(definition: ConfigDef, value: str) -> Any:
    """ConfigDef.parseType: the typed value of a (trimmed) string."""
    text = java_trim(value)
    kind = definition.type
    try:
        if kind in _BITS:
            return parse_integer(text, _BITS[kind])
        if kind is _T.DOUBLE:
            return parse_double(text)
    except ParseError:
        raise _invalid(definition.name, value, f"Not a number of type {kind.name}") from None
    if kind is _T.BOOLEAN:
        for word in ("true", "false"):
            if equals_ignore_case(text, word):
                return word == "true"
        raise _invalid(definition.name, value, "Expected value to be either true or false")
    if kind is _T.LIST:
        return parse_list(text)
    return text


def to_string(definition: ConfigDef, parsed: Any) -> str:
    """ConfigDef.convertToString: the value as Kafka shows it back."""
    if definition.type is _T.BOOLEAN:
        return "true" if parsed else "false"
    if definition.type is _T.DOUBLE:
        return java_double_string(parsed)
    if definition.type is _T.LIST:
        return ",".join(parsed)
    return str(parsed)


def _shown(definition: ConfigDef, parsed: Any) -> str:
    # How Kafka prints a parsed value in a validator's message (a list as [a, b]).
    if definition.type is _T.LIST:
        return f"[{', '.join(parsed)}]"
    return to_string(definition, parsed)


def _check(name: str, value: str | None) -> tuple[ConfigDef, Any]:
    definition = TOPIC_CONFIGS.get(name)
    if definition is None:
        raise InvalidConfig(f"Unknown topic config name: {name}")
    if value is None:
        raise InvalidConfig(f"Null value not supported for topic configs: {name}")
    parsed = parse(definition, value)
    why = definition.validator(parsed) if definition.validator else None
    if why is not None:
        raise _invalid(name, _shown(definition, parsed), why)
    return definition, parsed


def validate(name: str, value: str | None) -> str:
    """Check one topic config the way Kafka's ConfigDef does; returns the
    value as Kafka shows it back (what is stored)."""
    definition, parsed = _check(name, value)
    return to_string(definition, parsed)


def validate_all(overrides: Mapping[str, str | None]) -> dict[str, str]:
    """Check a topic's whole set of overrides: each value, then the rules
    between configs (LogConfig.validateValues). Returns them as stored."""
    checked = {name: _check(name, value) for name, value in overrides.items()}

    def value_of(name: str) -> Any:
        if name in checked:
            return checked[name][1]
        definition = TOPIC_CONFIGS[name]
        return parse(definition, definition.default or "")

    low, high = value_of("min.compaction.lag.ms"), value_of("max.compaction.lag.ms")
    if low > high:
        raise InvalidConfig(f"conflict topic config setting min.compaction.lag.ms ({low}) > "
                            f"max.compaction.lag.ms ({high})")
    return {name: to_string(d, parsed) for name, (d, parsed) in checked.items()}


def effective(overrides: dict[str, str], broker_defaults: dict[str, str]) -> dict[str, str]:
    """Every topic config's value: the topic's override, else the node's default."""
    values = {name: d.default or "" for name, d in TOPIC_CONFIGS.items()}
    values.update(broker_defaults)
    values.update(overrides)
    return values
