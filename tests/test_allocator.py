"""glibc's malloc thresholds, fixed at start-up (kafka_gateway/allocator.py).

What the tuning is for, asserted in fresh processes: a freed block of a
record batch's size is reused by the next one, not given back to the kernel
and faulted in again. Each process first proves the premise: with glibc's
own thresholds, the same blocks are faulted in again at every round.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from testkit.gateway import GatewayProcess

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = 40  # of 1 MiB: a produce burst's worth of batches
PAGES = BLOCKS * (1 << 20) // 4096

# Allocates and frees BLOCKS batch-sized blocks twice, and reports the minor
# page faults of the second round: pages the kernel had to map (and zero) again.
_PROBE = """
import json, resource, sys
from kafka_gateway.allocator import tune_malloc
tuned = tune_malloc() if sys.argv[1] == "tune" else None

def burst():
    blocks = [b"x" * (1 << 20) for _ in range(int(sys.argv[2]))]  # malloc'ed, every page written
    del blocks

burst()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
burst()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({"tuned": tuned, "faults": faults}))
"""


def _probe(mode: str, tunables: str | None = None) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    if tunables is not None:
        env["GLIBC_TUNABLES"] = tunables
    out = subprocess.run([sys.executable, "-c", _PROBE, mode, str(BLOCKS)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60, check=True)
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_a_freed_batch_sized_block_is_reused_instead_of_faulted_in_again() -> None:
    default = _probe("default")
    assert isinstance(default["faults"], int)
    # The premise: glibc's defaults give the blocks back, so the kernel maps them again.
    assert default["faults"] > PAGES * 0.9, default
    tuned = _probe("tune")
    assert tuned["tuned"] is True
    assert isinstance(tuned["faults"], int)
    assert tuned["faults"] < PAGES * 0.05, tuned


def test_an_operators_glibc_tunables_are_kept() -> None:
    # Only the trim threshold: glibc's moving mmap threshold is off, so every
    # block is an mmap of its own, faulted in at every round; tune_malloc must
    # leave that as the operator chose it.
    kept = _probe("tune", "glibc.malloc.trim_threshold=1048576")
    assert kept["tuned"] is False
    assert isinstance(kept["faults"], int)
    assert kept["faults"] > PAGES * 0.9, kept


def test_the_served_gateway_fixes_its_thresholds(tmp_path: Path) -> None:
    with GatewayProcess(tmp_path / "data") as gateway:
        output = gateway.output()
    assert "allocator: glibc malloc mmap threshold 32 MiB, trim threshold 64 MiB" in output, (
        output[-2000:])
