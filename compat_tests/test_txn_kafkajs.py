"""kafkajs 2.2.4: idempotent and transactional producers, through js/txn.js.

Each test runs one scenario of txn.js and asserts on its JSON; a scenario
that needs the test to look at the gateway mid-way pauses (``PAUSE what`` on
stdout) until the test answers on stdin.

kafkajs' producers are not idempotent by default (``idempotent: false``); a
transactional one is. It commits a transaction's offsets with a group id only
(no KIP-447 member and generation), and admin.fetchOffsets cannot ask for
stable offsets. What kafkajs reports, as asserted below:

- a transactional send reports baseOffset -1 (offsets are assigned at commit);
- a fenced producer: INVALID_PRODUCER_EPOCH from its send and from its
  commit (kafkajs' EndTxn version predates PRODUCER_FENCED);
- an offset-range conflict at TxnOffsetCommit: ILLEGAL_GENERATION from
  sendOffsets; the transaction aborts and the same producer goes on;
- at EndTxn(commit): UNKNOWN_PRODUCER_ID from commit; kafkajs then can
  neither abort nor begin (its state machine stays in COMMITTING): nothing of
  the transaction landed, and a new producer with the same transactionalId
  goes on.
"""

from __future__ import annotations

import json
import queue
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode
from txn_helpers import (
    PER_PARTITION,
    assert_one_idempotent_producer,
    expected_view,
    fetch_offsets,
    log_offsets,
    stored_log,
    timed_out,
    topic_names,
    txn_gateway,
    txn_records,
    wait_for,
)

JS_DIR = Path(__file__).resolve().parent / "js"
TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with txn_gateway(tmp_path_factory.mktemp("txn-kafkajs") / "data") as gw:
        yield gw


def run_txn(gateway, topic: str, scenario: str, *args: str,
            on_pause: dict[str, Callable[[], None]] | None = None) -> dict:
    """Run ``node js/txn.js BOOTSTRAP TOPIC SCENARIO ARGS``; answer its pauses
    with ``on_pause[what]()``; it must exit 0; returns its JSON."""
    node = shutil.which("node")
    assert node, "Node.js is not installed (Debian: apt-get install -y nodejs npm)"
    assert (JS_DIR / "node_modules" / "kafkajs").is_dir(), (
        f"kafkajs is not installed in {JS_DIR}: run `cd compat_tests/js && npm ci`")
    command = [node, "txn.js", gateway.bootstrap, topic, scenario, *args]
    process = subprocess.Popen(command, cwd=JS_DIR, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str | None] = queue.Queue()
    stderr: list[str] = []

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    threading.Thread(target=lambda: stderr.extend(process.stderr or ()), daemon=True).start()
    deadline = time.monotonic() + TIMEOUT_S
    output: list[str] = []
    try:
        while (line := lines.get(timeout=max(0.1, deadline - time.monotonic()))) is not None:
            if line.startswith("PAUSE "):
                (on_pause or {})[line.split()[1]]()
                assert process.stdin is not None
                process.stdin.write("\n")
                process.stdin.flush()
            else:
                output.append(line)
        assert process.wait(10) == 0, (
            f"{' '.join(command)} exited {process.returncode}; stderr:\n"
            f"{''.join(stderr)[-6000:]}\ngateway log tail:\n{gateway.output()[-3000:]}")
    except queue.Empty:
        raise AssertionError(f"{' '.join(command)} did not finish in {TIMEOUT_S}s; stderr:\n"
                             f"{''.join(stderr)[-6000:]}") from None
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    return json.loads(output[-1])


def view(rows: list) -> dict[tuple[str, int], list[tuple[int, bytes]]]:
    out: dict[tuple[str, int], list[tuple[int, bytes]]] = {}
    for topic, partition, offset, value in sorted(rows, key=lambda r: tuple(r[:3])):
        out.setdefault((topic, partition), []).append((offset, value.encode()))
    return out


def error_type(outcome: dict) -> str | None:
    """The broker error kafkajs reports for a failed call (maybe wrapped by a retrier)."""
    assert not outcome["ok"], outcome
    error = outcome["error"]
    return error["type"] or next((e["type"] for e in error["errors"] if e["type"]), None)


# -------------------------------------------------------------- idempotence
def test_idempotent_producer_exactly_once(gateway, topic_name):
    """idempotent: true: five sends of 40 records over 2 partitions, each
    answered with its exact base offset, read back once each."""
    result = run_txn(gateway, topic_name, "idempotent")
    assert result["sends"] == [[[topic_name, 0, 20 * r], [topic_name, 1, 20 * r]]
                               for r in range(5)]
    got = view(result["read"])
    for partition in range(2):
        assert got[(topic_name, partition)] == [
            (o, b"idem-%d" % ((o // 20) * 40 + 2 * (o % 20) + partition)) for o in range(100)]
        assert_one_idempotent_producer(gateway, topic_name, partition)


# ----------------------------------------------------- commit and abort
def test_commit_and_abort_across_topics_and_partitions(gateway, topic_name):
    """c1 committed, a2 aborted, o3 open then committed, over 2 topics and 5
    partitions: read_committed and read_uncommitted consumers both see
    exactly c1, then c1 and o3, in order, the COMMIT markers' offsets skipped."""
    topics = topic_names(topic_name)
    result = run_txn(gateway, topic_name, "commitAbort")
    partitions = sorted([t, p] for t, n in topics.items() for p in range(n))
    for tag in ("c1", "a2", "o3"):  # base offset -1: offsets are assigned at commit
        assert sorted(r[:2] for r in result["reported"][tag]) == partitions
        assert {r[2] for r in result["reported"][tag]} == {-1}
    offsets = log_offsets([(PER_PARTITION, "commit"), (PER_PARTITION, "abort"),
                           (PER_PARTITION, "commit")], keeps_aborted=False)
    first = expected_view(topics, [("c1", offsets[0])])
    both = expected_view(topics, [("c1", offsets[0]), ("o3", offsets[2])])
    assert view(result["openCommitted"]) == first
    assert view(result["openUncommitted"]) == first
    assert view(result["committed"]) == both
    assert view(result["uncommitted"]) == both
    assert len(result["committed"]) == 2 * len(txn_records("x", topics))


# ------------------------------------------------------------ group offsets
def test_send_offsets_moves_the_group_only_on_commit(gateway, topic_name):
    """sendOffsets: the group's offset stays put through an abort and moves
    with the commit. While the transaction is open, OffsetFetch with
    require_stable answers UNSTABLE_OFFSET_COMMIT; admin.fetchOffsets (no
    require_stable) the old offset."""
    group, source = f"g-{topic_name}", (f"{topic_name}-in", 0)
    pending: list = []

    def while_open() -> None:
        pending.append(fetch_offsets(gateway, group, [source], require_stable=True)[source])
        pending.append(fetch_offsets(gateway, group, [source], require_stable=False)[source])

    result = run_txn(gateway, topic_name, "sendOffsets", group,
                     on_pause={"offsets-pending": while_open})
    assert result["fetched"] == {"before": -1, "openAborted": -1, "afterAbort": -1,
                                 "open": -1, "afterCommit": 6}
    assert pending == [(-1, ErrorCode.unstable_offset_commit), (-1, ErrorCode.none)]
    assert [row[3] for row in result["output"]] == [f"out-{i}" for i in range(6)]
    assert fetch_offsets(gateway, group, [source], True) == {source: (6, ErrorCode.none)}


# ----------------------------------------------------------------- fencing
def test_zombie_is_fenced_and_its_transaction_never_visible(gateway, topic_name):
    """A second producer with the same transactionalId aborts the first one's
    open transaction; the zombie's send and commit fail: INVALID_PRODUCER_EPOCH."""
    result = run_txn(gateway, topic_name, "zombie")
    assert error_type(result["zombieSend"]) == "INVALID_PRODUCER_EPOCH"
    assert error_type(result["zombieCommit"]) == "INVALID_PRODUCER_EPOCH"
    expected = {(topic_name, 0): [(0, b"successor")]}
    assert view(result["committed"]) == expected
    assert view(result["uncommitted"]) == expected
    assert stored_log(gateway, topic_name, 1).high_watermark == 0


# ---------------------------------------------------------------- conflicts
def test_conflict_at_txn_offset_commit_aborts_and_goes_on(gateway, topic_name):
    """The winner commits offset 10 first; the loser's sendOffsets for the same
    range fails with ILLEGAL_GENERATION; it aborts and its next transaction commits."""
    group = f"g-{topic_name}"
    result = run_txn(gateway, topic_name, "conflict", group, "after")
    assert error_type(result["sendOffsets"]) == "ILLEGAL_GENERATION"
    assert "commit" not in result
    assert result["abort"] == {"ok": True}
    assert result["next"] == {"ok": True}
    assert [row[3] for row in result["output"]] == ["winner", "loser-next"]
    source = (f"{topic_name}-in", 0)
    assert fetch_offsets(gateway, group, [source], True) == {source: (10, ErrorCode.none)}


def test_conflict_at_end_txn_needs_a_new_producer(gateway, topic_name):
    """Both stage offset 10; the winner commits first; the loser's commit fails
    with UNKNOWN_PRODUCER_ID. kafkajs cannot abort or begin after a failed
    commit; nothing of its transaction landed, and a new producer goes on."""
    group = f"g-{topic_name}"
    result = run_txn(gateway, topic_name, "conflict", group, "before")
    assert error_type(result["commit"]) == "UNKNOWN_PRODUCER_ID"
    assert not result["abort"]["ok"] and not result["next"]["ok"]
    assert [row[3] for row in result["output"]] == ["winner", "loser-next"]
    source = (f"{topic_name}-in", 0)
    assert fetch_offsets(gateway, group, [source], True) == {source: (10, ErrorCode.none)}


# ----------------------------------------------------------------- timeout
def test_transaction_timeout_aborts_and_fences(gateway, topic_name):
    """transactionTimeout 2000: the gateway aborts the open transaction (nothing
    of it enters the log) and bumps the epoch: commit fails, INVALID_PRODUCER_EPOCH."""
    txn_id = f"timeout-{topic_name}"

    def until_timed_out() -> None:
        wait_for(lambda: timed_out(gateway, txn_id), 30, "the transaction to time out")

    result = run_txn(gateway, topic_name, "timeout", txn_id,
                     on_pause={"timed-out": until_timed_out})
    assert error_type(result["commit"]) == "INVALID_PRODUCER_EPOCH"
    assert stored_log(gateway, topic_name, 0).high_watermark == 0
