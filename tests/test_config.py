"""Gateway settings from flags and a properties file; topic config validation."""

from __future__ import annotations

import argparse

import pytest

from kafka_gateway import quotas, settings
from tablets.topic_config import InvalidConfig, validate


def parse(*argv: str) -> settings.GatewayConfig:
    parser = argparse.ArgumentParser()
    settings.add_arguments(parser)
    return settings.from_arguments(parser.parse_args(argv))


def test_defaults_match_kafka():
    cfg = parse()
    assert cfg.listen == ("127.0.0.1", 9092)
    assert cfg.auto_create_topics is True
    assert cfg.message_max_bytes == 1048588
    assert cfg.max_frame_bytes == 104857600
    assert cfg.fsync == "never"


def test_properties_file_and_flags(tmp_path):
    props = tmp_path / "gateway.properties"
    props.write_text("# comment\nnum.partitions=6\nauto.create.topics.enable=false\n"
                     "log.dirs=/tmp/x\ngateway.fsync=always\n")
    cfg = parse("--config", str(props), "--num-partitions", "3")
    assert cfg.num_partitions == 3  # the flag wins over the file
    assert cfg.auto_create_topics is False
    assert cfg.data_dir == "/tmp/x"
    assert cfg.fsync == "always"
    assert cfg.properties()["num.partitions"] == "3"


def test_bad_settings_are_refused(tmp_path):
    props = tmp_path / "bad.properties"
    props.write_text("no.such.setting=1\n")
    with pytest.raises(ValueError, match="unknown setting"):
        parse("--config", str(props))
    with pytest.raises(SystemExit):  # argparse names the choices in its error
        parse("--fsync", "sometimes")
    props.write_text("gateway.fsync=sometimes\n")
    with pytest.raises(ValueError, match="never, always"):
        parse("--config", str(props))


def test_connection_limits_have_kafkas_names_defaults_and_checks():
    cfg = parse()
    assert cfg.max_connections == cfg.max_connections_per_ip == 2**31 - 1  # Int.MaxValue
    assert cfg.max_connections_per_ip_overrides == ""
    assert cfg.properties()["max.connections.per.ip"] == "2147483647"
    assert cfg.ssl_handshake_timeout_ms == 10_000
    assert cfg.transactional_id_max_bytes == 4096
    cfg = parse("--max-connections-per-ip", "0",
                "--max-connections-per-ip-overrides", "10.0.0.1:5,::1:7, localhost:2")
    assert cfg.max_connections_per_ip == 0
    # Kafka's parseCsvMap: the last ':' splits (IPv6 addresses keep theirs)
    assert quotas.parse_overrides(cfg.max_connections_per_ip_overrides) == {
        "10.0.0.1": 5, "::1": 7, "localhost": 2}
    assert quotas.canonical("::ffff:127.0.0.1") == "127.0.0.1"
    with pytest.raises(ValueError, match=r"only if max\.connections\.per\.ip\.overrides"):
        parse("--max-connections-per-ip", "0")
    with pytest.raises(ValueError, match="HOST_OR_IP:COUNT"):
        parse("--max-connections-per-ip-overrides", "10.0.0.1=5")
    with pytest.raises(ValueError, match="at least 0"):
        parse("--max-connections", "-1")
    with pytest.raises(ValueError, match=r"1\.\.32767"):
        parse("--transactional-id-max-bytes", "32768")
    with pytest.raises(ValueError, match="must be positive"):
        parse("--ssl-handshake-timeout-ms", "0")
    assert cfg.fetch_max_bytes == 57_671_680  # Kafka's default
    assert parse("--fetch-max-bytes", "1024").fetch_max_bytes == 1024
    with pytest.raises(ValueError, match=r"fetch\.max\.bytes must be at least 1024"):
        parse("--fetch-max-bytes", "1023")


@pytest.mark.parametrize(
    ("name", "value"),
    [("retention.ms", "abc"), ("retention.ms", "-5"), ("cleanup.policy", "compact,shrink"),
     ("no.such.config", "1"), ("preallocate", "maybe"), ("compression.type", "brotli")],
)
def test_invalid_topic_configs(name, value):
    with pytest.raises(InvalidConfig):
        validate(name, value)


def test_valid_topic_configs():
    for name, value in [("retention.ms", "-1"), ("cleanup.policy", "delete"),
                        ("message.timestamp.type", "LogAppendTime"), ("retention.bytes", "-1")]:
        validate(name, value)


def test_open_transaction_limits(tmp_path):
    """gateway.txn.max.bytes and gateway.txn.pending.disk.bytes: defaults, the
    flag and the property, -1 for no limit, anything below refused."""
    cfg = parse()
    assert (cfg.txn_max_bytes, cfg.txn_pending_disk_bytes) == (1 << 30, 4 << 30)
    props = tmp_path / "gateway.properties"
    props.write_text("gateway.txn.max.bytes=-1\ngateway.txn.pending.disk.bytes=5000\n")
    cfg = parse("--config", str(props), "--txn-pending-disk-bytes", "7000")
    assert (cfg.txn_max_bytes, cfg.txn_pending_disk_bytes) == (-1, 7000)
    assert cfg.properties()["gateway.txn.max.bytes"] == "-1"
    assert cfg.properties()["gateway.txn.pending.disk.bytes"] == "7000"
    with pytest.raises(ValueError, match=r"gateway\.txn\.max\.bytes must be -1"):
        parse("--txn-max-bytes", "-2")
