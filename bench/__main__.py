"""python -m bench: the gateway (embedded, and over PostgreSQL) against Apache Kafka and
Tansu, side by side, on this machine.

Examples:
  python -m bench                         # everything, ~12 min on 2 cores -> bench/results/
  python -m bench --smoke                 # every workload, tiny counts, no timing asserted
  python -m bench --only produce --partitions 8 --seconds 10
  python -m bench --only latency,e2e --servers gateway,kafka --repeat 1
  python -m bench --only produce --py-spy /tmp/gateway.svg   # profile the gateway meanwhile
  python -m bench --servers gateway-pg,kafka --only produce  # the gateway over PostgreSQL
  python -m bench --report bench/results/results.json          # redraw tables and charts
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench import report
from bench.runner import REPO, SCHEMA_VERSION, run_all
from bench.servers import (
    ALL_SERVERS,
    GATEWAY,
    GATEWAY_PG,
    SERVERS,
    TANSU_PG,
    ServerMissingError,
    ServerSet,
)
from bench.workloads import WORKLOAD_GROUPS, Settings, build

RESULTS_DIR = REPO / "bench" / "results"
SCRATCH_DIR = RESULTS_DIR / "scratch"  # partial and smoke runs: never the published numbers
DOCS = REPO / "docs" / "performance.md"

GROUP_HELP = """workload groups (for --only):
  ceiling     the Python client's own produce() rate with nothing listening
  produce     1. produce MB/s, 1 KiB records, acks=all, linger 5 ms, 1 MiB batches,
              once per --partitions value
  consume     2. consume MB/s from earliest over a dataset of --consume-mb
  latency     3. produce latency p50/p99/p99.9 at --rates of the slowest server's max rate
              (partitions: the largest --partitions value)
  e2e         4. end-to-end latency, producer process to a tail consumer process
  partitions  5. produce over 100 partitions with small batches (per-request overhead)
  efficiency  6. server CPU s per GB and peak RSS, derived from produce + consume runs
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=GROUP_HELP)
    parser.add_argument("--only", default=",".join(WORKLOAD_GROUPS),
                        help="comma-separated workload groups (default: all, see below)")
    parser.add_argument("--servers", default=",".join(SERVERS),
                        help=f"comma-separated servers to measure (default: {','.join(SERVERS)}; "
                        f"also {TANSU_PG}, Tansu on PostgreSQL: bench/tansu_servers.py)")
    parser.add_argument("--seconds", type=float, help="length of each measured run (default 5)")
    parser.add_argument("--repeat", type=int, help="runs per workload and server, best one "
                        "reported (default 3)")
    parser.add_argument("--partitions", help="partition counts for produce/consume "
                        "(default 1,8)")
    parser.add_argument("--consume-mb", type=float, help="MiB read by each consume run "
                        "(default 512)")
    parser.add_argument("--rates", help="latency rates in %% of the slowest server's max produce "
                        "rate (default 25,50,80)")
    parser.add_argument("--warmup", type=float, metavar="SECONDS",
                        help="unmeasured produce+consume per server before the runs, so that "
                        "Kafka's JIT has compiled its hot paths (default 15; 0: none)")
    parser.add_argument("--e2e-rate", type=float, help="records/s of the e2e run (default 2000)")
    parser.add_argument("--smoke", action="store_true",
                        help="CI smoke mode: every workload, every server, tiny counts, "
                        "one run each; proves the runner works, the numbers mean nothing")
    parser.add_argument("--out", type=Path, help="results directory (default: bench/results "
                        "for a full run, bench/results/scratch for --only/--smoke/other sizes)")
    parser.add_argument("--gateway-arg", action="append", default=[], metavar="ARG",
                        help="extra argument for `kafka_gateway serve`, repeatable, e.g. "
                        "--gateway-arg=--fsync=always")
    parser.add_argument("--py-spy", type=Path, metavar="FILE",
                        help="record the gateway with py-spy during the workloads "
                        "(.svg flamegraph, .json speedscope, else raw); slows it a little. "
                        f"The embedded one; {GATEWAY_PG}'s gateway when only that one runs")
    parser.add_argument("--py-spy-native", action="store_true",
                        help="with --py-spy: native frames too (RocksDB, libc); py-spy then "
                        "pauses the gateway at each sample, so its figures drop")
    parser.add_argument("--report", type=Path, metavar="JSON",
                        help="run nothing: write the table, Markdown and charts again from a "
                        "results.json (into --out, default its own directory)")
    parser.add_argument("--update-docs", action="store_true",
                        help=f"rewrite the results block of {DOCS.relative_to(REPO)}")
    parser.add_argument("--work-dir", type=Path,
                        help="keep the servers' data and logs here (default: a temp dir)")
    return parser.parse_args(argv)


def _csv(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def settings_from(args: argparse.Namespace) -> Settings:
    settings = Settings()
    if args.smoke:
        # Small enough for CI (< 90 s); big enough for many batches, 1000+ latency samples
        # and server CPU times well above the 10 ms tick of /proc/PID/stat.
        settings = Settings(seconds=0.5, repeat=1, consume_mb=128, e2e_rate=2000,
                            ceiling_seconds=0.5, server_warmup_s=0.3)
    overrides: dict[str, Any] = {
        "seconds": args.seconds, "repeat": args.repeat, "consume_mb": args.consume_mb,
        "e2e_rate": args.e2e_rate, "server_warmup_s": args.warmup,
        "partitions": tuple(int(p) for p in _csv(args.partitions)) if args.partitions else None,
        "rates": tuple(float(r) / 100 for r in _csv(args.rates)) if args.rates else None,
    }
    for key, value in overrides.items():
        if value is not None:
            setattr(settings, key, value)
    return settings


def _groups(args: argparse.Namespace) -> set[str]:
    groups = set(_csv(args.only))
    unknown = groups - set(WORKLOAD_GROUPS)
    if unknown:
        raise SystemExit(f"unknown workload group(s) {sorted(unknown)}; "
                         f"choose from {', '.join(WORKLOAD_GROUPS)}")
    if "efficiency" in groups:
        groups |= {"produce", "consume"}  # it is derived from their runs
    return groups


def _is_full_run(args: argparse.Namespace, groups: set[str], servers: list[str]) -> bool:
    sized = any(getattr(args, k) is not None for k in
                ("seconds", "repeat", "partitions", "consume_mb", "rates", "e2e_rate",
                 "warmup"))
    return (not args.smoke and not sized and not args.gateway_arg and not args.py_spy
            and groups == set(WORKLOAD_GROUPS) and servers == list(SERVERS))


@contextmanager
def py_spy(pid: int, output: Path | None, native: bool = False) -> Iterator[None]:
    """py-spy record of one process for the duration of the block (root or ptrace needed)."""
    if output is None:
        yield
        return
    fmt = {".svg": "flamegraph", ".json": "speedscope"}.get(output.suffix, "raw")
    output.parent.mkdir(parents=True, exist_ok=True)
    # Native stacks need the process stopped while they are read.
    mode = ["--native"] if native else ["--nonblocking"]
    spy = subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--output", str(output),
                            "--format", fmt, "--rate", "100", *mode])
    time.sleep(0.5)  # let it attach before the first measured run
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        try:
            spy.wait(30)
        except subprocess.TimeoutExpired:
            spy.kill()
        print(f"py-spy profile of the gateway: {output}")


def _report(results: dict[str, Any], out_dir: Path, update_docs: bool) -> None:
    """Write results.json and results.md (then the charts), print the table; a chart
    that cannot be drawn is reported, never fatal."""
    missing = report.write_all(results, out_dir)
    print()
    print("\n".join(report.summary_lines(results)))
    print()
    print(report.terminal_table(results))
    drawn = [str(out_dir / report.CHARTS[name]) for name, state in results["charts"].items()
             if state == report.DRAWN]
    print(f"\nresults: {out_dir / report.JSON_NAME}, {out_dir / report.MARKDOWN_NAME}; "
          f"charts: {', '.join(drawn) or '-'}")
    for name, reason in missing.items():
        print(f"warning: chart {name} {reason}", file=sys.stderr)
    if missing:
        hint = report.REDRAW_HINT.format(json=out_dir / report.JSON_NAME)
        print(f"to draw the charts: {hint}", file=sys.stderr)
    if update_docs:
        chart_dir = Path("..") / out_dir.resolve().relative_to(REPO)
        report.update_docs(results, DOCS, chart_dir.as_posix())
        print(f"updated {DOCS}")


def _redraw(args: argparse.Namespace) -> int:
    results = json.loads(args.report.read_text())
    if results.get("schema") != SCHEMA_VERSION:
        raise SystemExit(f"{args.report} has schema {results.get('schema')}, this runner "
                         f"reads {SCHEMA_VERSION}: run the benchmark again")
    _report(results, args.out or args.report.parent, args.update_docs)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report is not None:
        return _redraw(args)
    groups = _groups(args)
    requested = set(_csv(args.servers))
    if requested - set(ALL_SERVERS) or not requested:
        raise SystemExit(f"--servers takes one or more of {', '.join(ALL_SERVERS)}")
    servers = [name for name in ALL_SERVERS if name in requested]  # columns in one order
    settings = settings_from(args)
    out_dir = args.out or (RESULTS_DIR if _is_full_run(args, groups, servers) else SCRATCH_DIR)
    out_dir.mkdir(parents=True, exist_ok=True)
    partial = out_dir / report.PARTIAL_NAME
    workloads = build(settings, groups)
    print(f"workloads: {', '.join(w.id for w in workloads) or '-'}; servers: "
          f"{', '.join(servers)}; best of {settings.repeat} x {settings.seconds:g} s")
    try:
        with ServerSet(servers, args.gateway_arg, keep_dir=args.work_dir) as server_set:
            for server in server_set.servers.values():
                print(f"{server.name}: {server.version} on {server.bootstrap}, pid {server.pid}")
            profiled = next((n for n in (GATEWAY, GATEWAY_PG) if n in servers), None)
            gateway_pid = server_set.servers[profiled].pid if profiled else 0
            with py_spy(gateway_pid, args.py_spy if gateway_pid else None,
                        native=args.py_spy_native):
                # After each workload the runs so far are on disk: an interrupted or
                # crashed run leaves them in results.partial.json.
                results = run_all(settings, server_set.servers, workloads,
                                  with_ceiling="ceiling" in groups,
                                  with_efficiency="efficiency" in groups,
                                  checkpoint=lambda so_far: report.write_json(so_far, partial))
    except ServerMissingError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except BaseException:
        if partial.exists():
            print(f"the runs measured so far are in {partial}", file=sys.stderr)
        raise
    results["meta"]["mode"] = "smoke" if args.smoke else (
        "full" if out_dir == RESULTS_DIR else "partial")
    _report(results, out_dir, args.update_docs)
    if results["failures"]:
        print(f"{len(results['failures'])} run(s) FAILED", file=sys.stderr)
        print(json.dumps([f["workload"] + "/" + f["server"] for f in results["failures"]]),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
