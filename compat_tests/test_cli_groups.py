"""``kafka-gateway groups reset-offsets|delete|delete-offsets`` and ``--all-groups``
against a running gateway, with the rules of kafka-consumer-groups.sh."""

from __future__ import annotations

import datetime
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from testkit.cli import run_cli
from testkit.gateway import GatewayProcess

TIMEOUT = 30
HOUR_MS = 3_600_000
START = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
START_MS = int(START.timestamp() * 1000)


def cli(gateway, *args: str, check: bool = True):
    return run_cli(gateway.bootstrap, *args, check=check)


def produce(gateway, topic: str, counts: dict[int, int], timestamp=None) -> None:
    producer = Producer({"bootstrap.servers": gateway.bootstrap})
    for partition, count in counts.items():
        for i in range(count):
            extra = {} if timestamp is None else {"timestamp": timestamp(i)}
            producer.produce(topic, value=b"x", partition=partition, **extra)
    assert producer.flush(TIMEOUT) == 0


def commit(gateway, group: str, offsets: dict[tuple[str, int], int]) -> None:
    consumer = Consumer({"bootstrap.servers": gateway.bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                    asynchronous=False)
    consumer.close()


def committed(gateway, group: str, topic: str, partitions: int) -> list[int]:
    consumer = Consumer({"bootstrap.servers": gateway.bootstrap, "group.id": group})
    found = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], TIMEOUT)
    consumer.close()
    return [tp.offset for tp in found]


def plan(output: str) -> dict[tuple[str, str, int], int]:
    """The GROUP TOPIC PARTITION NEW-OFFSET table."""
    rows = [line.split() for line in output.splitlines()]
    assert rows[0] == ["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"], output
    return {(g, t, int(p)): int(o) for g, t, p, o in rows[1:]}


@pytest.fixture
def group_at(gateway, topic_name):
    """A group with offsets 3 and 1 committed on a topic of 2 partitions of 5 records."""
    cli(gateway, "topics", "create", topic_name, "--partitions", "2")
    produce(gateway, topic_name, {0: 5, 1: 5})
    group = f"{topic_name}-g"
    commit(gateway, group, {(topic_name, 0): 3, (topic_name, 1): 1})
    return group


def test_reset_is_a_dry_run_until_execute(gateway, topic_name, group_at):
    dry = cli(gateway, "groups", "reset-offsets", "--group", group_at, "--topic", topic_name,
              "--to-earliest")
    assert plan(dry.stdout) == {(group_at, topic_name, 0): 0, (group_at, topic_name, 1): 0}
    assert "--execute" in dry.stderr
    explicit = cli(gateway, "groups", "reset-offsets", group_at, "--all-topics", "--to-latest",
                   "--dry-run")
    assert plan(explicit.stdout) == {(group_at, topic_name, 0): 5, (group_at, topic_name, 1): 5}
    assert committed(gateway, group_at, topic_name, 2) == [3, 1]

    done = cli(gateway, "groups", "reset-offsets", "--group", group_at, "--topic",
               f"{topic_name}:1", "--to-latest", "--execute")
    assert plan(done.stdout) == {(group_at, topic_name, 1): 5}
    assert committed(gateway, group_at, topic_name, 2) == [3, 5]


def test_reset_shift_by_and_to_offset_stay_within_the_log(gateway, topic_name, group_at):
    shifted = cli(gateway, "groups", "reset-offsets", "--group", group_at, "--all-topics",
                  "--shift-by", "-2", "--execute")
    # 3-2 = 1; 1-2 = -1 is below the log start: 0, with a warning
    assert plan(shifted.stdout) == {(group_at, topic_name, 0): 1, (group_at, topic_name, 1): 0}
    assert "lower than the earliest offset" in shifted.stderr
    assert committed(gateway, group_at, topic_name, 2) == [1, 0]

    high = cli(gateway, "groups", "reset-offsets", "--group", group_at, "--topic", topic_name,
               "--to-offset", "4", "--execute")
    assert plan(high.stdout) == {(group_at, topic_name, 0): 4, (group_at, topic_name, 1): 4}
    beyond = cli(gateway, "groups", "reset-offsets", "--group", group_at, "--topic",
                 f"{topic_name}:0", "--to-offset", "99")
    assert plan(beyond.stdout) == {(group_at, topic_name, 0): 5}
    assert "higher than the latest offset" in beyond.stderr

    other = f"{topic_name}-never-committed"
    refused = cli(gateway, "groups", "reset-offsets", "--group", other, "--topic", topic_name,
                  "--shift-by", "1", check=False)
    assert refused.returncode != 0 and "no committed offset" in refused.stderr
    # to-current of a partition without offset: the log end, as Kafka's tool
    current = cli(gateway, "groups", "reset-offsets", "--group", other, "--topic", topic_name,
                  "--to-current")
    assert plan(current.stdout) == {(other, topic_name, 0): 5, (other, topic_name, 1): 5}


def test_reset_to_datetime_and_by_duration(gateway, topic_name):
    # records of 2024 are kept (the gateway's retention check runs every 500 ms here)
    cli(gateway, "topics", "create", topic_name, "--partitions", "1",
        "--config", "retention.ms=-1")
    # one record an hour from START: offset i at START + i hours
    produce(gateway, topic_name, {0: 6}, timestamp=lambda i: START_MS + i * HOUR_MS)
    group = f"{topic_name}-g"
    commit(gateway, group, {(topic_name, 0): 0})

    def reset(*how: str) -> int:
        out = cli(gateway, "groups", "reset-offsets", "--group", group, "--topic", topic_name,
                  *how).stdout
        return plan(out)[(group, topic_name, 0)]

    assert reset("--to-datetime", "2024-01-01T03:00:00.000Z") == 3
    assert reset("--to-datetime", "2024-01-01T02:30:00+00:00") == 3
    assert reset("--to-datetime", "2024-01-01T05:00:00.001Z") == 6  # nothing later: log end
    assert reset("--to-datetime", "2023-12-31T00:00:00Z") == 0
    since = datetime.datetime.now(datetime.UTC) - START
    # a duration reaching back to START + 2h 30m finds the record of START + 3h
    back = since - datetime.timedelta(hours=2, minutes=30)
    assert reset("--by-duration", f"P{back.days}DT{back.seconds}S") == 3
    assert reset("--by-duration", "PT1M") == 6
    bad = cli(gateway, "groups", "reset-offsets", "--group", group, "--topic", topic_name,
              "--by-duration", "an hour", check=False)
    assert bad.returncode == 2 and "ISO-8601 duration" in bad.stderr


def test_reset_export_and_from_file(gateway, topic_name, group_at, tmp_path):
    exported = cli(gateway, "groups", "reset-offsets", "--group", group_at, "--all-topics",
                   "--to-offset", "2", "--export").stdout
    assert exported.splitlines() == [f"{topic_name},0,2", f"{topic_name},1,2"]
    path = tmp_path / "plan.csv"
    path.write_text(f"{topic_name},0,4\n{topic_name},1,0\n")
    cli(gateway, "groups", "reset-offsets", "--group", group_at, "--from-file", str(path),
        "--execute")
    assert committed(gateway, group_at, topic_name, 2) == [4, 0]


def test_an_active_group_is_neither_reset_nor_deleted(gateway, topic_name, group_at):
    consumer = Consumer({"bootstrap.servers": gateway.bootstrap, "group.id": group_at,
                         "enable.auto.commit": False, "session.timeout.ms": 30000})
    assigned: list[TopicPartition] = []
    consumer.subscribe([topic_name], on_assign=lambda _c, parts: assigned.extend(parts))
    deadline = time.monotonic() + TIMEOUT
    while not assigned:
        assert time.monotonic() < deadline, "no assignment"
        consumer.poll(0.2)
    try:
        refused = cli(gateway, "groups", "reset-offsets", "--group", group_at, "--all-topics",
                      "--to-earliest", "--execute", check=False)
        assert refused.returncode == 1
        assert f"group '{group_at}' is inactive (Empty), but its state is Stable" in refused.stderr
        deleted = cli(gateway, "groups", "delete", "--group", group_at, check=False)
        assert deleted.returncode == 1 and "NON_EMPTY_GROUP" in deleted.stderr
        # offsets of a topic the members subscribe to stay
        kept = cli(gateway, "groups", "delete-offsets", "--group", group_at, "--topic",
                   topic_name, check=False)
        assert kept.returncode == 1 and "GROUP_SUBSCRIBED_TO_TOPIC" in kept.stdout
    finally:
        consumer.close()
    assert committed(gateway, group_at, topic_name, 2) == [3, 1]


def test_delete_offsets_of_some_partitions_then_the_group(gateway, topic_name, group_at):
    done = cli(gateway, "groups", "delete-offsets", group_at, "--topic", f"{topic_name}:1")
    assert [line.split() for line in done.stdout.splitlines()] == [
        ["TOPIC", "PARTITION", "STATUS"], [topic_name, "1", "Successful"]]
    assert committed(gateway, group_at, topic_name, 2) == [3, -1001]

    deleted = cli(gateway, "groups", "delete", "--group", group_at)
    assert f"Deleted group {group_at}." in deleted.stdout
    assert group_at not in cli(gateway, "groups", "list").stdout.split()
    again = cli(gateway, "groups", "delete", group_at, check=False)
    assert again.returncode == 1 and "GROUP_ID_NOT_FOUND" in again.stderr


def test_all_groups(tmp_path):
    """--all-groups names every group: describe them all, reset them all, delete them all."""
    with GatewayProcess(tmp_path / "data") as gateway:
        cli(gateway, "topics", "create", "events", "--partitions", "1")
        produce(gateway, "events", {0: 4})
        for number, group in enumerate(("alpha", "beta", "gamma")):
            commit(gateway, group, {("events", 0): number})
        described = cli(gateway, "groups", "describe", "--all-groups").stdout
        assert [line.split("\t")[0] for line in described.splitlines()
                if line.startswith("Group: ")] == [
            "Group: alpha", "Group: beta", "Group: gamma"]
        reset = cli(gateway, "groups", "reset-offsets", "--all-groups", "--all-topics",
                    "--to-latest", "--execute")
        assert plan(reset.stdout) == {(g, "events", 0): 4 for g in ("alpha", "beta", "gamma")}
        both = cli(gateway, "groups", "describe", "alpha", "--all-groups", check=False)
        assert both.returncode != 0 and "not both" in both.stderr
        deleted = cli(gateway, "groups", "delete", "--all-groups").stdout
        assert deleted.splitlines() == [f"Deleted group {g}." for g in ("alpha", "beta", "gamma")]
        assert cli(gateway, "groups", "list").stdout.splitlines() == ["GROUP  STATE  PROTOCOL-TYPE"]
