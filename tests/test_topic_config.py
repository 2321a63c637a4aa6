"""Topic config values parsed and checked as Kafka's ConfigDef does (Java rules).

The differential tests check the same rules against a live Apache Kafka; these
pin them without one.
"""

from __future__ import annotations

import asyncio
import math

import pytest

from tablets import EngineSettings, StorageEngine
from tablets.config_parsing import (
    ParseError,
    is_metadata_version,
    is_throttled_replica_list,
    java_double_string,
    java_trim,
    parse_double,
    parse_integer,
    parse_list,
)
from tablets.errors import InvalidTopicName
from tablets.topic_config import InvalidConfig, validate, validate_all

ARABIC_1000 = "\u0661\u0660\u0660\u0660"


def test_java_trim_strips_control_characters_not_unicode_spaces():
    assert java_trim("\x00\t 5 \n") == "5"
    assert java_trim("\u00a05\u2003") == "\u00a05\u2003"


@pytest.mark.parametrize(("text", "bits", "value"), [
    ("1000", 32, 1000), ("+1000", 32, 1000), ("-0", 32, 0), ("00012", 32, 12),
    (ARABIC_1000, 32, 1000), ("\uff11\uff10", 32, 10), ("2147483647", 32, 2**31 - 1),
    ("-2147483648", 32, -(2**31)), ("9223372036854775807", 64, 2**63 - 1),
])
def test_integers_as_java_parses_them(text, bits, value):
    assert parse_integer(text, bits) == value


@pytest.mark.parametrize(("text", "bits"), [
    ("1_000", 32), ("1e3", 32), ("1.0", 32), ("0x10", 32), ("", 32), ("+", 32), ("-", 32),
    ("2147483648", 32), ("1099511627776", 32), ("9223372036854775808", 64),
    ("\U0001d7cf\U0001d7ce", 32), (" 1", 32),
])
def test_integers_java_refuses(text, bits):
    with pytest.raises(ParseError):
        parse_integer(text, bits)


@pytest.mark.parametrize(("text", "value"), [
    ("0.5", 0.5), (".5", 0.5), ("5.", 5.0), ("1e-1", 0.1), ("+0.5", 0.5), ("0.5d", 0.5),
    ("0.5F", 0.5), ("0x1p-1", 0.5), ("0x.8p0", 0.5), ("Infinity", math.inf),
    ("-Infinity", -math.inf), ("1e400", math.inf),
])
def test_doubles_as_java_parses_them(text, value):
    assert parse_double(text) == value


@pytest.mark.parametrize("text", ["nan", "NAN", "inf", "infinity", "1_0", "\u0661", "0.5e",
                                  "", ".", "0x1", "0x1.8", "NaNd", "1e"])
def test_doubles_java_refuses(text):
    with pytest.raises(ParseError):
        parse_double(text)


def test_nan_parses():
    assert math.isnan(parse_double("NaN")) and math.isnan(parse_double("-NaN"))


@pytest.mark.parametrize(("value", "text"), [
    (0.5, "0.5"), (1.0, "1.0"), (0.001, "0.001"), (1e-4, "1.0E-4"), (1.5e-5, "1.5E-5"),
    (1e7, "1.0E7"), (12345678.9, "1.23456789E7"), (-0.0, "-0.0"), (math.nan, "NaN"),
    (math.inf, "Infinity"), (1234567.5, "1234567.5"),
])
def test_doubles_shown_as_java_shows_them(value, text):
    assert java_double_string(value) == text


def test_lists_split_on_commas_and_keep_empty_items():
    assert parse_list("") == []
    assert parse_list("a , b,c") == ["a", "b", "c"]
    assert parse_list("a,,b") == ["a", "", "b"]
    assert parse_list("a,") == ["a", ""]


@pytest.mark.parametrize(("text", "valid"), [
    ("3.0-IV1", True), ("3.4", True), ("3.4.1", True), ("0.10.0-IV1", True), ("0.8.2", True),
    ("2.8", True), ("1.0.5", True), ("3.5-IV0", False), ("4.0", False), ("0.10.0-IV2", False),
    ("3.", False), ("", False), ("bogus", False),
])
def test_message_format_versions_of_kafka_3_4(text, valid):
    assert is_metadata_version(text) is valid


@pytest.mark.parametrize(("items", "valid"), [
    (["*"], True), ([" * "], True), (["0:1", "1:1"], True), (["0:1", ""], True), ([], True),
    (["bogus"], False), (["0:x"], False), (["*", "0:1"], False),
])
def test_throttled_replica_lists(items, valid):
    assert is_throttled_replica_list(items) is valid


@pytest.mark.parametrize(("name", "value", "stored"), [
    ("retention.ms", "+0100", "100"), ("max.message.bytes", f" {ARABIC_1000} ", "1000"),
    ("min.cleanable.dirty.ratio", "NaN", "NaN"), ("min.cleanable.dirty.ratio", "1e-4",
                                                  "1.0E-4"),
    ("preallocate", "TRUE", "true"), ("cleanup.policy", " delete , delete", "delete,delete"),
    ("cleanup.policy", "", ""), ("compression.type", " zstd", "zstd"),
    ("segment.ms", "\x00 5000", "5000"),
])
def test_values_are_stored_as_kafka_shows_them(name, value, stored):
    assert validate(name, value) == stored


@pytest.mark.parametrize(("name", "value"), [
    ("min.cleanable.dirty.ratio", "1.5"), ("min.cleanable.dirty.ratio", "nan"),
    ("message.format.version", "x" * 100_000), ("compression.type", "GZIP"),
    ("cleanup.policy", "delete,,compact"), ("retention.ms", None), ("segment.bytes", "13"),
])
def test_refused_values(name, value):
    with pytest.raises(InvalidConfig) as refused:
        validate(name, value)
    assert len(str(refused.value)) < 1000  # a huge value is not repeated whole


def test_compaction_lags_are_checked_together():
    with pytest.raises(InvalidConfig, match="conflict"):
        validate_all({"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"})
    assert validate_all({"min.compaction.lag.ms": "5"}) == {"min.compaction.lag.ms": "5"}


def test_names_colliding_after_dot_to_underscore_are_refused(tmp_path):
    async def scenario():
        engine = StorageEngine(str(tmp_path), EngineSettings())
        engine.start(asyncio.get_running_loop())
        try:
            await engine.create_topic("col.lide", 1, {})
            with pytest.raises(InvalidTopicName, match=r"collides with existing topic: col\.lide"):
                await engine.create_topic("col_lide", 1, {})
            await engine.delete_topic("col.lide")
            await engine.create_topic("col_lide", 1, {})  # free again once deleted
        finally:
            engine.close()

    asyncio.run(scenario())
