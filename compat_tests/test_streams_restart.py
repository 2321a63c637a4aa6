"""Kafka Streams 3.4.1 (exactly_once_v2) stopped cleanly and restarted with
its state directory kept, on the gateway and on Apache Kafka 3.4.1: what the
restart restores. Program: jvm/src/compaction/CountStreams.java (input ->
groupBy(user) -> count() in the store "counts" -> output).

The first run counts KEYS records, one per user, so the store holds KEYS keys
and its changelog KEYS records; it stops cleanly and writes its
``.checkpoint`` files. The second run starts on the same state directory,
counts MORE records and stops; each user's last count in the output
(read_committed) must then be exact, in every case.

What differs, and is asserted: Streams checkpoints a changelog at the offsets
the producer's acknowledgements returned. Kafka returns them, so the
checkpoint names every changelog partition and the restart restores nothing.
The gateway answers a transactional Produce with offset -1 (the offsets are
assigned at the commit): RecordCollectorImpl warns once per record and keeps
no offset, so the checkpoint has the changelog partitions at OFFSET_UNKNOWN
(-4); under EOS a non-empty store without a checkpointed offset is treated
as corrupt (it may hold uncommitted writes): Streams wipes it and restores
the whole changelog, KEYS records.

The third case runs the same app on the gateway with
``topic.gateway.transactional.produce.offset=lower-bound`` in its
StreamsConfig: Streams passes the name on when it creates its internal
topics (asserted through DescribeConfigs), the gateway answers their
transactional Produce with a lower bound of each record's offset (exact for
a changelog, which has one writer), and the checkpoint and the restart are
then as on Kafka: the offset of each changelog partition's last record,
nothing restored, exact counts. The restore figures are printed
(docs/transactions.md quotes them); no timing is asserted.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from compat_helpers import create_topic
from group_helpers import committed_offsets, group_gateway, wait_for
from java_helpers import JavaProcess, by_op, run_java, step
from kio.schema.errors import ErrorCode

from kafka_gateway.client import KafkaClient
from kafka_gateway.topic_configs import SOURCE_DYNAMIC_TOPIC
from tablets.topic_config import TXN_OFFSET_LOWER_BOUND, TXN_PRODUCE_OFFSET
from testkit import kafka_requests as rq
from testkit.compaction import now_ms

PARTITIONS = 2
KEYS = 100_000  # users, one record each in the first run: the store's keys
MORE = 2_000
PROGRAM = "compaction.CountStreams"
OFFSET_UNKNOWN = -4  # org.apache.kafka.streams.state.internals.OffsetCheckpoint
# Streams checkpoints a changelog at the offset of the last record it wrote
# there; the commit marker after it makes the end offset 2 past it.
LAST_RECORD_TO_END = 2


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with group_gateway(tmp_path_factory.mktemp("streams-restart") / "data") as gw:
        yield gw


@pytest.fixture(params=["gateway", "gateway-lower-bound", "kafka"])
def case(request) -> str:
    return request.param


@pytest.fixture
def server(request, case):
    return request.getfixturevalue("kafka_broker" if case == "kafka" else "gateway")


def _ask(server, request_for: Callable[[], object]) -> object:
    async def main() -> object:
        client = await KafkaClient.connect(*server.host_port)
        try:
            return await client.request(request_for())
        finally:
            await client.close()

    return asyncio.run(asyncio.wait_for(main(), 30))


def topic_config(server, topic: str, name: str) -> tuple[str, int]:
    """A topic config's value and source, as DescribeConfigs reports them."""
    answer = _ask(server, lambda: rq.describe_configs([(rq.TOPIC, topic, [name])]))
    [result] = answer.results  # type: ignore[attr-defined]
    assert result.error_code is ErrorCode.none, result
    [entry] = result.configs
    return entry.value, entry.config_source


def end_offsets(server, topic: str) -> dict[int, int]:
    answer = _ask(server, lambda: rq.list_offsets(topic, [(p, -1) for p in range(PARTITIONS)]))
    return {p.partition_index: p.offset
            for p in answer.topics[0].partitions}  # type: ignore[attr-defined]


def consumed(server, group: str, topic: str) -> int:
    """How many records of ``topic`` the group has committed past."""
    return sum(max(offset, 0) for (name, _p), (offset, _m)
               in committed_offsets(server, group).items() if name == topic)


def checkpoints(state_dir: Path) -> dict[tuple[str, int], int]:
    """Every (topic, partition) -> offset in the app's ``.checkpoint`` files
    (Streams' OffsetCheckpoint: a version line, a count line, then
    "topic partition offset" lines)."""
    found: dict[tuple[str, int], int] = {}
    for path in state_dir.glob("*/.checkpoint"):  # one per task: APP/0_0/.checkpoint
        lines = path.read_text().splitlines()
        assert lines[0] == "0" and int(lines[1]) == len(lines) - 2, (path, lines)
        for line in lines[2:]:
            topic, partition, offset = line.split()
            found[(topic, int(partition))] = int(offset)
    return found


@pytest.mark.timeout(1500)
def test_streams_restart_keeping_its_state_directory(case, server, java_classes, tmp_path,
                                                     topic_name):
    name = case
    # The third case sets the gateway's topic config on every internal topic
    # the way an app would: StreamsConfig "topic." + its name.
    extra = ["--topic-config", f"{TXN_PRODUCE_OFFSET}={TXN_OFFSET_LOWER_BOUND}"] \
        if case == "gateway-lower-bound" else []
    source, output, app_id = f"{topic_name}-in", f"{topic_name}-out", f"app-{topic_name}"
    changelog = f"{app_id}-counts-changelog"
    state_dir = tmp_path / "state"
    create_topic(server, source, partitions=PARTITIONS)
    create_topic(server, output, partitions=PARTITIONS)
    base_ms = now_ms() - 60_000 - 10 * (KEYS + MORE)

    def produce(start: int, count: int) -> None:
        lines = run_java(server, java_classes, PROGRAM, "produce", "--input", source,
                         "--users", str(KEYS), "--from", str(start), "--count", str(count),
                         "--base-ms", str(base_ms), timeout=300)
        assert step(lines, "produced") == {"count": count}

    def dump() -> dict[str, int]:
        return step(run_java(server, java_classes, PROGRAM, "dump", "--output", output,
                             "--partitions", str(PARTITIONS), timeout=300), "counts")["counts"]

    def run_until(total: int, log: str) -> list[dict]:
        """A run of the app on the state directory until the first ``total``
        records are counted, as the output shows, then a clean stop."""
        expected = dict(Counter(f"user-{n % KEYS}" for n in range(total)))
        app = JavaProcess(server, java_classes, PROGRAM, "run", "--app-id", app_id,
                          "--input", source, "--output", output, "--state-dir", str(state_dir),
                          *extra)
        try:
            app.wait_until(lambda lines: any(line.get("state") == "RUNNING" for line in lines),
                           600, "the state RUNNING")
            if total > KEYS:
                produce(KEYS, total - KEYS)
            # The source consumed first (the repartition topic is read after it) ...
            wait_for(lambda: consumed(server, app_id, source) >= total, 900,
                     f"{app_id} to consume {total}", None, 1.0)
            # ... then every count in the output: no other count can come.
            wait_for(lambda: dump() == expected, 900, f"{app_id} to count {total}", None, 1.0)
            return app.finish()
        finally:
            app.kill()
            (tmp_path / log).write_text(app.stderr())

    produce(0, KEYS)
    first = run_until(KEYS, "run-1.log")
    assert step(first, "closed") == {"clean": True, "errors": []}
    checkpointed = checkpoints(state_dir / app_id)
    changelog_ends = end_offsets(server, changelog)

    second = run_until(KEYS + MORE, "run-2.log")
    assert step(second, "closed") == {"clean": True, "errors": []}
    assert dump() == dict(Counter(f"user-{n % KEYS}" for n in range(KEYS + MORE)))

    ops = by_op(second)
    restored = [line for line in ops.get("restored", []) if line["topic"] == changelog]
    starts = [line for line in ops.get("restore-start", []) if line["topic"] == changelog]
    restored_records = sum(line["records"] for line in restored)
    states = ops["state"]
    running_ms = next(line["ms"] for line in states if line["state"] == "RUNNING")
    restore_ms = (max(line["ms"] for line in restored) - min(line["ms"] for line in starts)
                  if restored else 0)
    warnings = [step(run, "offset-warnings")["count"] for run in (first, second)]
    changelog_checkpoints = {tp: o for tp, o in checkpointed.items() if tp[0] == changelog}
    print(f"\nstreams restart on {name}: store of {KEYS} keys; checkpointed changelog "
          f"offsets {sorted(changelog_checkpoints.values())}; restored {restored_records} "
          f"changelog records in {restore_ms / 1000:.1f} s (restore start to end), "
          f"{(running_ms - states[0]['ms']) / 1000:.1f} s from start to RUNNING; "
          f"offset=-1 warnings per run {warnings}; changelog end offsets after the first "
          f"run {changelog_ends}; checkpoints {sorted(checkpointed)}")

    if name == "gateway-lower-bound":
        # Streams passed the config on (a name Kafka does not know) to
        # CreateTopics: the internal topics have it, the app's own do not.
        for internal in (changelog, f"{app_id}-by-user-repartition"):
            assert topic_config(server, internal, TXN_PRODUCE_OFFSET) == (
                TXN_OFFSET_LOWER_BOUND, SOURCE_DYNAMIC_TOPIC), internal
        assert topic_config(server, output, TXN_PRODUCE_OFFSET)[0] == "unknown"
        # Real offsets, as on Kafka: the changelog's single writer got
        # exact bounds, so each checkpoint is the offset of the partition's
        # last record, followed only by the last commit's marker.
        assert changelog_checkpoints == {(changelog, p): end - LAST_RECORD_TO_END
                                         for p, end in changelog_ends.items()}
        assert sum(changelog_ends.values()) > KEYS  # the records and the commit markers
        assert restored_records == 0  # from the checkpoints: nothing to read again
        # Sends to the internal topics have offsets now; the output topic
        # (the app's own, without the config) still answers -1: one warning
        # per output record (more if a transaction was retried).
        assert KEYS <= warnings[0] < 2 * KEYS and MORE <= warnings[1] < 2 * MORE
    elif name == "kafka":
        assert changelog_checkpoints == {(changelog, p): end - LAST_RECORD_TO_END
                                         for p, end in changelog_ends.items()}
        assert restored_records == 0  # from the checkpoints: nothing to read again
        assert warnings == [0, 0]
    else:
        # No offset was ever acknowledged: Streams checkpoints its changelog
        # partitions as OFFSET_UNKNOWN (-4), which it reads back as no offset.
        assert changelog_checkpoints == {(changelog, p): OFFSET_UNKNOWN for p in range(PARTITIONS)}
        assert sorted(line["partition"] for line in restored) == list(range(PARTITIONS))
        assert restored_records == KEYS  # the store wiped and read back whole
        # One warning per record sent: repartition, changelog and output
        # (more if a transaction was retried).
        assert warnings[0] >= 3 * KEYS and warnings[1] >= 3 * MORE
