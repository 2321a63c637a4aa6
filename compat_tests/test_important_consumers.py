"""Important consumers with real clients: retention never deletes what a topic's
``gateway.important.consumer.groups`` have not committed.

Topics keep records for two seconds (``retention.ms``) or a few hundred bytes
(``retention.bytes``); the gateway's retention pass runs every 200 ms. Each
record is its own batch (the producer flushes after each), so the log start
can stop at any offset. That a pass ran and held data back is read from the
gateway's metrics (``kafka_gateway_important_group_held_bytes``) before any
assertion that nothing was deleted, so a check cannot pass because retention
had not run yet.

Clients: confluent-kafka (produce, plain commits, the Admin API), the Java
client 3.4.1 (offsets committed with ``sendOffsetsToTransaction``), Kafka's
own kafka-configs.sh (ConfigCommand), the project's CLI (create, alter,
describe); the web console's topic page.
"""

from __future__ import annotations

import subprocess
import threading
import time
import urllib.request
import uuid

import pytest
from compat_helpers import create_topic
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
)
from group_helpers import wait_for
from java_helpers import by_op, run_java

from testkit import jvm, prom
from testkit.cli import run_cli
from testkit.gateway import GatewayProcess

GROUPS = "gateway.important.consumer.groups"
MAX_BYTES = "gateway.important.consumer.max.bytes"
PREFIX = "kafka_gateway_important_group_"
RECORDS = 20
TIMEOUT = 30
SERVE = ("--admin-listen", "127.0.0.1:0", "--log-retention-check-interval-ms", "200",
         "--group-initial-rebalance-delay-ms", "0")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with GatewayProcess(tmp_path_factory.mktemp("important") / "data", *SERVE) as gw:
        yield gw


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def produce_each(gateway, topic: str, count: int = RECORDS, keyed: bool = False) -> None:
    """``count`` records of equal size, one batch each."""
    producer = Producer({"bootstrap.servers": gateway.bootstrap, "linger.ms": 0})
    for i in range(count):
        producer.produce(topic, key=f"k{i:04d}" if keyed else None, value=f"record-{i:04d}",
                         partition=0)
        assert producer.flush(TIMEOUT) == 0


def watermarks(gateway, topic: str) -> tuple[int, int]:
    consumer = Consumer({"bootstrap.servers": gateway.bootstrap, "group.id": unique("probe")})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=TIMEOUT,
                                              cached=False)
    finally:
        consumer.close()


def earliest(gateway, topic: str) -> int:
    return watermarks(gateway, topic)[0]


def commit(gateway, group: str, topic: str, offset: int) -> None:
    """A plain OffsetCommit, as a consumer that read up to ``offset`` makes it."""
    consumer = Consumer({"bootstrap.servers": gateway.bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, offset)])
        consumer.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
    finally:
        consumer.close()


def consume(gateway, group: str, topic: str, until: int) -> list[int]:
    """A group member reads from its committed offset (earliest without one) to
    ``until``, commits, leaves; the offsets it read."""
    consumer = Consumer({"bootstrap.servers": gateway.bootstrap, "group.id": group,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    read: list[int] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + TIMEOUT
        while not read or read[-1] < until - 1:
            assert time.monotonic() < deadline, f"{group} read only {read}"
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                read.append(message.offset())
        consumer.commit(offsets=[TopicPartition(topic, 0, until)], asynchronous=False)
    finally:
        consumer.close()
    return read


def metric(gateway, name: str, group: str, topic: str) -> float:
    """An important group's metric on partition 0 (KeyError if it is not exported)."""
    return prom.value(gateway.metrics(), PREFIX + name, group=group, topic=topic,
                      partition="0")


def held(gateway, group: str, topic: str) -> float:
    """Wait for a retention pass that holds data back for ``group``: its bytes."""
    return wait_for(lambda: metric(gateway, "held_bytes", group, topic), TIMEOUT,
                    f"retention to hold {topic} for {group}", gateway)


def next_pass(gateway, group: str, topic: str) -> None:
    """Wait until retention has run again since now (the held age is remeasured
    at each pass, so it grows)."""
    before = metric(gateway, "held_age_seconds", group, topic)
    wait_for(lambda: metric(gateway, "held_age_seconds", group, topic) > before, TIMEOUT,
             "another retention pass", gateway)


def caught_up(gateway, topic: str, offset: int) -> None:
    wait_for(lambda: earliest(gateway, topic) == offset, TIMEOUT,
             f"retention to move {topic}'s log start to {offset}", gateway)


def console_table(gateway, topic: str, table_id: str) -> str:
    """One table of the web console's page of ``topic``, as HTML."""
    url = f"http://{gateway.admin_address()}/ui/topics/{topic}"
    with urllib.request.urlopen(url, timeout=TIMEOUT) as answer:
        page = answer.read().decode()
    start = page.index(f'id="{table_id}"')
    return page[start:page.index("</table>", start)]


def test_time_retention_waits_for_the_important_group_only(gateway):
    topic, billing, casual = unique("orders"), unique("billing"), unique("casual")
    create_topic(gateway, topic, configs={"retention.ms": "2000", GROUPS: billing})
    produce_each(gateway, topic)
    commit(gateway, casual, topic, 0)  # an ordinary group, stopped at the start
    # billing has never committed: it holds everything from the log start.
    assert held(gateway, billing, topic) > 0
    assert earliest(gateway, topic) == 0
    assert metric(gateway, "lag", billing, topic) == RECORDS
    # The console's topic page marks the group and shows what it holds.
    shown = console_table(gateway, topic, "important")
    assert f">{billing}</a>" in shown and "never: holds from the log start" in shown
    assert ">0 B<" not in shown and "<td class=\"num\">-</td>" not in shown, shown

    assert consume(gateway, billing, topic, 5) == [0, 1, 2, 3, 4]
    caught_up(gateway, topic, 5)  # what billing read goes; the rest stays
    next_pass(gateway, billing, topic)
    assert earliest(gateway, topic) == 5
    assert metric(gateway, "lag", billing, topic) == RECORDS - 5
    # The ordinary group's unread records fell off: it resumes at the log start.
    assert consume(gateway, casual, topic, RECORDS)[0] == 5

    # billing comes back: it reads every record it had not committed...
    assert consume(gateway, billing, topic, RECORDS) == list(range(5, RECORDS))
    # ...and retention catches up.
    caught_up(gateway, topic, RECORDS)
    wait_for(lambda: metric(gateway, "held_bytes", billing, topic) == 0, TIMEOUT,
             "billing to hold nothing", gateway)
    assert metric(gateway, "lag", billing, topic) == 0
    assert metric(gateway, "records_deleted_unread_total", billing, topic) == 0


def test_offsets_committed_in_java_transactions_hold_retention(gateway, java_classes):
    topic, group = unique("txn-in"), unique("txn-billing")
    create_topic(gateway, topic, configs={"retention.ms": "2000", GROUPS: group})
    create_topic(gateway, f"{topic}-out")
    produce_each(gateway, topic)
    args = ("--topic", topic, "--group", group, "--txn-id", unique("txn"))
    # 8 records processed and their offsets committed in transactions; then a
    # transaction sends offset 20 for the group and aborts: it must not count.
    lines = by_op(run_java(gateway, java_classes, "javatxn.ImportantCheck", "process", *args,
                           "--count", "8", "--abort-to", str(RECORDS)))
    assert lines["processed"] == [{"op": "processed", "first": 0, "next": 8}]
    assert lines["aborted"] == [{"op": "aborted", "offset": RECORDS}]
    caught_up(gateway, topic, 8)
    assert held(gateway, group, topic) > 0
    next_pass(gateway, group, topic)
    assert earliest(gateway, topic) == 8
    # The group resumes where its last committed transaction left it: nothing lost.
    lines = by_op(run_java(gateway, java_classes, "javatxn.ImportantCheck", "process", *args,
                           "--count", str(RECORDS - 8)))
    assert lines["processed"] == [{"op": "processed", "first": 8, "next": RECORDS}]
    caught_up(gateway, topic, RECORDS)
    assert watermarks(gateway, f"{topic}-out")[1] >= RECORDS  # and the outputs committed


def test_size_retention_and_the_ceiling(gateway):
    topic, group = unique("sized"), unique("billing")
    create_topic(gateway, topic, configs={"retention.ms": "-1", "retention.bytes": "300",
                                          GROUPS: group})
    produce_each(gateway, topic)
    partition_bytes = prom.value(gateway.metrics(), "kafka_gateway_partition_bytes",
                                 topic=topic, partition="0")
    batch = int(partition_bytes) // RECORDS
    assert batch * RECORDS == partition_bytes and 5 * batch > 300  # equal batches
    commit(gateway, group, topic, 4)
    caught_up(gateway, topic, 4)
    # Size retention would keep the newest batches making at least 300 bytes.
    due = RECORDS - -(-300 // batch)
    wait_for(lambda: metric(gateway, "held_bytes", group, topic) == (due - 4) * batch,
             TIMEOUT, f"the group to hold offsets 4..{due - 1}", gateway)
    next_pass(gateway, group, topic)
    assert earliest(gateway, topic) == 4
    # A ceiling of 10 batches: retention passes the group down to it, and says so.
    run_cli(gateway.bootstrap, "topics", "alter", topic, "--config",
            f"{MAX_BYTES}={10 * batch}")
    caught_up(gateway, topic, RECORDS - 10)
    wait_for(lambda: metric(gateway, "records_deleted_unread_total", group, topic) == 6,
             TIMEOUT, "the records passed to be counted", gateway)
    assert metric(gateway, "retention_passes_total", group, topic) == 1
    assert (f"retention passed important consumer group {group} on {topic}-0: offsets 4..9 "
            "deleted before it committed them") in gateway.output()
    next_pass(gateway, group, topic)
    assert earliest(gateway, topic) == RECORDS - 10  # at the ceiling: held again


def test_deleting_the_group_or_unnaming_it_releases(gateway):
    topic, billing, audit = unique("released"), unique("billing"), unique("audit")
    create_topic(gateway, topic, configs={"retention.ms": "2000", GROUPS: f"{billing},{audit}"})
    produce_each(gateway, topic)
    commit(gateway, billing, topic, 3)
    commit(gateway, audit, topic, 6)
    assert held(gateway, billing, topic) > 0
    next_pass(gateway, billing, topic)
    assert earliest(gateway, topic) == 3
    admin = AdminClient({"bootstrap.servers": gateway.bootstrap})
    for future in admin.delete_consumer_groups([billing], request_timeout=TIMEOUT).values():
        future.result(TIMEOUT)
    caught_up(gateway, topic, 6)  # billing released; audit holds
    next_pass(gateway, audit, topic)
    assert earliest(gateway, topic) == 6
    # Named no more: audit releases too (the list keeps billing, deleted: it holds nothing).
    run_cli(gateway.bootstrap, "topics", "alter", topic, "--config", f"{GROUPS}={billing}")
    caught_up(gateway, topic, RECORDS)


def test_delete_records_is_explicit_and_passes_the_group(gateway):
    """DeleteRecords (kafka-delete-records.sh) is an operator's action, not
    retention: it moves the log start past an important group's offset, and the
    group's consumer resets by auto.offset.reset, as on Kafka."""
    topic, group = unique("deleted-records"), unique("billing")
    create_topic(gateway, topic, configs={"retention.ms": "2000", GROUPS: group})
    produce_each(gateway, topic)
    commit(gateway, group, topic, 2)
    assert held(gateway, group, topic) > 0
    next_pass(gateway, group, topic)
    assert earliest(gateway, topic) == 2
    admin = AdminClient({"bootstrap.servers": gateway.bootstrap})
    [future] = admin.delete_records([TopicPartition(topic, 0, 10)]).values()
    assert future.result(TIMEOUT).low_watermark == 10
    assert earliest(gateway, topic) == 10
    # The group's committed offset stays where it was: below the log start now.
    probe = Consumer({"bootstrap.servers": gateway.bootstrap, "group.id": group})
    try:
        [position] = probe.committed([TopicPartition(topic, 0)], timeout=TIMEOUT)
    finally:
        probe.close()
    assert position.offset == 2
    assert metric(gateway, "lag", group, topic) == RECORDS - 10
    # Its consumer (auto.offset.reset=earliest) resumes at the new log start.
    assert consume(gateway, group, topic, RECORDS) == list(range(10, RECORDS))
    caught_up(gateway, topic, RECORDS)


def test_compacted_and_deleted_topic_is_held(gateway):
    topic, group = unique("compact-delete"), unique("billing")
    create_topic(gateway, topic, configs={"cleanup.policy": "compact,delete",
                                          "retention.ms": "2000", GROUPS: group})
    produce_each(gateway, topic, keyed=True)
    commit(gateway, group, topic, 7)
    caught_up(gateway, topic, 7)
    assert held(gateway, group, topic) > 0
    next_pass(gateway, group, topic)
    assert earliest(gateway, topic) == 7
    assert consume(gateway, group, topic, RECORDS) == list(range(7, RECORDS))
    caught_up(gateway, topic, RECORDS)


def test_config_through_admin_api_and_cli(gateway):
    topic, plain = unique("configured"), unique("plain")
    out = run_cli(gateway.bootstrap, "topics", "create", topic, "--config",
                  f"{GROUPS}=billing,audit").stdout
    assert "Created" in out or topic in out
    create_topic(gateway, plain)
    described = run_cli(gateway.bootstrap, "topics", "describe", topic).stdout
    assert "\tImportantConsumerGroups: billing,audit\n" in described
    assert "ImportantConsumerGroups" not in run_cli(gateway.bootstrap, "topics", "describe",
                                                    plain).stdout
    admin = AdminClient({"bootstrap.servers": gateway.bootstrap})

    def describe(name: str) -> dict:
        resource = ConfigResource(ConfigResource.Type.TOPIC, name)
        return admin.describe_configs([resource])[resource].result(TIMEOUT)

    entry = describe(topic)[GROUPS]
    assert (entry.value, entry.source) == ("billing,audit",
                                           ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert GROUPS not in describe(plain) and MAX_BYTES not in describe(plain)
    # APPEND and SUBTRACT work on the list, as on Kafka's list configs.
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry(GROUPS, "fraud", incremental_operation=AlterConfigOpType.APPEND),
        ConfigEntry(MAX_BYTES, "1048576", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(TIMEOUT)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry(GROUPS, "audit", incremental_operation=AlterConfigOpType.SUBTRACT)])
    admin.incremental_alter_configs([resource])[resource].result(TIMEOUT)
    configs = describe(topic)
    assert (configs[GROUPS].value, configs[MAX_BYTES].value) == ("billing,fraud", "1048576")
    # A malformed value is INVALID_CONFIG with the reason, and changes nothing.
    for bad in ("billing,,audit", "billing,billing"):
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
            ConfigEntry(GROUPS, bad, incremental_operation=AlterConfigOpType.SET)])
        with pytest.raises(KafkaException) as refused:
            admin.incremental_alter_configs([resource])[resource].result(TIMEOUT)
        assert refused.value.args[0].name() == "INVALID_CONFIG"
        assert GROUPS in refused.value.args[0].str()
    assert describe(topic)[GROUPS].value == "billing,fraud"
    failed = run_cli(gateway.bootstrap, "topics", "create", unique("bad"), "--config",
                     f"{MAX_BYTES}=-5", check=False)
    assert failed.returncode != 0 and "INVALID_CONFIG" in failed.stderr


def test_kill_9_keeps_holds_and_releases(tmp_path):
    topic, billing, audit = "killed", "billing", "audit"
    with GatewayProcess(tmp_path / "data", *SERVE) as gateway:
        create_topic(gateway, topic, configs={"retention.ms": "2000",
                                              GROUPS: f"{billing},{audit}"})
        produce_each(gateway, topic)
        commit(gateway, billing, topic, 5)
        commit(gateway, audit, topic, 8)
        caught_up(gateway, topic, 5)
        assert held(gateway, billing, topic) > 0
        gateway.restart(hard=True)  # kill -9 while retention holds, passes every 200 ms
        assert earliest(gateway, topic) == 5
        assert held(gateway, billing, topic) > 0  # a pass of the new process held it
        next_pass(gateway, billing, topic)
        assert earliest(gateway, topic) == 5
        admin = AdminClient({"bootstrap.servers": gateway.bootstrap})
        for future in admin.delete_consumer_groups([billing], request_timeout=TIMEOUT).values():
            future.result(TIMEOUT)
        gateway.restart(hard=True)  # kill -9 right after the deletion was acknowledged
        caught_up(gateway, topic, 8)  # the release survived; audit's commit holds
        next_pass(gateway, audit, topic)
        assert earliest(gateway, topic) == 8
        assert consume(gateway, audit, topic, RECORDS) == list(range(8, RECORDS))
        caught_up(gateway, topic, RECORDS)


def test_kill_9_while_the_group_commits_and_retention_follows(tmp_path):
    """The gateway is killed while the important group commits record by record
    and retention moves the log start right behind it (every 200 ms), then
    restarted on the same port. The group's consumer carries on through the
    outage; it must read every record, with no gap: had retention ever passed
    its committed offset, the consumer would have been reset past records."""
    topic, group = "followed", "billing"
    total = 200
    with GatewayProcess(tmp_path / "data", *SERVE) as gateway:
        create_topic(gateway, topic, configs={"retention.ms": "1000", GROUPS: group})
        produce_each(gateway, topic, total)
        read: list[int] = []
        commits: list[int] = []  # acknowledged commits
        deadline = time.monotonic() + 4 * TIMEOUT

        def follow() -> None:
            consumer = Consumer({"bootstrap.servers": gateway.bootstrap, "group.id": group,
                                 "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                 "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
            try:
                consumer.subscribe([topic])
                while (not commits or commits[-1] < total) and time.monotonic() < deadline:
                    message = consumer.poll(0.1)
                    if message is None or message.error() is not None:
                        continue
                    read.append(message.offset())
                    try:
                        consumer.commit(offsets=[TopicPartition(topic, 0, message.offset() + 1)],
                                        asynchronous=False)
                    except KafkaException:
                        continue  # the gateway restarted under it: rejoin, read on
                    commits.append(message.offset() + 1)
                    time.sleep(0.01)  # a slow consumer: retention follows it closely
            finally:
                consumer.close()

        thread = threading.Thread(target=follow, daemon=True)
        thread.start()
        wait_for(lambda: len(commits) > 40 and earliest(gateway, topic) > 20, TIMEOUT,
                 "retention to follow the group's commits", gateway)
        gateway.kill()  # kill -9 mid-stream
        at_kill = commits[-1]
        assert at_kill < total, "the group finished before the kill: nothing was tested"
        gateway.start()
        probe = Consumer({"bootstrap.servers": gateway.bootstrap, "group.id": group})
        try:
            [position] = probe.committed([TopicPartition(topic, 0)], timeout=TIMEOUT)
        finally:
            probe.close()
        assert position.offset >= at_kill  # acknowledged commits survived the kill
        thread.join(5 * TIMEOUT)
        assert not thread.is_alive(), f"the consumer is stuck after reading {len(read)}"
        assert commits[-1] == total, f"the group got to {commits[-1]} of {total}"
        # Every record read, none skipped (some read twice: uncommitted at the kill).
        assert sorted(set(read)) == list(range(total)), sorted(set(range(total)) - set(read))
        caught_up(gateway, topic, total)


def test_kafkas_config_tool_sets_and_describes_the_groups(gateway):
    """kafka-configs.sh (Apache Kafka 3.4.1's ConfigCommand, over the Admin
    client) sets the list with its [a,b] syntax and describes it."""
    topic = unique("tooled")
    create_topic(gateway, topic)

    def config_command(*args: str) -> str:
        line = jvm.java_command("kafka.admin.ConfigCommand", "--bootstrap-server",
                                gateway.bootstrap, "--entity-type", "topics", "--entity-name",
                                topic, *args)
        done = subprocess.run(line, capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    assert "Completed updating config" in config_command(
        "--alter", "--add-config", f"{GROUPS}=[billing,audit]")
    described = config_command("--describe")
    assert f"{GROUPS}=billing,audit sensitive=false synonyms={{DYNAMIC_TOPIC_CONFIG:" \
        f"{GROUPS}=billing,audit}}" in described
    assert "\tImportantConsumerGroups: billing,audit\n" in run_cli(
        gateway.bootstrap, "topics", "describe", topic).stdout
