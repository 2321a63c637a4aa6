"""Turn the results dict into a terminal table, results.json, results.md and PNG charts."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from bench.meter import THREAD_CPU_PREFIX
from bench.servers import (
    GATEWAY,
    GATEWAY_PG,
    GATEWAY_PG_CLUSTER,
    KAFKA,
    PEERS,
    POSTGRES_PREFIX,
    TANSU,
    TANSU_PG,
)

JSON_NAME = "results.json"
MARKDOWN_NAME = "results.md"
CHARTS = {"throughput": "throughput.png", "latency": "latency.png",
          "efficiency": "efficiency.png"}
DOCS_BEGIN = "<!-- bench:results:begin -->"
DOCS_END = "<!-- bench:results:end -->"


# --- table rows shared by the terminal and Markdown ----------------------------------

def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _verdict(ratio: float | None, better: str | None) -> str:
    """How the gateway compares, in words a reader does not have to decode."""
    if not ratio or better is None or ratio == float("inf"):
        return ""  # a zero on either side: too little CPU time to measure, say nothing
    gain = ratio if better == "higher" else 1 / ratio
    if 0.95 <= gain <= 1.05:
        return "on par"
    return f"{gain:.2f}x better" if gain > 1 else f"{1 / gain:.2f}x worse"


def _peers(results: dict[str, Any]) -> list[str]:
    """The peers measured in this run with the server of ours divided by them."""
    servers = results["servers"]
    return [peer for peer, ours in PEERS.items() if peer in servers and ours in servers]


def header(results: dict[str, Any]) -> list[str]:
    return ["workload", "metric", *results["servers"],
            *(f"{PEERS[peer]}/{peer}" for peer in _peers(results))]


def _ratio_cell(ratio: float | None, better: str | None) -> str:
    if not ratio:
        return "-"
    verdict = _verdict(ratio, better)
    return f"{ratio:.3g} ({verdict})" if verdict else f"{ratio:.3g}"


def table_rows(results: dict[str, Any]) -> list[list[str]]:
    """workload | metric | one column per server | gateway/peer (verdict) per peer."""
    servers, peers = results["servers"], _peers(results)
    rows: list[list[str]] = []
    ceiling = results.get("client_ceiling") or {}
    if ceiling.get("best"):
        best = ceiling["best"]
        rows.append(["Client ceiling: produce() calls with nothing listening",
                     f"client only: {best['records_per_s']:,.0f} rec/s "
                     f"= {best['mb_per_s']:.0f} MB/s", *[""] * (len(servers) + len(peers))])
    for workload in results["workloads"]:
        per_server = workload["results"]
        for metric in workload["metrics"]:
            if not metric["show"]:
                continue
            values = [per_server.get(name, {}).get("best", {}).get(metric["name"])
                      for name in servers]
            # Ratios of context figures (offered rate, other load) would only be noise.
            cells = [_ratio_cell(workload["ratios"].get(peer, {}).get(metric["name"]),
                                 metric["better"]) if metric["better"] else "-"
                     for peer in peers]
            rows.append([workload["title"], f"{metric['label']} ({metric['unit']})",
                         *(_fmt(v) for v in values), *cells])
    return rows


def _titles_once(rows: list[list[str]]) -> list[list[str]]:
    """Each workload's title on its first row only: the table reads as groups."""
    out, previous = [], None
    for row in rows:
        out.append(["" if row[0] == previous else row[0], *row[1:]])
        previous = row[0]
    return out


def terminal_table(results: dict[str, Any]) -> str:
    head = header(results)
    rows = [head, *_titles_once(table_rows(results))]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = []
    for index, row in enumerate(rows):
        cells = [c.ljust(w) if i < 2 else c.rjust(w)
                 for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
        if index == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def summary_lines(results: dict[str, Any]) -> list[str]:
    meta = results["meta"]
    host = meta["host"]
    versions = meta["versions"]
    settings = results["settings"]
    return [
        f"{meta['date']}, git {meta.get('git') or '?'}, {meta.get('duration_s', '?')} s; "
        f"{host['cpus']} CPUs ({host['cpu_model']}), {host['mem_gb']} GB RAM, "
        f"load average at start {host['loadavg_at_start'][0]:.2f}"
        + (f", at end {host['loadavg_at_end'][0]:.2f}" if "loadavg_at_end" in host else "")
        + ", "
        f"other processes used {meta.get('other_cpu_util_mean', 0):.2f} cores on average "
        "during measured runs",
        "; ".join([*(versions[name] + (" (memory://)" if name == TANSU else "")
                     for name in results["servers"]),
                   f"confluent-kafka {versions['confluent_kafka']} / librdkafka "
                   f"{versions['librdkafka']}", f"Python {versions['python']}"]),
        f"best of {settings['repeat']} runs in rotating server order, "
        f"{settings['seconds']:g} s each, after {settings.get('server_warmup_s', 0):g} s of "
        "warm-up per server"
        + (f"; consume reads {settings['consume_mb']:g} MiB"
           if any(w["kind"] == "consume" for w in results["workloads"]) else ""),
    ]


def thread_lines(results: dict[str, Any], top: int = 4) -> list[str]:
    """Where each server's CPU went in each throughput workload, in CPU s per GB."""
    lines = []
    for workload in results["workloads"]:
        if workload["kind"] not in ("produce", "consume", "partitions"):
            continue
        parts = []
        for name in results["servers"]:
            best = workload["results"].get(name, {}).get("best", {})
            gigabytes = best.get("bytes", 0) / 1e9
            threads = sorted(((v, k.removeprefix(THREAD_CPU_PREFIX)) for k, v in best.items()
                              if k.startswith(THREAD_CPU_PREFIX)), reverse=True)
            if gigabytes and threads:
                # A server of several processes (PostgreSQL's): their sum too.
                postgres = sum(cpu for cpu, thread in threads
                               if thread.startswith(POSTGRES_PREFIX))
                parts.append(f"{name}: " + ", ".join(
                    f"{thread} {cpu / gigabytes:.2f}" for cpu, thread in threads[:top])
                    + (f" (PostgreSQL in all {postgres / gigabytes:.2f})" if postgres else ""))
        if parts:
            lines.append(f"- {workload['title']}: " + "; ".join(parts))
    return lines


def markdown(results: dict[str, Any], chart_dir: str | None = None) -> str:
    head = header(results)
    lines = [f"- {line}" for line in summary_lines(results)]
    lines += ["", "| " + " | ".join(head) + " |",
              "| " + " | ".join(["---", "---", *["---:"] * (len(head) - 2)]) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in _titles_once(table_rows(results))]
    threads = thread_lines(results)
    if threads:
        lines += ["", "Server CPU per GB by thread (the best run; kernel thread names, "
                  "cut at 15 characters):", "", *threads]
    if results.get("failures"):
        lines += ["", f"**{len(results['failures'])} run(s) failed**; see results.json."]
    if chart_dir is not None:
        drawn = [name for name, state in (results.get("charts") or {}).items()
                 if state == DRAWN]
        lines += [""] + [f"![{name}]({chart_dir}/{CHARTS[name]})" for name in drawn]
    missing = charts_missing(results)
    if missing:
        lines += ["", *(f"Chart {name} {reason}." for name, reason in missing.items())]
    return "\n".join(lines) + "\n"


# --- charts ----------------------------------------------------------------------------

_COLORS = {GATEWAY: "#1f77b4", GATEWAY_PG: "#9467bd", GATEWAY_PG_CLUSTER[2]: "#8c564b",
           GATEWAY_PG_CLUSTER[3]: "#e377c2", KAFKA: "#2ca02c", TANSU: "#ff7f0e",
           TANSU_PG: "#bcbd22"}


def _best(workload: dict[str, Any], server: str, metric: str) -> float:
    return float(workload["results"].get(server, {}).get("best", {}).get(metric, 0.0))


def _grouped_bars(ax: Any, groups: list[str], series: dict[str, list[float]],
                  fmt: str = "{:.0f}") -> None:
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        xs = [x + (i - (len(series) - 1) / 2) * width for x in range(len(groups))]
        bars = ax.bar(xs, values, width, label=name, color=_COLORS.get(name))
        ax.bar_label(bars, labels=[fmt.format(v) if v else "" for v in values], fontsize=7,
                     padding=2)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, fontsize=8)


def _throughput_chart(results: dict[str, Any], path: Path, plt: Any, ticker: Any) -> bool:
    workloads = [w for w in results["workloads"] if w["kind"] in ("produce", "consume",
                                                                    "partitions")]
    if not workloads:
        return False
    fig, ax = plt.subplots(figsize=(9, 4.5))
    _grouped_bars(ax, [w["id"] for w in workloads],
                  {s: [_best(w, s, "mb_per_s") for w in workloads] for s in results["servers"]})
    ceiling = (results.get("client_ceiling") or {}).get("best")
    if ceiling:
        ax.axhline(ceiling["mb_per_s"], color="grey", linestyle="--", linewidth=1,
                   label=f"client produce() ceiling {ceiling['mb_per_s']:.0f} MB/s")
    ax.set_ylabel("MB/s (1 KiB records, higher is better)")
    ax.set_title("Throughput, best of N")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _latency_chart(results: dict[str, Any], path: Path, plt: Any, ticker: Any) -> bool:
    workloads = [w for w in results["workloads"] if w["kind"] in ("latency", "e2e")]
    if not workloads:
        return False
    fig, axes = plt.subplots(1, len(workloads), figsize=(3.2 * len(workloads), 4),
                             squeeze=False)
    plain = ticker.FuncFormatter(lambda value, _pos: f"{value:g}")
    for ax, workload in zip(axes[0], workloads, strict=True):
        percentiles = ["p50_ms", "p99_ms", "p999_ms"]
        _grouped_bars(ax, ["p50", "p99", "p99.9"],
                      {s: [_best(workload, s, p) for p in percentiles]
                       for s in results["servers"]}, fmt="{:.1f}")
        ax.set_yscale("log")
        # Log axes default to 6x10^0 style labels; plain numbers read faster. Label the
        # minor ticks only when the axis spans less than a decade, or they pile up.
        low, high = ax.get_ylim()
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain if high / low < 10 else ticker.NullFormatter())
        ax.set_ylim(low, high * 1.3)  # room for the value labels above the bars
        ax.tick_params(axis="y", which="both", labelsize=7)
        ax.set_title(_latency_title(workload), fontsize=9)
    axes[0][0].set_ylabel("ms (log scale, lower is better)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Produce latency at fixed rates, and end-to-end latency", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _latency_title(workload: dict[str, Any]) -> str:
    params = workload["params"]
    if workload["kind"] == "e2e":
        return f"end to end, {params['rate']:g} rec/s"
    rate = next((r["best"].get("target_rate") for r in workload["results"].values()
                 if r["best"].get("target_rate")), 0.0)
    return (f"produce at {params['fraction_of_slowest_max']:.0%} of slowest max\n"
            f"{rate / 1000:.0f}k rec/s, {params['partitions']} partitions")


def _efficiency_chart(results: dict[str, Any], path: Path, plt: Any, ticker: Any) -> bool:
    workload = next((w for w in results["workloads"] if w["kind"] == "efficiency"), None)
    if workload is None or not workload["metrics"]:
        return False
    metrics = workload["metrics"]
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.2 * len(metrics), 4), squeeze=False)
    for ax, metric in zip(axes[0], metrics, strict=True):
        _grouped_bars(ax, [""], {s: [_best(workload, s, metric["name"])]
                                 for s in results["servers"]}, fmt="{:.1f}")
        ax.set_title(f"{metric['label']}\n({metric['unit']}, lower is better)", fontsize=9)
        ax.set_xticks([])
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


DRAWN = "drawn"
NO_DATA = "no data in this run"


def charts(results: dict[str, Any], out_dir: Path) -> dict[str, str]:
    """Draw every chart; {chart: DRAWN, NO_DATA or why it was not drawn}. Never raises:
    a chart is the last thing written, and losing one must not lose the run."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, no display
        import matplotlib.pyplot as plt
        from matplotlib import ticker
    except Exception as error:  # not installed, or a broken install
        reason = f"not drawn: {type(error).__name__}: {error}"
        status = dict.fromkeys(CHARTS, reason)
    else:
        makers = {"throughput": _throughput_chart, "latency": _latency_chart,
                  "efficiency": _efficiency_chart}
        status = {}
        for name, maker in makers.items():
            try:
                status[name] = DRAWN if maker(results, out_dir / CHARTS[name], plt, ticker) \
                    else NO_DATA
            except Exception as error:
                plt.close("all")
                status[name] = f"not drawn: {type(error).__name__}: {error}"
    for name, state in status.items():
        if state != DRAWN:  # never leave a chart of an older run beside this one
            (out_dir / CHARTS[name]).unlink(missing_ok=True)
    return status


def charts_missing(results: dict[str, Any]) -> dict[str, str]:
    """The charts that should have been drawn and were not, with the reason."""
    return {name: state for name, state in (results.get("charts") or {}).items()
            if state not in (DRAWN, NO_DATA)}


# --- files -----------------------------------------------------------------------------

PARTIAL_NAME = "results.partial.json"  # the runs so far, while a run is under way
REDRAW_HINT = ("pip install -e '.[bench]', then redraw from the JSON: "
               "python -m bench --report {json}")


def write_json(results: dict[str, Any], path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(results, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)  # a reader never sees half a file


def _write_tables(results: dict[str, Any], out_dir: Path) -> None:
    write_json(results, out_dir / JSON_NAME)
    title = f"# Benchmark results: {' vs '.join(results['servers'])}\n\n"
    (out_dir / MARKDOWN_NAME).write_text(title + markdown(results, chart_dir="."))


def write_all(results: dict[str, Any], out_dir: Path) -> dict[str, str]:
    """results.json and results.md first, then the charts, then both again naming the
    charts drawn and those not drawn (and why). Returns the charts not drawn."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results["charts"] = dict.fromkeys(CHARTS, "not drawn yet")
    _write_tables(results, out_dir)
    results["charts"] = charts(results, out_dir)
    _write_tables(results, out_dir)
    (out_dir / PARTIAL_NAME).unlink(missing_ok=True)
    return charts_missing(results)


def update_docs(results: dict[str, Any], docs: Path, chart_dir: str) -> None:
    """Replace the generated block of docs/performance.md with this run's table."""
    text = docs.read_text()
    pattern = re.compile(re.escape(DOCS_BEGIN) + ".*?" + re.escape(DOCS_END), re.S)
    if not pattern.search(text):
        raise ValueError(f"{docs} has no {DOCS_BEGIN} ... {DOCS_END} block")
    block = f"{DOCS_BEGIN}\n{markdown(results, chart_dir=chart_dir)}{DOCS_END}"
    docs.write_text(pattern.sub(lambda _m: block, text))
