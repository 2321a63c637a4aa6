"""Run the README's commands and code blocks in order, as a reader would.

    unshare -n python3 -m testkit.readme_run README.md WORKDIR REPORT.json

Meant to run in a network namespace of its own (``unshare -n``), so the
README's addresses (127.0.0.1:9092, :9644) are used as written without
meeting anything else on the machine. Each ``sh`` block runs line by line
(``\\`` continues a line) with bash in WORKDIR, each ``python`` block with
python3; ``kafka-gateway`` is this checkout's (``python3 -m kafka_gateway``).
Two lines are not run, and reported as skipped: ``pip install .`` (it would
replace the machine's installed gateway with this checkout) and
``./tests/run_all.sh`` (the test command itself). ``kafka-gateway serve`` is
started in the background, as the README says to (a terminal of its own), and
stopped at the end.

The report lists every step: its kind, text, exit code and output.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIPPED = {"pip install .": "installs the checkout machine-wide; the test runs it in place",
           "./tests/run_all.sh": "the test command itself"}
STEP_TIMEOUT = 120
_BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.M | re.S)


def blocks(readme: str) -> list[tuple[str, str]]:
    """(language, code) of every fenced block, in order."""
    return [(m.group(1), m.group(2)) for m in _BLOCK.finditer(readme)]


def commands(code: str) -> list[str]:
    """The shell lines of a block, continuation lines joined."""
    out, pending = [], ""
    for line in code.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        line = (pending + line).strip()
        pending = ""
        if line and not line.startswith("#"):
            out.append(line)
    return out


def _shim(workdir: Path) -> dict[str, str]:
    """An environment whose ``kafka-gateway`` is this checkout."""
    bin_dir = workdir / ".bin"
    bin_dir.mkdir(exist_ok=True)
    shim = bin_dir / "kafka-gateway"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m kafka_gateway "$@"\n')
    shim.chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}:{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT)
    return env


def _start_gateway(command: str, workdir: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    process = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=workdir, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if "kafka-gateway ready" in line:
            return process
        if not line and process.poll() is not None:
            break
    process.kill()
    raise RuntimeError(f"the gateway did not start: {command}")


def run(readme_path: Path, workdir: Path) -> list[dict]:
    env = _shim(workdir)
    steps: list[dict] = []
    gateway: subprocess.Popen[str] | None = None
    try:
        for language, code in blocks(readme_path.read_text()):
            if language == "python":
                result = subprocess.run([sys.executable, "-c", code], cwd=workdir, env=env,
                                        capture_output=True, text=True, timeout=STEP_TIMEOUT)
                steps.append({"kind": "python", "text": code, "returncode": result.returncode,
                              "stdout": result.stdout, "stderr": result.stderr})
                continue
            if language != "sh":
                continue
            for command in commands(code):
                installed, sep, rest = command.partition(" && ")
                if sep and installed in SKIPPED:  # "pip install . && kafka-gateway serve"
                    steps.append({"kind": "skipped", "text": installed,
                                  "reason": SKIPPED[installed]})
                    command = rest
                if command in SKIPPED:
                    steps.append({"kind": "skipped", "text": command,
                                  "reason": SKIPPED[command]})
                elif command.startswith("kafka-gateway serve"):
                    assert gateway is None, "the README starts the gateway twice"
                    gateway = _start_gateway(command, workdir, env)
                    steps.append({"kind": "serve", "text": command, "returncode": 0,
                                  "stdout": "", "stderr": ""})
                else:
                    result = subprocess.run(
                        ["bash", "-c", f"set -euo pipefail\n{command}"], cwd=workdir, env=env,
                        capture_output=True, text=True, timeout=STEP_TIMEOUT)
                    steps.append({"kind": "sh", "text": command,
                                  "returncode": result.returncode, "stdout": result.stdout,
                                  "stderr": result.stderr})
    finally:
        if gateway is not None:
            gateway.send_signal(signal.SIGTERM)
            try:
                gateway.wait(timeout=30)
            except subprocess.TimeoutExpired:
                gateway.kill()
    return steps


def main() -> None:
    readme, workdir, report = (Path(arg) for arg in sys.argv[1:4])
    # A fresh network namespace has its loopback down.
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    report.write_text(json.dumps(run(readme.resolve(), workdir), indent=2))


if __name__ == "__main__":
    main()
