"""Running the Java test programs (jvm/src/javaclient/) and reading what they print.

Each program prints one JSON object per stdout line (its logging goes to
stderr). Every run has a timeout; a failure quotes the program's stderr and
the gateway's log tail.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from testkit import jvm
from testkit.gateway import GatewayProcess

PACKAGE = "javaclient"  # the package of a program named without one


def main_class(program: str) -> str:
    """``program`` qualified: "ProduceCheck" is javaclient's, "javatxn.TxnCheck" as named."""
    return program if "." in program else f"{PACKAGE}.{program}"


def _failure(what: str, stderr: str, gateway: GatewayProcess) -> str:
    return (f"{what}; stderr tail:\n{stderr[-6000:]}\n"
            f"gateway log tail:\n{gateway.output()[-3000:]}")


def _parse(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def run_java(gateway: GatewayProcess, classes: Path, program: str, command: str,
             *args: str, timeout: float = 180) -> list[dict]:
    """Run ``PROGRAM COMMAND --bootstrap GATEWAY ARGS``; it must exit 0.

    ``gateway`` is anything with ``bootstrap`` and ``output()``: a GatewayProcess
    or the reference broker (testkit.kafka_broker.KafkaBroker)."""
    line = jvm.java_command(main_class(program), command, "--bootstrap", gateway.bootstrap,
                            *args, classes=classes)
    name = f"{program} {command} {' '.join(args)}"
    try:
        done = subprocess.run(line, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (
            exc.stderr or "")
        raise AssertionError(_failure(f"{name} did not finish in {timeout}s", stderr,
                                      gateway)) from None
    assert done.returncode == 0, _failure(f"{name} exited {done.returncode}", done.stderr,
                                          gateway)
    return _parse(done.stdout)


def by_op(lines: list[dict]) -> dict[str, list[dict]]:
    """The lines of each "op", in order."""
    out: dict[str, list[dict]] = {}
    for line in lines:
        if "op" in line:
            out.setdefault(line["op"], []).append(line)
    return out


def step(lines: list[dict], op: str) -> dict:
    """The one line of ``op``, without its "op" key."""
    [found] = [dict(line) for line in lines if line.get("op") == op]
    del found["op"]
    return found


class LinesProcess:
    """A program running in the background, its JSON stdout lines collected as
    they come (any program: a Java one is ``JavaProcess``).

    Its stdin stays open: ``finish()`` writes "stop" and closes it, and the
    program ends by itself. ``gateway`` is the server it talks to (its log
    tail goes into a failure).
    """

    def __init__(self, gateway: GatewayProcess, name: str, command: list[str]) -> None:
        self.gateway = gateway
        self.name = name
        self.lines: list[dict] = []
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        self._stderr: list[str] = []
        self._threads = [threading.Thread(target=self._read_stdout, daemon=True),
                         threading.Thread(target=self._read_stderr, daemon=True)]
        for thread in self._threads:
            thread.start()

    def _read_stdout(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.strip():
                self.lines.append(json.loads(line))

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self._stderr.append(line)

    def stderr(self) -> str:
        return "".join(self._stderr)

    def wait_until(self, condition: Callable[[list[dict]], bool], timeout: float,
                   what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition(list(self.lines)):
            if self.process.poll() is not None:
                time.sleep(0.5)  # let the readers take the last lines
                if condition(list(self.lines)):
                    return
                raise AssertionError(_failure(
                    f"{self.name} exited {self.process.returncode} before {what}",
                    self.stderr(), self.gateway))
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(_failure(f"{self.name}: no {what} in {timeout}s",
                                              self.stderr(), self.gateway))
            time.sleep(0.05)

    def finish(self, timeout: float = 120) -> list[dict]:
        """Tell the program to stop; wait for it to exit 0; every line it printed."""
        assert self.process.stdin is not None
        try:
            self.process.stdin.write("stop\n")
            self.process.stdin.close()
        except BrokenPipeError:
            pass
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(_failure(f"{self.name} did not stop in {timeout}s",
                                          self.stderr(), self.gateway)) from None
        for thread in self._threads:
            thread.join(timeout=10)
        assert code == 0, _failure(f"{self.name} exited {code}", self.stderr(), self.gateway)
        return list(self.lines)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


class JavaProcess(LinesProcess):
    """A Java program (jvm/src) running in the background: ``PROGRAM COMMAND
    --bootstrap GATEWAY ARGS``."""

    def __init__(self, gateway: GatewayProcess, classes: Path, program: str, command: str,
                 *args: str) -> None:
        super().__init__(gateway, f"{program} {command}", jvm.java_command(
            main_class(program), command, "--bootstrap", gateway.bootstrap, *args,
            classes=classes))
