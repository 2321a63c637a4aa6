"""What PostgreSQL spends per GB produced as gateways are added (docs/performance.md,
"1, 2 and 3 gateways on a quiet machine"):

    python -m bench.pg_cluster_cost [--gateways 1,2,3] [--partitions 1,8] [--seconds 8]

For each number of gateways and partitions: a fresh bench.servers.GatewayPgServer (a
throwaway PostgreSQL with its durable defaults, N gateways over it), one flat-out
produce run as the produce workload makes it (1 KiB records, linger 5 ms, 1 MiB
batches), and the CPU seconds per GB of each PostgreSQL process that worked (the
gateways' sessions are ``postgres: ... 127.0.0.1(port)``), with their sum. One run
each: it isolates PostgreSQL's cost per gateway count, without the full runner's
warm-up and rotation.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bench import clients
from bench.meter import command_line, process_tree, sample_process
from bench.procs import run_child
from bench.servers import GatewayPgServer
from bench.workloads import MIB, Context, Settings

SHOWN = 0.01  # CPU s/GB below which a PostgreSQL process is left out of the report


def _cpu_s(pids: list[int]) -> dict[int, float]:
    out = {}
    for pid in pids:
        try:
            out[pid] = sample_process(pid).cpu_s
        except OSError:  # ended meanwhile
            continue
    return out


def measure(gateways: int, partitions: int, seconds: float) -> list[str]:
    """The report's lines for one server and partition count."""
    with tempfile.TemporaryDirectory(prefix="kafka-bench-") as work_dir:
        server = GatewayPgServer(Path(work_dir), [], gateways=gateways)
        try:
            server.start()
            assert server.postgres is not None and server.postgres.pid is not None
            ctx = Context(Settings(), {server.name: server})
            topic = ctx.create_topic(server, "cost", partitions)
            root = server.postgres.pid
            before = _cpu_s(process_tree(root))
            run = run_child(clients.produce_throughput, 120 + seconds * 10,
                            bootstrap=server.bootstrap, topic=topic, partitions=partitions,
                            seconds=seconds, record_size=1024, linger_ms=5, batch_size=MIB)
            after = _cpu_s(process_tree(root))
            gb = run["bytes"] / 1e9
            spent = {pid: (cpu - before.get(pid, 0.0)) / gb for pid, cpu in after.items()}
            lines = [f"{gateways} gateway(s), {partitions} partition(s): "
                     f"{run['bytes'] / run['elapsed_s'] / 1e6:.0f} MB/s; PostgreSQL "
                     f"{sum(spent.values()):.2f} CPU s/GB (processes alive at the end)"]
            for pid, per_gb in sorted(spent.items(), key=lambda item: -item[1]):
                if per_gb >= SHOWN:
                    try:
                        name = command_line(pid)[:60]
                    except OSError:
                        name = f"pid {pid} (ended)"
                    lines.append(f"  {per_gb:.2f} s/GB  {name}")
            return lines
        finally:
            server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pg_cluster_cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gateways", default="1,2,3", help="comma-separated counts")
    parser.add_argument("--partitions", default="1,8", help="comma-separated counts")
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args(argv)
    for partitions in map(int, args.partitions.split(",")):
        for gateways in map(int, args.gateways.split(",")):
            print("\n".join(measure(gateways, partitions, args.seconds)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
