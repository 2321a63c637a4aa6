"""testkit.pg_store_mode's cluster mode: a sibling's arguments, and the start
check that fails a gateway which is not one of a cluster of three (so a run
of the suite on ``postgresql-cluster`` can never pass on one gateway)."""

from __future__ import annotations

import pytest

from testkit import pg_store_mode, postgres
from testkit.gateway import GatewayProcess
from testkit.postgres import PostgresServer

pg_server = postgres.server_fixture("module")


def test_sibling_args_take_the_next_node_id_and_a_free_admin_port() -> None:
    args = ["--node-id", "4", "--admin-listen", "127.0.0.1:8080", "--num-partitions", "3"]
    assert pg_store_mode.node_id(args) == 4
    assert pg_store_mode.node_id(["--num-partitions", "3"]) == 0
    assert pg_store_mode.sibling_args(args, 5) == [
        "--admin-listen", "127.0.0.1:0", "--num-partitions", "3", "--node-id", "5"]
    assert pg_store_mode.sibling_args(["--admin-listen=127.0.0.1:9", "--node-id=1"], 2) == [
        "--admin-listen", "127.0.0.1:0", "--node-id", "2"]
    with pytest.raises(ValueError, match="--advertise"):
        pg_store_mode.sibling_args(["--advertise", "gw:9092"], 1)


def test_modes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(pg_store_mode.ENV, "postgresql-cluster")
    assert pg_store_mode.enabled() and pg_store_mode.cluster_enabled()
    assert pg_store_mode.forms_cluster(["--num-partitions", "3"])
    assert not pg_store_mode.forms_cluster(["--store", "postgresql://x/y"])
    monkeypatch.setenv(pg_store_mode.ENV, "postgresql")
    assert pg_store_mode.enabled() and not pg_store_mode.cluster_enabled()
    monkeypatch.setenv(pg_store_mode.ENV, "rocksdb")
    with pytest.raises(ValueError, match="postgresql-cluster"):
        pg_store_mode.enabled()


def test_outputs_include_the_siblings_logs(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path) -> None:
    """What a sibling logs (the transaction timeout of an id it coordinates)
    is in the first gateway's ``outputs``, after the first's own (issue 22:
    the timeout tests read only the first gateway's log and waited for ever
    when a sibling coordinated the id)."""
    monkeypatch.setenv(pg_store_mode.ENV, "postgresql-cluster")
    gateway = GatewayProcess(tmp_path / "data")
    assert len(gateway.siblings) == 2
    gateway._log("first\n")
    gateway.siblings[1]._log("transaction t-1 (producer 0 epoch 0) timed out\n")
    assert gateway.outputs() == [
        "first\n", "", "transaction t-1 (producer 0 epoch 0) timed out\n"]
    assert GatewayProcess(tmp_path / "alone", "--store", "postgresql://x/y").outputs() == [""]


def test_a_gateway_alone_fails_the_cluster_check(pg_server: PostgresServer, tmp_path) -> None:
    """One gateway on a database: Metadata lists node 0 only, so the check
    for three fails (with what it saw); with its two siblings it passes."""
    with GatewayProcess(tmp_path / "alone", "--store", pg_server.dsn_of("postgres")) as alone:
        with pytest.raises(AssertionError, match=r"did not all list the brokers \[0, 1, 2\]"):
            pg_store_mode.check_cluster([alone.host_port], {0, 1, 2}, timeout=2)
        pg_store_mode.check_cluster([alone.host_port], {0}, timeout=10)


def test_cluster_mode_starts_kills_and_restarts_three(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path) -> None:
    """With ``postgresql-cluster`` a GatewayProcess is three processes: all
    list the three at start, a kill ends all three, a restart brings the
    three back on the same ports, and a stop ends them."""
    monkeypatch.setenv(pg_store_mode.ENV, "postgresql-cluster")
    gateway = GatewayProcess(tmp_path / "data", "--num-partitions", "2")
    try:
        gateway.start()
        members = [gateway, *gateway.siblings]
        assert [pg_store_mode.node_id(m.extra_args) for m in members] == [0, 1, 2]
        ports = [m.port for m in members]
        assert len(set(ports)) == 3
        pg_store_mode.check_cluster([m.host_port for m in members], {0, 1, 2}, timeout=10)
        gateway.kill()
        assert all(m.process is not None and m.process.poll() is not None for m in members)
        gateway.start()
        assert [m.port for m in members] == ports
        pg_store_mode.check_cluster([m.host_port for m in members], {0, 1, 2}, timeout=10)
        assert gateway.stop() == 0
        assert all(m.process is not None and m.process.poll() is not None for m in members)
    finally:
        gateway.kill()
        pg_store_mode.stop()
