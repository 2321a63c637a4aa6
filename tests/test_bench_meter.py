"""bench.meter.sample_tree: a server made of several processes (PostgreSQL's
postmaster and its children) is measured as a whole.

A small tree is forked for real: the root forks a child that burns CPU and exits
(the root waits for it: its time is only in the root's children times), then a
child that forks a grandchild burning CPU and staying alive. The tree's CPU must
hold both burns; a sample of the root process alone must hold neither.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from bench import meter
from bench.meter import ProcSample, process_tree, sample_process, sample_tree

BURN_S = 0.3  # CPU seconds each burning process uses, measured by itself

# The root prints "<child pid> <grandchild pid>" once the exited child was waited
# for and the grandchild has burnt its CPU, then sleeps (as do the other two).
_TREE = f"""
import os, sys, time

def burn():
    start = time.process_time()
    while time.process_time() - start < {BURN_S}:
        pass

exited = os.fork()
if exited == 0:
    burn()
    os._exit(0)
os.waitpid(exited, 0)
read, write = os.pipe()
child = os.fork()
if child == 0:
    grandchild = os.fork()
    if grandchild == 0:
        burn()
        os.write(write, b"%d\\n" % os.getpid())
        time.sleep(120)
        os._exit(0)
    time.sleep(120)
    os._exit(0)
grandchild = int(os.fdopen(read).readline())
print(child, grandchild, flush=True)
time.sleep(120)
"""


@pytest.fixture
def tree() -> Iterator[tuple[int, int, int]]:
    root = subprocess.Popen([sys.executable, "-c", _TREE], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert root.stdout is not None
        line = root.stdout.readline()
        assert line, f"the tree did not start (exit code {root.poll()})"
        child, grandchild = (int(v) for v in line.split())
        yield root.pid, child, grandchild
    finally:
        with contextlib.suppress(ProcessLookupError):  # a test may have killed it
            os.killpg(root.pid, signal.SIGKILL)  # its own session: the three processes
        root.wait(timeout=10)


def test_process_tree_lists_the_root_and_every_live_descendant(
        tree: tuple[int, int, int]) -> None:
    root, child, grandchild = tree
    assert process_tree(root) == [root, child, grandchild]
    assert process_tree(grandchild) == [grandchild]


def test_tree_cpu_counts_live_descendants_and_children_that_exited(
        tree: tuple[int, int, int]) -> None:
    root, child, grandchild = tree
    names = {root: "root", child: "child", grandchild: "grandchild"}
    sample = sample_tree(root, name=names.__getitem__)
    assert sample.pids == (root, child, grandchild)
    tick = 1 / os.sysconf("SC_CLK_TCK")
    # The exited child's burn is in the root's children times, the grandchild's in
    # its own times: each at least BURN_S, less one clock tick of rounding.
    assert sample.cpu_by_name["root"] >= BURN_S - tick, sample
    assert sample.cpu_by_name["grandchild"] >= BURN_S - tick, sample
    assert sample.cpu_s == pytest.approx(sum(sample.cpu_by_name.values()))
    assert sample.cpu_s >= 2 * (BURN_S - tick), sample
    # The root alone (user + system, no children times) burnt nothing itself.
    assert sample_process(root).cpu_s < BURN_S / 2
    # Three Python interpreters: each has some memory of its own.
    assert sample.pss_bytes > 3 * 1024 * 1024, sample
    assert sample_tree(grandchild).cpu_s >= BURN_S - tick


def test_a_tree_whose_root_is_gone_fails_loudly(tree: tuple[int, int, int]) -> None:
    root, *_ = tree
    os.killpg(root, signal.SIGKILL)
    os.waitpid(root, 0)  # reaped: /proc/<root> is gone
    with pytest.raises(OSError):
        sample_tree(root)


class _Busy:
    """A server that stays busy for ``busy_windows`` windows of settle, then idles;
    its clock is the fake sleep's."""

    def __init__(self, busy_windows: int) -> None:
        self.busy_windows = busy_windows
        self.cpu_s = 0.0
        self.pid = os.getpid()

    def sleep(self, seconds: float) -> None:
        if self.busy_windows:
            self.busy_windows -= 1
            self.cpu_s += seconds * 0.8  # 0.8 cores while busy
        else:
            self.cpu_s += seconds * 0.01

    def sample(self) -> ProcSample:
        return ProcSample(cpu_s=self.cpu_s, rss_bytes=0, peak_rss_bytes=0)


def test_settle_waits_for_a_busy_server_to_go_idle() -> None:
    clock = [0.0]
    server = _Busy(busy_windows=3)

    def sleep(seconds: float) -> None:
        clock[0] += seconds
        server.sleep(seconds)

    waited = meter.settle(server, sleep=sleep, clock=lambda: clock[0])  # type: ignore[arg-type]
    assert server.busy_windows == 0  # the premise: it was busy, then idle
    assert waited == pytest.approx(4 * meter.SETTLE_WINDOW_S)  # three busy windows, one idle
    never_idle = _Busy(busy_windows=10_000)

    def sleep_busy(seconds: float) -> None:
        clock[0] += seconds
        never_idle.sleep(seconds)

    waited = meter.settle(never_idle, sleep=sleep_busy,  # type: ignore[arg-type]
                          clock=lambda: clock[0])
    assert waited == pytest.approx(meter.SETTLE_MAX_S)  # bounded: it gives up
