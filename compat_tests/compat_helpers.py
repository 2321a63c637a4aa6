"""Helpers shared by the real-client tests: creating topics, running kcat.

Every subprocess has a timeout, so a client that hangs fails its test instead
of holding up the run.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

KCAT = shutil.which("kcat")
CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}  # batch attribute bits


def create_topic(gateway, name: str, partitions: int = 1,
                 configs: dict[str, str] | None = None) -> None:
    """Create a topic with the project's CLI (``kafka-gateway topics create``)."""
    command = [sys.executable, "-m", "kafka_gateway", "topics",
               "--bootstrap-server", gateway.bootstrap, "create", name,
               "--partitions", str(partitions)]
    for key, value in (configs or {}).items():
        command += ["--config", f"{key}={value}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"create {name} failed:\n{done.stdout}{done.stderr}"


def kcat(gateway, *args: str, input: bytes | str | None = None, timeout: float = 60,
         check: bool = True) -> subprocess.CompletedProcess[bytes]:
    """Run ``kcat -b BOOTSTRAP ARGS``; by default it must exit 0."""
    assert KCAT, "kcat is not installed: run `apt-get install -y kcat` (Debian's package)"
    if isinstance(input, str):
        input = input.encode()
    command = [KCAT, "-b", gateway.bootstrap, *args]
    try:
        done = subprocess.run(command, input=input, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(
            f"{' '.join(command)} did not finish in {timeout}s; stderr:\n"
            f"{(exc.stderr or b'').decode(errors='replace')}\n"
            f"gateway log tail:\n{gateway.output()[-3000:]}"
        ) from None
    if check:
        assert done.returncode == 0, (
            f"{' '.join(command)} exited {done.returncode}; stderr:\n"
            f"{done.stderr.decode(errors='replace')}\n"
            f"gateway log tail:\n{gateway.output()[-3000:]}"
        )
    return done
