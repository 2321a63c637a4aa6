"""The compaction benchmark works end to end (`python -m bench.compaction`): both
servers write, switch the topic to compact, compact it and report a run, and the
summary gives medians and the gateway's ratios to Kafka. No timing is asserted.
Apache Kafka is a hard requirement here, as in test_bench_smoke.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_both_servers_compact_and_are_compared(tmp_path: Path) -> None:
    out = tmp_path / "compaction.json"
    code = "import sys\nfrom bench.compaction import main\nmain(sys.argv[1:])"
    proc = subprocess.run(
        [sys.executable, "-c", code, "--mib", "6", "--keys", "500", "--segment-mib", "1",
         "--baseline", "0.5", "--repeat", "2", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    results = json.loads(out.read_text())
    assert len(results["runs"]) == 2
    for run in results["runs"]:
        assert [r["server"] for r in run] == ["gateway", "kafka"]
        for result in run:
            # Both compacted the closed 1 MiB segments of ~6 MiB: most of the log.
            assert 3 < result["log_mb"] < 8, result
            assert result["mb_per_s"] > 0, result
    summary = results["summary"]
    assert set(summary) == {"gateway", "kafka", "gateway/kafka"}
    assert summary["gateway/kafka"]["mb_per_s"] == round(
        summary["gateway"]["mb_per_s"] / summary["kafka"]["mb_per_s"], 2)
    assert "gateway's ratio to Kafka" in proc.stdout
