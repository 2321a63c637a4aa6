"""Which of our servers each peer is divided by (bench.server_base.PEERS), and what
the bench says when Tansu on PostgreSQL is not built here. The run itself against
tansu-pg is measured by hand (docs/performance.md), not in CI: its binary is built
from crates.io, and its schema is in no registry's package."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import report, tansu_servers
from bench.runner import ratios
from bench.servers import ServerMissingError


def _best(**metrics: float) -> dict[str, Any]:
    return {"best": metrics}


def test_each_peer_divides_its_own_counterpart() -> None:
    results = {"gateway": _best(mb_per_s=300.0), "gateway-pg": _best(mb_per_s=200.0),
               "kafka": _best(mb_per_s=600.0), "tansu-pg": _best(mb_per_s=50.0)}
    assert ratios(results, ["mb_per_s"]) == {"kafka": {"mb_per_s": 0.5},
                                             "tansu-pg": {"mb_per_s": 4.0}}


def test_the_table_names_each_ratio_by_its_pair() -> None:
    results = {"servers": ["gateway", "gateway-pg", "kafka", "tansu-pg"]}
    assert report.header(results)[-2:] == ["gateway/kafka", "gateway-pg/tansu-pg"]
    # A peer whose counterpart did not run gets no column.
    assert report.header({"servers": ["gateway", "tansu-pg"]}) == [
        "workload", "metric", "gateway", "tansu-pg"]


def test_a_missing_tansu_pg_says_how_to_build_it(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tansu_servers, "TANSU_PG_DIR", tmp_path)
    with pytest.raises(ServerMissingError) as missing:
        tansu_servers.tansu_pg_files()
    message = str(missing.value)
    assert f"cargo install tansu --version 0.6.0 --features postgres --locked --root {tmp_path}" \
        in message
    assert "etc/initdb.d/010-schema.sql" in message
    # With both files in place it names them, binary first.
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "tansu").write_bytes(b"")
    (tmp_path / "010-schema.sql").write_text("begin; commit;")
    assert tansu_servers.tansu_pg_files() == (tmp_path / "bin" / "tansu",
                                              tmp_path / "010-schema.sql")
