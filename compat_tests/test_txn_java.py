"""Transactions with the Java client (kafka-clients 3.4.1), each scenario run
against the gateway and against Apache Kafka 3.4.1 (the ``kafka_broker``
reference), asserting the same client-visible outcome where Kafka's semantics
apply and the gateway's intended differences explicitly (docs/transactions.md):

- a transactional send's RecordMetadata has offset -1 on the gateway (the
  offsets are assigned at commit), its real offset on Kafka;
- read_uncommitted consumers see open and aborted transactions' records on
  Kafka, only committed ones on the gateway (aborted data is in no log);
- two producers with different transactional ids committing the same group
  partition: both land on Kafka, exactly one on the gateway (the offset-range
  check), and the loser's client recovers by itself.

Programs: jvm/src/javatxn/ (TxnCheck, OffsetsCheck, TxnAdminCheck); every
topic is made by the program through the Admin client.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict

import pytest
from group_helpers import group_gateway
from java_helpers import by_op, run_java, step

from testkit import routing

# The gateway aborts timed-out transactions every 200 ms (Kafka 3.4: 10 s).
CLEANUP_INTERVAL_MS = "200"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with group_gateway(tmp_path_factory.mktemp("txn-java") / "data",
                       "--transaction-abort-timed-out-transaction-cleanup-interval-ms",
                       CLEANUP_INTERVAL_MS) as gw:
        yield gw


def names() -> list[str]:
    u = uuid.uuid4().hex[:10]
    return ["--topic", f"t-{u}", "--txn-id", f"x-{u}", "--group", f"g-{u}"]


def both(gateway, kafka_broker, classes, program: str, command: str,
         *args: str) -> dict[str, list[dict]]:
    """The program's lines against the gateway and against Kafka (fresh names each)."""
    return {target: run_java(broker, classes, f"javatxn.{program}", command, *names(), *args,
                             timeout=240)
            for target, broker in (("gateway", gateway), ("kafka", kafka_broker))}


def by_partition(records: list[list]) -> dict[str, list[tuple[int, str]]]:
    """{"topic-suffix/partition": [(offset, value), ...]} with the unique topic
    prefix cut off (so the two runs compare)."""
    out: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for topic, partition, offset, value in records:
        out[f"{topic.split('-', 2)[2] if topic.count('-') > 1 else ''}/{partition}"].append(
            (offset, value))
    return {key: sorted(rows) for key, rows in sorted(out.items())}


def values(records: list[list]) -> dict[str, list[str]]:
    return {key: [v for _o, v in rows] for key, rows in by_partition(records).items()}


def ends(end: dict[str, int]) -> dict[str, int]:
    """End offsets keyed like by_partition."""
    out = {}
    for name, offset in end.items():
        topic, partition = name.rsplit("/", 1)
        out[f"{topic.split('-', 2)[2] if topic.count('-') > 1 else ''}/{partition}"] = offset
    return out


def read(lines: list[dict], op: str, isolation: str) -> dict:
    [found] = [line for line in by_op(lines)[op] if line["isolation"] == isolation]
    return found


def error(outcome) -> str:
    assert isinstance(outcome, dict), f"expected an error, got {outcome!r}"
    return outcome["error"]


# Partitions as the programs spread records: record i goes to TPS[i % 5].
TPS = ["a/0", "a/1", "a/2", "b/0", "b/1"]


def spread(prefix: str, count: int) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for i in range(count):
        out[TPS[i % len(TPS)]].append(f"{prefix}-{i}")
    return dict(out)


def test_commit_and_abort_across_topics_and_partitions(gateway, kafka_broker, java_line_classes):
    """A committed transaction over 2 topics and 5 partitions, an aborted one
    (flushed, and read while open), another committed one. read_committed
    consumers see exactly the two committed transactions' records, in order,
    on both brokers (COMMIT markers skipped). The differences: transactional
    acks carry offset -1 on the gateway, and its read_uncommitted consumers
    see nothing of the open or the aborted transaction."""
    runs = both(gateway, kafka_broker, java_line_classes, "TxnCheck", "visibility")
    committed = {key: spread("c1", 10)[key] + spread("c3", 5)[key] for key in TPS}
    for target, lines in runs.items():
        assert values(read(lines, "after", "read_committed")["records"]) == committed, target
        assert values(read(lines, "while_open", "read_committed")["records"]) == \
            spread("c1", 10), target
        assert {ends(read(lines, "while_open", "read_committed")["end"])[k] for k in TPS} == {3}

    gw = runs["gateway"]
    for op in ("commit1", "open_acks", "commit3"):
        assert {offset for _t, _p, offset in step(gw, op)["acks"]} == {-1}, op
    # Offsets are assigned at commit: c1 at 0-1, its COMMIT marker at 2, c3 at 3,
    # its marker at 4; the aborted transaction took none.
    after = {key: [(0, c1), (1, c1b), (3, c3)] for key, (c1, c1b, c3) in committed.items()}
    for isolation in ("read_committed", "read_uncommitted"):
        assert by_partition(read(gw, "after", isolation)["records"]) == after, isolation
        assert ends(read(gw, "after", isolation)["end"]) == dict.fromkeys(TPS, 5)
        open_read = read(gw, "while_open", isolation)
        assert values(open_read["records"]) == spread("c1", 10), isolation
        assert ends(open_read["end"]) == dict.fromkeys(TPS, 3), isolation

    kafka = runs["kafka"]
    acks = {op: sorted(offset for _t, _p, offset in step(kafka, op)["acks"])
            for op in ("commit1", "open_acks", "commit3")}
    assert acks == {"commit1": [0] * 5 + [1] * 5, "open_acks": [3] * 5 + [4] * 5,
                    "commit3": [6] * 5}
    aborted = spread("a2", 10)
    assert by_partition(read(kafka, "after", "read_uncommitted")["records"]) == {
        key: [(0, c1), (1, c1b), (3, aborted[key][0]), (4, aborted[key][1]), (6, c3)]
        for key, (c1, c1b, c3) in committed.items()}
    assert values(read(kafka, "while_open", "read_uncommitted")["records"]) == {
        key: spread("c1", 10)[key] + aborted[key] for key in TPS}
    assert ends(read(kafka, "while_open", "read_uncommitted")["end"]) == dict.fromkeys(TPS, 5)
    assert ends(read(kafka, "after", "read_committed")["end"]) == dict.fromkeys(TPS, 8)


def test_zombie_producer_is_fenced(gateway, kafka_broker, java_line_classes):
    """Producer 1 writes in a transaction; producer 2 initTransactions with the
    same transactional id. On both brokers producer 1's commit, abort and
    next begin all throw ProducerFencedException (fatal), producer 2 commits,
    and read_committed consumers see only producer 2's records. On Kafka a
    read_uncommitted consumer also sees the zombie's aborted records; on the
    gateway nothing of them exists."""
    runs = both(gateway, kafka_broker, java_line_classes, "TxnCheck", "zombie")
    second = {"/0": ["z2-0", "z2-2"], "/1": ["z2-1", "z2-3"]}
    for target, lines in runs.items():
        assert step(lines, "second_init")["outcome"] == "ok", target
        for op in ("zombie_commit", "zombie_abort", "zombie_begin"):
            assert error(step(lines, op)["outcome"]) == "ProducerFencedException", (target, op)
        assert step(lines, "second_commit")["outcome"] == "ok", target
        assert values(read(lines, "after", "read_committed")["records"]) == second, target
    assert {o for _t, _p, o in step(runs["gateway"], "zombie_acks")["acks"]} == {-1}
    assert sorted(o for _t, _p, o in step(runs["kafka"], "zombie_acks")["acks"]) == [0, 0, 1, 1]
    assert values(read(runs["gateway"], "after", "read_uncommitted")["records"]) == second
    assert values(read(runs["kafka"], "after", "read_uncommitted")["records"]) == {
        "/0": ["z1-0", "z1-2", "z2-0", "z2-2"], "/1": ["z1-1", "z1-3", "z2-1", "z2-3"]}


def test_send_offsets_moves_the_group_offset_only_on_commit(gateway, kafka_broker,
                                                            java_line_classes):
    """sendOffsetsToTransaction with a member's groupMetadata(): the offsets move
    on commit, not on abort. While a transaction's offsets are pending, the
    Admin client's listConsumerGroupOffsets(requireStable) leaves those
    partitions out (it logs UNSTABLE_OFFSET_COMMIT and skips them), the
    read_committed consumer's committed() retries until its timeout
    (TimeoutException), and a listing without requireStable shows the old
    offsets - on both brokers. After the commit both show the new offsets;
    the gateway on the first ask (its commit is one write), Kafka once its
    markers are written."""
    runs = both(gateway, kafka_broker, java_line_classes, "OffsetsCheck", "offsets")
    for target, lines in runs.items():
        def stable(op: str, lines=lines) -> dict:
            return {k.rsplit("/", 1)[1]: v for k, v in step(lines, op)["stable"]["offsets"].items()}

        assert list(step(lines, "before")["stable"].values()) == [None, None], target
        assert stable("after_commit") == {"0": 2, "1": 2}, target
        assert stable("after_abort") == {"0": 2, "1": 2}, target
        assert list(step(lines, "after_abort")["unstable"].values()) == [2, 2], target
        open_ = step(lines, "while_open")
        assert open_["stable"] == {}, target
        assert list(open_["unstable"].values()) == [2, 2], target
        assert error(open_["consumer_committed"]) == "TimeoutException", target
        assert stable("after_second_commit") == {"0": 5, "1": 6}, target
        assert list(step(lines, "after_second_commit")["consumer_committed"].values()) == [5, 6]
        assert [v for *_rest, v in step(lines, "output")["records"]] == [
            "committed-1", "committed-2"], target
    gw = runs["gateway"]
    for op in ("after_commit", "after_abort", "after_second_commit"):
        assert step(gw, op)["stable"]["attempts"] == 1, op
    # The aborted transaction's record: in Kafka's log (offset 2, its ABORT
    # marker at 3), in none of the gateway's.
    assert [o for _t, _p, o, _v in step(gw, "output")["records"]] == [0, 2]
    assert [o for _t, _p, o, _v in step(runs["kafka"], "output")["records"]] == [0, 4]


@pytest.mark.parametrize("variant", ["late-offsets", "late-commit"])
def test_two_transactional_ids_commit_the_same_group_partition(gateway, kafka_broker,
                                                               java_line_classes, variant):
    """Producers A and B (different transactional ids, the same member's group
    metadata) both process offsets [0, 5) of the group's one partition. A
    commits first. On the gateway exactly one lands: B fails with an
    abortable error - CommitFailedException from sendOffsetsToTransaction
    when it sends its offsets after A's commit (TxnOffsetCommit:
    ILLEGAL_GENERATION), UnknownProducerIdException from commitTransaction
    when it sent them before (EndTxn: UNKNOWN_PRODUCER_ID) - aborts, and the
    same producer instance then commits a new transaction (KIP-360 epoch
    bump). Kafka has no such check: both land."""
    runs = both(gateway, kafka_broker, java_line_classes, "OffsetsCheck", "conflict",
                "--variant", variant)
    for target, lines in runs.items():
        assert step(lines, "a_commit")["outcome"] == "ok", target
        assert list(step(lines, "after_first_round")["stable"]["offsets"].values()) == [5]
        assert step(lines, "b_again")["outcome"] == "ok", target
        assert list(step(lines, "after_second_round")["stable"]["offsets"].values()) == [10]

    gw = runs["gateway"]
    if variant == "late-offsets":
        failed = step(gw, "b_offsets")["outcome"]
        assert error(failed) == "CommitFailedException"
        assert "group generation id is not valid" in failed["message"]
        assert step(gw, "b_commit")["outcome"] is None  # the loop aborts instead
    else:
        assert step(gw, "b_offsets")["outcome"] == "ok"
        assert error(step(gw, "b_commit")["outcome"]) == "UnknownProducerIdException"
    assert step(gw, "b_abort")["outcome"] == "ok"
    assert [(o, v) for _t, _p, o, v in step(gw, "output")["records"]] == [(0, "a1"), (2, "b2")]

    kafka = runs["kafka"]
    assert (step(kafka, "b_offsets")["outcome"], step(kafka, "b_commit")["outcome"]) == (
        "ok", "ok")
    assert "b_abort" not in by_op(kafka)
    got = [v for *_rest, v in step(kafka, "output")["records"]]
    assert sorted(got[:2]) == ["a1", "b1"] and got[2:] == ["b2"]


def test_transaction_timeout_aborts_and_fences(gateway, kafka_broker, java_line_classes):
    """transaction.timeout.ms=2000, left open: the broker aborts it (state
    CompleteAbort) and bumps the epoch; the producer's commit and abort then
    throw ProducerFencedException. Nothing is readable at read_committed on
    either broker; Kafka's read_uncommitted consumers still read the aborted
    records, the gateway's do not, and its log is empty."""
    runs = both(gateway, kafka_broker, java_line_classes, "TxnCheck", "timeout")
    for target, lines in runs.items():
        assert step(lines, "open") == {"state": "Ongoing", "epoch": 0, "timeout_ms": 2000}
        assert step(lines, "timed_out") == {"state": "CompleteAbort", "epoch": 1,
                                            "same_producer": True, "partitions": 0}, target
        for op in ("commit", "abort"):
            assert error(step(lines, op)["outcome"]) == "ProducerFencedException", (target, op)
        assert read(lines, "after", "read_committed")["records"] == [], target
    gw = runs["gateway"]
    assert read(gw, "after", "read_uncommitted")["records"] == []
    assert list(read(gw, "after", "read_uncommitted")["end"].values()) == [0]
    assert [v for *_rest, v in read(runs["kafka"], "after", "read_uncommitted")["records"]] == [
        "t-0", "t-1", "t-2"]


def test_admin_lists_and_describes_transactions_and_producers(gateway, kafka_broker,
                                                              java_line_classes):
    """Admin listTransactions (all, by state, by producer id),
    describeTransactions and describeProducers for an open transaction (2
    records on each of 2 partitions, offsets of a group) and after its
    commit; describeTransactions of an unknown id fails with
    TransactionalIdNotFoundException. Exact on the gateway; on Kafka the same
    except: it also lists the group's __consumer_offsets partition in the
    transaction, it may show PrepareCommit right after commitTransaction()
    returns (its markers are written after EndTxn answers; the gateway's
    commit is one write), and its producers carry the open transaction's
    first offset (0) and, after the commit, the coordinator epoch of the
    markers."""
    runs = both(gateway, kafka_broker, java_line_classes, "TxnAdminCheck", "admin")
    runs_on = {"gateway": gateway, "kafka": kafka_broker}
    for target, lines in runs.items():
        before, after = step(lines, "open")["window"]
        opened = step(lines, "describe_open")
        pid = opened["producer_id"]
        assert pid >= 0
        assert before <= opened.pop("start_ms") <= after, target
        topic = opened["partitions"][-1].rsplit("/", 1)[0]
        ours = [f"{topic}/0", f"{topic}/1"]
        offsets_partition = ["__consumer_offsets/0"] if target == "kafka" else []
        # The id's coordinator as FindCoordinator names it: Kafka's one broker
        # (node 1); the gateway (node 0), or on a cluster the one of its three
        # the id's slot is placed on.
        txn_id = step(lines, "list_open")["all"][0][0]
        coordinator, _, _ = asyncio.run(asyncio.wait_for(routing.coordinator_of(
            runs_on[target].host_port, txn_id, routing.TRANSACTION), 30))
        assert coordinator in (gateway.nodes() if target == "gateway" else {1}), coordinator
        assert opened == {"coordinator": coordinator, "state": "Ongoing",
                          "producer_id": pid, "epoch": 0, "timeout_ms": 45000,
                          "partitions": offsets_partition + ours}, target
        # The gateway's commit is one write: no PrepareCommit is ever seen.
        settle = step(lines, "settle")["states"]
        assert settle == (["CompleteCommit"] if target == "gateway" else settle), target
        assert settle[-1] == "CompleteCommit" and set(settle) <= {"PrepareCommit",
                                                                  "CompleteCommit"}
        done = step(lines, "describe_committed")
        assert done == {**opened, "state": "CompleteCommit", "partitions": [],
                        "start_ms": done["start_ms"]}, target
        assert before <= done["start_ms"] <= after  # the last transaction's start, kept

        for when, state in (("open", "Ongoing"), ("committed", "CompleteCommit")):
            listing = step(lines, f"list_{when}")
            txn_id = listing["all"][0][0]
            assert listing == {"all": [[txn_id, pid, state]], "in_state": [[txn_id, pid, state]],
                               "in_other_state": [], "by_producer": [[txn_id, pid, state]]}, (
                target, when)

            producers = step(lines, f"producers_{when}")
            assert producers["producer_id"] == pid
            assert sorted(producers["partitions"]) == ours
            for rows in producers["partitions"].values():
                [row] = rows
                stamp = row.pop("last_timestamp")
                assert before <= stamp, (target, when)
                if target == "gateway" or when == "open":
                    assert stamp <= after, (target, when)
                expected = {"producer_id": pid, "epoch": 0, "last_sequence": 1,
                            "coordinator_epoch": None, "txn_start_offset": None}
                if target == "kafka":
                    expected.update({"txn_start_offset": 0} if when == "open" else
                                    {"coordinator_epoch": 0})
                assert row == expected, (target, when)
        assert error(step(lines, "unknown")["outcome"]) == "TransactionalIdNotFoundException"
