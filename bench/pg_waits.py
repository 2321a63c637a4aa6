"""Where the gateway over PostgreSQL waits during a flat-out produce (docs/performance.md,
"The gateway over PostgreSQL"):

    python -m bench.pg_waits [--partitions 1] [--seconds 10]

Starts gateway-pg (bench.servers.GatewayPgServer: one gateway on a throwaway
PostgreSQL), produces flat out as the produce workload does, and reports for the
gateway's event loop and each busy PostgreSQL process the share of the wall time it
spent on a CPU and waiting for one (/proc/PID/schedstat), and for PostgreSQL's client
sessions their state sampled every 5 ms: running or runnable (R), waiting for the disk
(D), sleeping (S: a session waiting for the gateway's next statement).
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from bench import clients
from bench.meter import command_line, process_tree
from bench.procs import run_child
from bench.servers import GatewayPgServer
from bench.workloads import MIB, Context, Settings

SAMPLE_S = 0.005


def _schedstat(pids: list[int]) -> dict[int, tuple[int, int]]:
    """{pid: (ns on a CPU, ns waiting for a CPU)} of each process's main thread."""
    out = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/schedstat") as f:
                on_cpu, waiting, _slices = f.read().split()
        except OSError:  # ended meanwhile
            continue
        out[pid] = (int(on_cpu), int(waiting))
    return out


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


class _SessionStates:
    """Samples the state of PostgreSQL's client sessions on a thread."""

    def __init__(self, sessions: list[int]) -> None:
        self.sessions = sessions
        self.counts: dict[int, Counter[str]] = {pid: Counter() for pid in sessions}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid in self.sessions:
                state = _state(pid)
                if state is not None:
                    self.counts[pid][state] += 1
            time.sleep(SAMPLE_S)

    def __enter__(self) -> _SessionStates:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def measure(partitions: int, seconds: float) -> list[str]:
    """The report's lines (see the module's docstring)."""
    lines = []
    with tempfile.TemporaryDirectory(prefix="kafka-bench-") as work_dir:
        server = GatewayPgServer(Path(work_dir), [])
        try:
            server.start()
            ctx = Context(Settings(), {server.name: server})
            topic = ctx.create_topic(server, "waits", partitions)
            assert server.postgres is not None and server.postgres.pid is not None
            postgres = process_tree(server.postgres.pid)
            sessions = [pid for pid in postgres if "127.0.0.1(" in command_line(pid)]
            watched = [server.pid, *postgres]
            before, started = _schedstat(watched), time.perf_counter()
            with _SessionStates(sessions) as states:
                run = run_child(clients.produce_throughput, 120 + seconds * 10,
                                bootstrap=server.bootstrap, topic=topic,
                                partitions=partitions, seconds=seconds, record_size=1024,
                                linger_ms=5, batch_size=MIB)
                after, wall = _schedstat(watched), time.perf_counter() - started
            lines.append(f"{partitions} partition(s): "
                         f"{run['bytes'] / run['elapsed_s'] / 1e6:.1f} MB/s over {wall:.1f} s")
            for pid, (on_cpu, waiting) in after.items():
                on0, wait0 = before.get(pid, (0, 0))
                if on_cpu - on0 < 0.02 * wall * 1e9:
                    continue  # idle: not worth a line
                name = "gateway event loop" if pid == server.pid else command_line(pid)[:48]
                lines.append(f"  {name}: on a CPU {(on_cpu - on0) / 1e9 / wall:.0%}, "
                             f"waiting for a CPU {(waiting - wait0) / 1e9 / wall:.0%}")
            for pid, counts in states.counts.items():
                total = sum(counts.values())
                if total and counts["S"] < total:  # a session that did something
                    shares = ", ".join(f"{state} {n / total:.0%}"
                                       for state, n in counts.most_common())
                    lines.append(f"  session {pid} states: {shares}")
        finally:
            server.stop()
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pg_waits", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args(argv)
    print("\n".join(measure(args.partitions, args.seconds)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
