"""CPU and memory of the servers under test, read from /proc: per process, per thread,
per process tree (a server made of several processes, as PostgreSQL is), and for the
whole host (to see load from outside the benchmark)."""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcSample:
    """CPU seconds (user + system, all threads) and memory of one process at one moment."""

    cpu_s: float
    rss_bytes: int
    peak_rss_bytes: int


def sample_process(pid: int) -> ProcSample:
    # /proc/PID/stat: the command name (field 2) may hold spaces, so split after its ')'.
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of the full line
    status: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                status[key] = int(value.split()[0]) * 1024  # reported in kB
    return ProcSample(cpu_s=(utime + stime) / _CLOCK_TICKS,
                      rss_bytes=status.get("VmRSS", 0), peak_rss_bytes=status.get("VmHWM", 0))


@dataclass(frozen=True)
class TreeSample:
    """A process and all its descendants at one moment.

    cpu_s: user + system CPU seconds of every live process of the tree, plus the
    children times (cutime + cstime) of each: a child that exited and was waited for
    by its parent (a PostgreSQL backend that ended, reaped by the postmaster) stays
    counted in its parent's. A process that ends between the listing and its reading
    is missed in that one sample. cpu_by_name splits cpu_s by `name` (a process's
    children times go to its own name).

    pss_bytes: the sum of each process's proportional set size (Pss in
    /proc/PID/smaps_rollup): memory shared by several processes of the tree
    (PostgreSQL's shared buffers) counts once in all, where a sum of RSS would count
    it once per process that touched it. The kernel keeps no peak of it.
    """

    pids: tuple[int, ...]
    cpu_s: float
    pss_bytes: int
    cpu_by_name: Counter[str]


def _stat_fields(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name (field 3 onwards): the
    name (field 2) may hold spaces and parentheses, so split after its last ')'."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def process_tree(root: int) -> list[int]:
    """`root` and every live descendant of it, parents before their children (one
    scan of /proc for everyone's parent)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ppid = int(_stat_fields(int(entry))[1])
        except (OSError, IndexError, ValueError):  # ended meanwhile
            continue
        children.setdefault(ppid, []).append(int(entry))
    tree, index = [root], 0
    while index < len(tree):
        tree.extend(sorted(children.get(tree[index], ())))
        index += 1
    return tree


def command_line(pid: int) -> str:
    """/proc/PID/cmdline with spaces for NULs: the title a process set for itself
    (PostgreSQL's "postgres: walwriter")."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode(errors="replace").strip()


def _pss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024  # reported in kB
    return 0


def sample_tree(root: int, name: Callable[[int], str] | None = None) -> TreeSample:
    """CPU and memory of `root` and its descendants (see TreeSample); `name(pid)`
    labels each process in cpu_by_name (default: its command name, as the kernel
    has it). Raises OSError when `root` itself is gone."""
    _stat_fields(root)  # the root must exist: a server that died fails loudly
    pids: list[int] = []
    cpu, pss = 0.0, 0
    by_name: Counter[str] = Counter()
    for pid in process_tree(root):
        try:
            fields = _stat_fields(pid)
            label = name(pid) if name is not None else _comm(pid)
            memory = _pss_bytes(pid)
        except OSError:  # ended meanwhile: its times are its parent's children times now
            if pid == root:
                raise
            continue
        # utime, stime, cutime, cstime: fields 14 to 17 of the full line
        seconds = sum(int(v) for v in fields[11:15]) / _CLOCK_TICKS
        pids.append(pid)
        cpu += seconds
        pss += memory
        by_name[label] += seconds
    return TreeSample(pids=tuple(pids), cpu_s=cpu, pss_bytes=pss, cpu_by_name=by_name)


def _comm(pid: int) -> str:
    with open(f"/proc/{pid}/comm") as f:
        return f.read().strip()


THREAD_CPU_PREFIX = "thread_cpu_s:"


def thread_cpu_s(pid: int) -> Counter[str]:
    """CPU seconds per thread name of one process, numbered threads summed ("GC Thread#0"
    and "GC Thread#1" are "GC Thread"). Names are the kernel's, cut at 15 characters;
    the main thread is "<name> main" (the gateway's event loop: its other Python
    threads share its name)."""
    out: Counter[str] = Counter()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                text = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        name = re.sub(r"[\s#:_-]*\d*$", "", text[text.index("(") + 1:text.rindex(")")])
        if tid == str(pid):
            name += " main"
        fields = text.rsplit(")", 1)[1].split()
        out[name or "?"] += (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
    return out


def host_busy_cpu_s() -> float:
    """CPU seconds all processes of the host ran (user + nice + system) since boot.

    irq/softirq time (loopback networking lands there) and steal are left out: they
    belong to no process, so they would show up as load from "other processes".
    """
    with open("/proc/stat") as f:
        user, nice, system = (int(v) for v in f.readline().split()[1:4])
    return (user + nice + system) / _CLOCK_TICKS


class Measured(Protocol):
    """What a Meter reads of a server under test (bench.servers.Server is one). A
    protocol, not an import of servers.py, which imports this module to sample itself."""

    pid: int

    def sample(self) -> ProcSample: ...

    def threads(self) -> Counter[str]: ...


# A measured section starts once the server is idle: below SETTLE_CORES over
# SETTLE_WINDOW_S, waiting at most SETTLE_MAX_S. What the previous section left
# running (a deleted topic's rows being deleted in PostgreSQL, a JVM's compiler)
# is then not charged to the next one, whichever server it is.
SETTLE_CORES = 0.1
SETTLE_WINDOW_S = 0.5
SETTLE_MAX_S = 20.0


def settle(server: Measured, sleep: Callable[[float], None] = time.sleep,
           clock: Callable[[], float] = time.perf_counter) -> float:
    """Wait until ``server`` is idle (or ``SETTLE_MAX_S`` passed); the seconds waited."""
    start = last = clock()
    cpu = server.sample().cpu_s
    while True:
        sleep(SETTLE_WINDOW_S)
        now = clock()
        busy = server.sample().cpu_s
        if (busy - cpu) / max(now - last, 1e-9) < SETTLE_CORES or now - start >= SETTLE_MAX_S:
            return now - start
        cpu, last = busy, now


class Meter:
    """CPU accounting around one measured section of a run, which starts once the
    server is idle (``settle``: ``settle_s`` says how long that took).

    Besides the server's own CPU it keeps the whole host's busy time, so that load from
    processes outside the benchmark (another job on a shared machine) shows up as
    `other_cpu_util` instead of silently lowering the numbers.
    """

    def __init__(self, server: Measured) -> None:
        self._server = server

    def __enter__(self) -> Meter:
        self.settle_s = settle(self._server)
        self._t0 = time.perf_counter()
        self._threads0 = self._server.threads()
        self._server0 = self._server.sample()
        self._host0 = host_busy_cpu_s()
        self._ours0 = _our_cpu_s()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_s = time.perf_counter() - self._t0
        self.server_cpu_s = self._server.sample().cpu_s - self._server0.cpu_s
        # Where the server's CPU went: e.g. a JVM's JIT compiler and GC, RocksDB's flush,
        # PostgreSQL's backends and WAL writer.
        self.threads = self._server.threads()
        self.threads.subtract(self._threads0)
        ours = _our_cpu_s() - self._ours0  # the runner plus its (joined) client children
        host = host_busy_cpu_s() - self._host0
        self.other_cpu_s = max(0.0, host - self.server_cpu_s - ours)

    def metrics(self) -> dict[str, float]:
        wall = max(self.wall_s, 1e-9)
        return {"server_cpu_s": self.server_cpu_s, "server_cpu_util": self.server_cpu_s / wall,
                "other_cpu_util": self.other_cpu_s / wall, "settle_s": self.settle_s,
                **{THREAD_CPU_PREFIX + name: cpu for name, cpu in self.threads.items() if cpu}}


def _our_cpu_s() -> float:
    # os.times() counts children only once they are waited for; the runner joins every
    # client child before a Meter closes, so this is the runner plus all its clients.
    # The servers are children too but are only waited for at the very end.
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system
