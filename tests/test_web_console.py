"""The web console in a real browser: headless Chromium (Debian's) driven by
Playwright (npm playwright-core, tests/browser/) loads every page of a gateway
holding topics, groups (one with a live member) and transactions (30,002
transactional ids, 30,000 of them made with raw InitProducerId requests), and
reports what it shows; the transactions list is paged forwards and back with
its links; the screenshots stay in pytest's temporary directory and their
paths are printed.

Needs ``chromium`` (apt-get) and ``npm ci`` in tests/browser: tests/run_all.sh
installs both.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tablets.seam import LEADER_EPOCH
from testkit import prom
from testkit.cli import run_cli
from testkit.gateway import GatewayProcess
from testkit.kafka_requests import init_transactional_ids

ROOT = Path(__file__).resolve().parent.parent
BROWSER = ROOT / "tests" / "browser"
VENDOR = ROOT / "kafka_gateway" / "webui" / "static" / "vendor"
TIMEOUT = 30
_ADMIN = re.compile(r"admin http ([\d.]+:\d+)")
# Sorted after the two transactional producers' ids: the first page shows those.
BULK_IDS = [f"zz-bulk-{i:05d}" for i in range(30_000)]


def _chromium() -> str:
    for candidate in (os.environ.get("CHROMIUM"), shutil.which("chromium"),
                      "/usr/lib/chromium/chromium", shutil.which("chromium-browser")):
        if candidate and Path(candidate).exists():
            return candidate
    raise AssertionError("no chromium: run tests/run_all.sh (apt-get install chromium)")


def _wait(predicate, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def gateway_with_data(tmp_path_factory):
    data = tmp_path_factory.mktemp("console") / "data"
    with GatewayProcess(data, "--admin-listen", "127.0.0.1:0",
                        "--group-initial-rebalance-delay-ms", "0") as gateway:
        bootstrap = gateway.bootstrap
        run_cli(bootstrap, "topics", "create", "orders", "--partitions", "3",
                "--config", "retention.ms=3600000")
        # important consumers of orders: billing (commits below) and fraud (never commits)
        run_cli(bootstrap, "topics", "alter", "orders", "--config",
                "gateway.important.consumer.groups=billing,fraud")
        run_cli(bootstrap, "topics", "create", "payments", "--partitions", "1")
        producer = Producer({"bootstrap.servers": bootstrap})
        for i in range(30):
            producer.produce("orders", value=b"o" * 50, partition=i % 3)
        producer.produce("payments", value=b"p")
        assert producer.flush(TIMEOUT) == 0

        # "billing": a live member holding every partition of orders, offsets 2, 4, 6
        member = Consumer({"bootstrap.servers": bootstrap, "group.id": "billing",
                           "client.id": "billing-worker", "enable.auto.commit": False,
                           "session.timeout.ms": 60000})
        assigned: list[TopicPartition] = []
        member.subscribe(["orders"], on_assign=lambda _c, parts: assigned.extend(parts))
        _wait(lambda: member.poll(0.1) is not None or len(assigned) == 3, "an assignment")
        member.commit(offsets=[TopicPartition("orders", p, 2 * (p + 1)) for p in range(3)],
                      asynchronous=False)
        # "audit/eu <x>": a group without members, a name to escape
        idle = Consumer({"bootstrap.servers": bootstrap, "group.id": "audit/eu <x>"})
        idle.commit(offsets=[TopicPartition("payments", 0, 0)], asynchronous=False)
        idle.close()

        done = Producer({"bootstrap.servers": bootstrap, "transactional.id": "ledger-writer"})
        done.init_transactions(TIMEOUT)
        done.begin_transaction()
        done.produce("payments", value=b"committed")
        done.commit_transaction(TIMEOUT)
        stuck = Producer({"bootstrap.servers": bootstrap, "transactional.id": "stuck-writer"})
        stuck.init_transactions(TIMEOUT)
        stuck.begin_transaction()
        stuck.produce("orders", value=b"pending", partition=1)
        assert stuck.flush(TIMEOUT) == 0
        codes = asyncio.run(init_transactional_ids(*gateway.host_port, BULK_IDS))
        assert set(codes) == {0}
        try:
            yield gateway, _ADMIN.search(gateway.output()).group(1)
        finally:
            member.close()


def _browse(admin: str, pages: list[dict], workdir: Path) -> dict:
    node_modules = BROWSER / "node_modules" / "playwright-core"
    assert node_modules.exists(), "run `npm ci` in tests/browser (tests/run_all.sh does)"
    screenshots = workdir / "screenshots"
    screenshots.mkdir(exist_ok=True)
    spec = {"executable": _chromium(), "base": f"http://{admin}",
            "screenshots": str(screenshots), "pages": pages}
    (workdir / "spec.json").write_text(json.dumps(spec))
    result = subprocess.run(
        ["node", str(BROWSER / "console_pages.mjs"), str(workdir / "spec.json"),
         str(workdir / "report.json")], capture_output=True, text=True, timeout=300,
        cwd=BROWSER)
    assert result.returncode == 0, result.stderr
    return json.loads((workdir / "report.json").read_text())


def _cells(rows: list[list]) -> list[list[str]]:
    return [[c["text"] if isinstance(c, dict) else c for c in row] for row in rows]


def test_every_page_in_chromium(gateway_with_data, tmp_path, capsys):
    gateway, admin = gateway_with_data
    stop = threading.Event()

    def traffic() -> None:
        """Produce (about 500 records/s) and consume while the charts poll (bounded)."""
        producer = Producer({"bootstrap.servers": gateway.bootstrap, "linger.ms": 5})
        reader = Consumer({"bootstrap.servers": gateway.bootstrap, "group.id": "live-reader",
                           "auto.offset.reset": "earliest", "auto.commit.interval.ms": 200})
        reader.subscribe(["payments"])
        deadline = time.monotonic() + 120
        while not stop.is_set() and time.monotonic() < deadline:
            for _ in range(50):
                producer.produce("payments", value=b"r" * 200)
            producer.poll(0)
            reader.poll(0)
            stop.wait(0.1)
        producer.flush(TIMEOUT)
        reader.close()

    thread = threading.Thread(target=traffic)
    thread.start()
    pages = [
        {"name": "overview", "path": "/ui/", "wait": "#overview",
         "charts": ["#chart-bytes", "#chart-records"]},
        {"name": "topics", "path": "/ui/topics", "wait": "#topics"},
        {"name": "topic-orders", "path": "/ui/topics/orders", "wait": "#partitions"},
        {"name": "groups", "path": "/ui/groups", "wait": "#groups"},
        {"name": "group-billing", "path": "/ui/groups/billing", "wait": "#offsets"},
        {"name": "group-audit", "path": "/ui/groups/audit%2Feu%20%3Cx%3E", "wait": "#offsets"},
        {"name": "transactions", "path": "/ui/transactions", "wait": "#transactions",
         "clicks": ["a[rel=next]", "a[rel=next]", "a[rel=prev]", "a[rel=prev]",
                    "a[rel=next]", "a.first"]},
        {"name": "missing-topic", "path": "/ui/topics/nope", "wait": "main"},
        {"name": "cluster", "path": "/ui/cluster", "wait": "#alone"},
    ]
    try:
        report = _browse(admin, pages, tmp_path)
    finally:
        stop.set()
        thread.join()
    with capsys.disabled():
        print(f"\nweb console screenshots: {tmp_path / 'screenshots'} "
              f"({', '.join(sorted(Path(p['screenshot']).name for p in report.values()))})")
    for name, shown in report.items():
        # the 404 page reports its own status to the console, nothing else may fail
        expected = ["console: Failed to load resource: the server responded with a status of "
                    "404 (Not Found)"] if name == "missing-topic" else []
        assert shown["problems"] == expected, (name, shown["problems"])
        assert Path(shown["screenshot"]).stat().st_size > 10_000, name

    overview = report["overview"]
    assert overview["status"] == 200 and overview["h1"] == "Overview"
    assert overview["facts"]["Topics"] == "2" and overview["facts"]["Partitions"] == "4"
    for chart in overview["charts"].values():
        assert chart["canvas"] and chart["points"] >= 3
    assert overview["charts"]["#chart-bytes"]["last"]["produced"] > 0

    topics = {row[0]: row for row in _cells(report["topics"]["tables"]["topics"])}
    assert topics["orders"][1:3] == ["3", "30"]
    assert topics["orders"][4] == ("gateway.important.consumer.groups=billing,fraud, "
                                   "retention.ms=3600000")
    assert report["topics"]["tables"]["topics"][0][0]["href"] == "/ui/topics/orders"

    orders = report["topic-orders"]
    assert orders["h1"] == "Topic orders"
    with urllib.request.urlopen(f"http://{admin}/topics", timeout=TIMEOUT) as answer:
        stored = [p["bytes"] for p in json.load(answer)["orders"]["partitions"]]
    # leader: this gateway (node 0, alone over its embedded store), at its one epoch
    assert _cells(orders["tables"]["partitions"]) == [
        [str(p), "0", str(LEADER_EPOCH), "0", "10", "10", f"{stored[p]} B"] for p in range(3)]
    configs = {row[0]: row[1:] for row in _cells(orders["tables"]["configs"])}
    assert configs["retention.ms"] == ["3600000", "topic"]
    assert configs["cleanup.policy"] == ["delete", "default"]
    readers = {row[0]: row[1:] for row in _cells(orders["tables"]["readers"])}
    assert readers["billing"] == ["18", "important"]  # (10-2) + (10-4) + (10-6)
    # what the important groups hold: nothing yet (retention is an hour), fraud
    # never committed so it holds every partition from its log start
    assert _cells(orders["tables"]["important"]) == [
        ["billing", "0", "2", "8", "0 B", "-", "0"],
        ["fraud", "0", "never: holds from the log start", "10", "0 B", "-", "0"],
        ["billing", "1", "4", "6", "0 B", "-", "0"],
        ["fraud", "1", "never: holds from the log start", "10", "0 B", "-", "0"],
        ["billing", "2", "6", "4", "0 B", "-", "0"],
        ["fraud", "2", "never: holds from the log start", "10", "0 B", "-", "0"]]
    assert orders["tables"]["important"][1][0]["href"] == "/ui/groups/fraud"

    groups = {row[0]: row for row in _cells(report["groups"]["tables"]["groups"])}
    assert groups["billing"][1:] == ["Stable", "consumer", "range", "1", "18"]
    assert groups["audit/eu <x>"][1] == "Empty"

    billing = report["group-billing"]
    [member] = _cells(billing["tables"]["members"])
    assert member[2] == "billing-worker" and member[4] == "orders-0, orders-1, orders-2"
    offsets = _cells(billing["tables"]["offsets"])
    assert [row[:5] for row in offsets] == [["orders", "0", "2", "10", "8"],
                                            ["orders", "1", "4", "10", "6"],
                                            ["orders", "2", "6", "10", "4"]]
    assert all(row[6] == "billing-worker" for row in offsets)
    audit = report["group-audit"]
    assert audit["h1"] == "Group audit/eu <x>" and audit["facts"]["State"] == "Empty"

    txns = {row[0]: row for row in _cells(report["transactions"]["tables"]["transactions"])}
    assert txns["ledger-writer"][3] == "CompleteCommit"
    assert txns["stuck-writer"][3] == "Ongoing" and txns["stuck-writer"][6] == "orders-1"
    assert report["transactions"]["facts"]["Open"] == "1"
    # the open transaction's one batch: stored, and held in memory as well
    metrics = prom.samples(prom.scrape(admin))
    stored = int(prom.value(metrics, "kafka_gateway_txn_pending_stored_bytes"))
    assert 0 < stored == prom.value(metrics, "kafka_gateway_txn_pending_memory_bytes")
    assert txns["stuck-writer"][8:] == [f"{stored} B", f"{stored} B"]
    assert txns["ledger-writer"][8:] == ["-", "-"]
    assert report["transactions"]["facts"]["Pending stored"] == f"{stored} B"
    assert report["transactions"]["facts"]["Pending in memory"] == f"{stored} B"
    assert report["transactions"]["facts"]["Over a pending limit"] == "0"
    assert report["transactions"]["facts"]["Committed"] == "1"
    _assert_transactions_paged(report["transactions"], capsys)

    assert report["missing-topic"]["status"] == 404
    assert report["missing-topic"]["h1"] == "Not found"
    # a gateway alone says so (the cluster's page: compat_tests/test_pg_cluster_operations.py)
    assert report["cluster"]["h1"] == "Cluster" and report["cluster"]["nav"] == "Cluster"


def _assert_transactions_paged(shown: dict, capsys) -> None:
    """50 ids a page, in order; next, next, previous, previous, next, first."""
    ordered = ["ledger-writer", "stuck-writer", *BULK_IDS]
    pages = [ordered[:50], ordered[50:100], ordered[100:150]]
    first = [row[0] for row in _cells(shown["tables"]["transactions"])]
    assert first == pages[0]
    assert shown["facts"]["Transactional ids"] == str(len(ordered))
    assert f"50 of {len(ordered)} transactional ids" in shown["pager"]
    assert "Next" in shown["pager"] and "Previous" not in shown["pager"]
    # (page shown, its URL): a next link names the last id shown, a previous
    # link the first one
    expected = [(pages[1], "?after=zz-bulk-00047"), (pages[2], "?after=zz-bulk-00097"),
                (pages[1], "?before=zz-bulk-00098"), (pages[0], "?before=zz-bulk-00048"),
                (pages[1], "?after=zz-bulk-00047"), (pages[0], "")]
    for step, (rows, cursor) in zip(shown["steps"], expected, strict=True):
        assert step["status"] == 200 and step["url"] == "/ui/transactions" + cursor
        assert [row[0] for row in _cells(step["tables"]["transactions"])] == rows, cursor
        assert step["bytes"] < 64 << 10, (step["url"], step["bytes"])
    assert shown["bytes"] < 64 << 10, shown["bytes"]
    with capsys.disabled():
        print("transactions pages in Chromium (30,002 ids): "
              + ", ".join(f"{step['url'].removeprefix('/ui/transactions') or 'first'} "
                          f"{step['bytes']} B {step['ms']} ms" for step in shown["steps"]))


def test_the_vendored_chart_library_is_the_npm_release():
    """static/vendor holds uPlot exactly as the pinned npm package ships it."""
    dist = BROWSER / "node_modules" / "uplot" / "dist"
    assert dist.exists(), "run `npm ci` in tests/browser (tests/run_all.sh does)"
    for name in ("uPlot.iife.min.js", "uPlot.min.css"):
        assert (VENDOR / name).read_bytes() == (dist / name).read_bytes(), name
    assert (VENDOR / "uPlot.LICENSE").read_bytes() == \
        (BROWSER / "node_modules" / "uplot" / "LICENSE").read_bytes()
