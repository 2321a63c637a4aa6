"""Run the workloads against every server: rotating the order, best of N, failures kept.

The result is a plain dict (the JSON written to bench/results/) so that the report,
the smoke test and later comparisons all read the same thing.
"""

from __future__ import annotations

import os
import platform
import subprocess
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import confluent_kafka

from bench import clients
from bench.procs import run_child
from bench.servers import PEERS, Server
from bench.workloads import EFFICIENCY, Context, Settings, Workload, warm_up

SCHEMA_VERSION = 2  # 2: three servers, "ratios" per peer
REPO = Path(__file__).resolve().parent.parent


def pick_best(runs: list[dict[str, float]], primary: str, better: str | None) -> dict[str, float]:
    """The run with the best primary metric: all its numbers come from that one run."""
    choose = min if better == "lower" else max
    return choose(runs, key=lambda run: run[primary])


def ratios(results: dict[str, dict[str, Any]], names: list[str],
           ) -> dict[str, dict[str, float]]:
    """{peer: {metric: ours/peer}} for every peer measured with its counterpart of ours
    (bench.servers.PEERS: the gateway for Kafka and Tansu, gateway-pg for tansu-pg),
    and every metric both have."""
    out: dict[str, dict[str, float]] = {}
    for peer_name, ours_name in PEERS.items():
        ours = results.get(ours_name, {}).get("best")
        peer = results.get(peer_name, {}).get("best")
        if ours and peer:
            out[peer_name] = {name: ours[name] / peer[name] for name in names
                              if name in ours and name in peer and peer[name]}
    return out


def _server_order(servers: list[str], turn: int) -> list[str]:
    # Rotate who goes first, so that no server always runs on a machine warmed (or
    # tired) by another: over N runs of N servers each one is first, second... once.
    shift = turn % max(1, len(servers))
    return servers[shift:] + servers[:shift]


class Runner:
    def __init__(self, settings: Settings, servers: dict[str, Server]) -> None:
        self.settings = settings
        self.servers = servers
        self.ctx = Context(settings, servers)
        self.failures: list[dict[str, Any]] = []
        self._turn = 0

    # -- warm-up -------------------------------------------------------------------------

    def warm_up(self) -> None:
        """One unmeasured produce+consume per server (see workloads.warm_up)."""
        if self.settings.server_warmup_s <= 0:
            return
        for name, server in self.servers.items():
            try:
                done = warm_up(server, self.ctx)
            except Exception as error:
                self._fail("warm-up", name, -1, error)
                continue
            self.ctx.notes[f"warm-up-{name}"] = done
            print(f"[warm-up] {name}: {done['records']:,.0f} records produced and consumed "
                  f"in {done['rounds']:.0f} round(s)")

    # -- client ceiling ------------------------------------------------------------------

    def client_ceiling(self) -> dict[str, Any]:
        """Best of N produce() call rates with nothing listening (client-only)."""
        s = self.settings
        runs: list[dict[str, float]] = []
        for rep in range(s.repeat):
            try:
                run = run_child(clients.client_ceiling, 120 + s.ceiling_seconds * 4,
                                seconds=s.ceiling_seconds, record_size=s.record_size)
            except Exception as error:
                self._fail("ceiling", "client", rep, error)
                continue
            run["records_per_s"] = run["records"] / run["elapsed_s"]
            run["mb_per_s"] = run["bytes"] / run["elapsed_s"] / 1e6
            run["client_cpu_util"] = run["client_cpu_s"] / run["elapsed_s"]
            runs.append(run)
            print(f"[client-ceiling] rep {rep + 1}/{s.repeat}: "
                  f"{run['records_per_s']:,.0f} rec/s = {run['mb_per_s']:.0f} MB/s")
        best = pick_best(runs, "records_per_s", "higher") if runs else {}
        return {"best": best, "runs": runs}

    # -- workloads -----------------------------------------------------------------------

    def run_workload(self, workload: Workload) -> dict[str, Any]:
        names = list(self.servers)
        results: dict[str, dict[str, Any]] = {n: {"runs": [], "failures": []} for n in names}
        prepared = [n for n in names if self._prepare(workload, n)]
        for rep in range(self.settings.repeat):
            for name in _server_order(names, self._turn):
                if name in prepared:
                    self._one_run(workload, name, rep, results[name])
            self._turn += 1
        for name in prepared:
            self._finish(workload, name)
        better = workload.metric(workload.primary).better
        for name in names:
            runs = results[name]["runs"]
            results[name]["best"] = pick_best(runs, workload.primary, better) if runs else {}
        self.ctx.best[workload.id] = {n: r["best"] for n, r in results.items() if r["best"]}
        return {
            "id": workload.id, "kind": workload.kind, "title": workload.title,
            "params": workload.params, "primary": workload.primary,
            "metrics": [asdict(m) for m in workload.metrics],
            "results": results,
            "ratios": ratios(results, [m.name for m in workload.metrics]),
        }

    def _prepare(self, workload: Workload, name: str) -> bool:
        if workload.prepare is None:
            return True
        try:
            print(f"[{workload.id}] preparing data on {name}")
            workload.prepare(self.servers[name], self.ctx)
            return True
        except Exception as error:
            self._fail(workload.id, name, -1, error)
            return False

    def _finish(self, workload: Workload, name: str) -> None:
        if workload.finish is None:
            return
        try:
            workload.finish(self.servers[name], self.ctx)
        except Exception as error:
            self._fail(workload.id, name, -1, error)

    def _one_run(self, workload: Workload, name: str, rep: int,
                 into: dict[str, Any]) -> None:
        metric = workload.metric(workload.primary)
        try:
            run = workload.run(self.servers[name], self.ctx)
        except Exception as error:
            into["failures"].append(self._fail(workload.id, name, rep, error))
            return
        into["runs"].append(run)
        print(f"[{workload.id}] rep {rep + 1}/{self.settings.repeat} {name:>8}: "
              f"{metric.label} {run[workload.primary]:,.2f} {metric.unit}")

    def _fail(self, workload: str, server: str, rep: int, error: Exception) -> dict[str, Any]:
        detail = "".join(traceback.format_exception(error)).strip()
        print(f"[{workload}] {server} rep {rep + 1} FAILED:\n{detail}")
        if server in self.servers:
            tail = self.servers[server].log_tail(1500)
            if tail:
                print(f"--- last lines of the {server} log ---\n{tail}")
        failure = {"workload": workload, "server": server, "rep": rep, "error": detail}
        self.failures.append(failure)
        return failure

    # -- derived: efficiency -------------------------------------------------------------

    def efficiency(self, workloads: list[dict[str, Any]]) -> dict[str, Any] | None:
        """Server CPU seconds per GB over ALL produce and consume runs (not just the
        best ones: more data, steadier figure), and peak RSS since the server started."""
        kinds = {w["kind"] for w in workloads}
        if not {"produce", "consume"} & kinds:
            return None
        results: dict[str, dict[str, Any]] = {}
        for name, server in self.servers.items():
            best: dict[str, float] = {}
            for kind in ("produce", "consume"):
                runs = [r for w in workloads if w["kind"] == kind
                        for r in w["results"][name]["runs"]]
                gigabytes = sum(r["bytes"] for r in runs) / 1e9
                if gigabytes:
                    best[f"{kind}_cpu_s_per_gb"] = sum(r["server_cpu_s"] for r in runs) / gigabytes
            try:
                best["peak_rss_mb"] = server.sample().peak_rss_bytes / 1e6
            except OSError as error:  # the server died: the failure is already recorded
                self._fail("efficiency", name, -1, error)
            results[name] = {"best": best, "runs": [], "failures": []}
        metrics = [m for m in EFFICIENCY if any(m.name in r["best"] for r in results.values())]
        return {
            "id": "efficiency", "kind": "efficiency",
            "title": "Server efficiency: CPU per GB moved, peak memory",
            "params": {"note": "CPU over all produce/consume runs; RSS = VmHWM at the end"},
            "primary": metrics[0].name if metrics else "", "metrics": [asdict(m) for m in metrics],
            "results": results, "ratios": ratios(results, [m.name for m in metrics]),
        }


def environment(servers: dict[str, Server]) -> dict[str, Any]:
    """What a reader needs to judge the numbers: machine, versions, load."""
    cpu_model = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(), "cpu_model": cpu_model, "mem_gb": round(mem_gb, 1),
                 "kernel": platform.release(), "loadavg_at_start": os.getloadavg()},
        "versions": {
            "python": platform.python_version(),
            "confluent_kafka": confluent_kafka.version(),
            "librdkafka": confluent_kafka.libversion()[0],
            **{name: server.version for name, server in servers.items()},
        },
        "git": _git_revision(),
    }


def _git_revision() -> str:
    try:
        rev = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError:
        return ""
    return rev


Checkpoint = Callable[[dict[str, Any]], None]


def run_all(settings: Settings, servers: dict[str, Server], workloads: list[Workload],
            with_ceiling: bool, with_efficiency: bool,
            checkpoint: Checkpoint | None = None) -> dict[str, Any]:
    """Every workload on every server; `checkpoint` gets the results so far after each
    workload, so that a run interrupted later still leaves what it measured."""
    started = time.monotonic()
    runner = Runner(settings, servers)
    done: list[dict[str, Any]] = []
    results: dict[str, Any] = {"schema": SCHEMA_VERSION, "meta": environment(servers),
                               "settings": asdict(settings), "servers": list(servers),
                               "client_ceiling": None, "workloads": done,
                               "notes": runner.ctx.notes, "failures": runner.failures}

    def progress() -> None:
        results["meta"]["duration_s"] = round(time.monotonic() - started, 1)
        results["meta"]["host"]["loadavg_at_end"] = os.getloadavg()
        results["meta"]["other_cpu_util_mean"] = _mean_other_load(done)
        if checkpoint is not None:
            checkpoint(results)

    runner.warm_up()
    if with_ceiling:
        results["client_ceiling"] = runner.client_ceiling()
    for workload in workloads:
        done.append(runner.run_workload(workload))
        progress()
    if with_efficiency:
        efficiency = runner.efficiency(done)
        if efficiency is not None:
            done.append(efficiency)
    progress()
    return results


def _mean_other_load(workloads: list[dict[str, Any]]) -> float:
    loads = [run["other_cpu_util"] for w in workloads for r in w["results"].values()
             for run in r["runs"] if "other_cpu_util" in run]
    return round(sum(loads) / len(loads), 3) if loads else 0.0
