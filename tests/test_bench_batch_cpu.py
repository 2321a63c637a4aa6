"""`python -m bench.batch_cpu` (server CPU per produced batch from a raw socket)
runs end to end: every request it counts was acknowledged on every partition
(it checks each answer's error codes), and it reports positive figures. No
timing is asserted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
_LINE = re.compile(r"run (\d+): ([\d.]+) us server CPU per batch, (\d+) requests/s, "
                   r"client ([\d.]+) us per batch, outside load ([\d.]+) cores, "
                   r"([\d.]+) page faults per request")


@pytest.mark.parametrize("shape", [
    ["--batches-per-request", "4"],  # Produce v7, one-record batches
    ["--row"],  # Produce v9, one 15-record batch a request
])
def test_batch_cpu_reports_each_run(shape: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.batch_cpu", "--runs", "2", "--seconds", "1",
         "--warmup", "0.5", "--partitions", "6", *shape],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    runs = [_LINE.fullmatch(line) for line in proc.stdout.splitlines()]
    assert len(runs) == 2 and all(runs), proc.stdout
    for match in runs:
        assert match is not None
        assert float(match.group(2)) > 0 and int(match.group(3)) > 0, match.group(0)
