"""The README works as written: its commands and code blocks run in order against
the gateway it starts (in a network namespace of their own, so its fixed
addresses meet nothing else), and show what the README says they show. Its
links stay inside the repository."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from testkit.readme_run import SKIPPED

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _run_readme(tmp_path: Path) -> list[dict]:
    report = tmp_path / "report.json"
    workdir = tmp_path / "reader"
    workdir.mkdir()
    result = subprocess.run(
        ["unshare", "-n", sys.executable, "-m", "testkit.readme_run", str(README), str(workdir),
         str(report)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"unshare -n (a network namespace) failed:\n{result.stderr}"
    return json.loads(report.read_text())


def test_readme_runs_as_written(tmp_path):
    steps = _run_readme(tmp_path)
    skipped = {s["text"] for s in steps if s["kind"] == "skipped"}
    assert "pip install ." in skipped and skipped <= set(SKIPPED)
    for step in steps:
        if step["kind"] != "skipped":
            assert step["returncode"] == 0, step
    by_text = {s["text"]: s for s in steps}

    def output(prefix: str) -> str:
        [found] = [s for text, s in by_text.items() if text.startswith(prefix)]
        return found["stdout"]

    # the CLI: both keys land on partition 2 (murmur2, as Kafka's own tools)
    assert output("kafka-gateway consume").splitlines() == [
        "Partition:2\tuser-1\thello", "Partition:2\tuser-2\tbonjour"]
    assert "PartitionCount: 3" in output("kafka-gateway topics describe greetings")
    # kcat's record follows them on partition 2
    assert "2/2 user-1=hello" in output("kcat -b 127.0.0.1:9092 -C").splitlines()
    # the confluent-kafka consumer reads the producer's records (partition 2) and the rest
    [python] = [s for s in steps if s["kind"] == "python"]
    printed = python["stdout"].splitlines()
    assert len(printed) == 13, python
    mine = [line for line in printed if "b'hello " in line]
    assert mine == [f"2 {3 + i} b'user-1' b'hello {i}'" for i in range(10)]
    # the group committed at close; reset-offsets moved it back to the start
    describes = [s["stdout"] for s in steps if s["text"] == "kafka-gateway groups describe demo"]
    assert len(describes) == 2
    before, after = ({tuple(line.split()[:5]) for line in text.splitlines()}
                     for text in describes)
    assert ("greetings", "2", "13", "13", "0") in before
    assert ("greetings", "2", "0", "13", "13") in after
    lag = output("curl -s 127.0.0.1:9644/metrics")
    assert 'kafka_gateway_consumer_lag{group="demo",partition="2",topic="greetings"} 13.0' in lag
    assert output("curl -s -o /dev/null").strip() == "200"


def test_readme_links_stay_in_the_repository():
    links = _LINK.findall(README.read_text())
    assert links
    for target in links:
        assert not re.match(r"^[a-z]+:", target), f"{target} leaves the repository"
        path = (ROOT / target.split("#")[0]).resolve()
        assert path.is_relative_to(ROOT) and path.exists(), target


def test_docs_links_resolve():
    for page in (ROOT / "docs").glob("*.md"):
        for target in _LINK.findall(page.read_text()):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue
            path = (page.parent / target.split("#")[0]).resolve()
            assert path.is_relative_to(ROOT) and path.exists(), (page.name, target)
