"""Run ``kafka-gateway`` commands as a user would: a subprocess of this checkout."""

from __future__ import annotations

import subprocess
import sys

TIMEOUT = 60


def run_cli(bootstrap: str | None, *args: str, check: bool = True, input: str | None = None,
            timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
    """``kafka-gateway ARGS --bootstrap-server BOOTSTRAP``; asserts exit 0 when ``check``."""
    command = [sys.executable, "-m", "kafka_gateway", *args]
    if bootstrap is not None:
        command += ["--bootstrap-server", bootstrap]
    result = subprocess.run(command, capture_output=True, text=True, input=input,
                            timeout=timeout)
    if check:
        assert result.returncode == 0, f"{command}: {result.stderr}"
    return result
