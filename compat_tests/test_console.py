"""``kafka-gateway produce`` and ``consume``, the console producer and consumer,
with the properties of kafka-console-producer.sh and kafka-console-consumer.sh."""

from __future__ import annotations

from confluent_kafka import Consumer, TopicPartition

from testkit.cli import run_cli

TIMEOUT = 30


def cli(gateway, *args: str, check: bool = True, input: str | None = None):
    return run_cli(gateway.bootstrap, *args, check=check, input=input)


def murmur2_partition(key: bytes, partitions: int) -> int:
    """The Java client's default partition of a key (Utils.murmur2)."""
    m, r = 0x5BD1E995, 24
    length = len(key)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(key[i:i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    tail = key[length - length % 4:]
    for index in reversed(range(len(tail))):
        h ^= tail[index] << (8 * index)
    if tail:
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return (h & 0x7FFFFFFF) % partitions


def test_produce_keys_headers_and_nulls_then_print_them(gateway, topic_name):
    cli(gateway, "topics", "create", topic_name, "--partitions", "3")
    lines = ["trace:a1,region:eu\tuser-1:hello", "\tuser-2:world", "trace:a2\tuser-1:NULL",
             "\tNULL:keyless"]
    cli(gateway, "produce", "--topic", topic_name, "--property", "parse.key=true",
        "--property", "key.separator=:", "--property", "parse.headers=true",
        "--property", "null.marker=NULL", input="\n".join(lines) + "\n")

    printed = cli(gateway, "consume", "--topic", topic_name, "--from-beginning",
                  "--max-messages", "4", "--property", "print.key=true",
                  "--property", "print.partition=true", "--property", "print.offset=true",
                  "--property", "print.headers=true", "--property", "print.timestamp=true",
                  "--property", "key.separator=|")
    assert "Processed a total of 4 messages" in printed.stderr
    rows = [line.split("|") for line in printed.stdout.splitlines()]
    assert all(row[0].startswith("CreateTime:") for row in rows)
    by_key = {}
    for _stamp, partition, offset, headers, key, value in rows:
        by_key.setdefault(key, []).append((partition, offset, headers, value))
    user1 = f"Partition:{murmur2_partition(b'user-1', 3)}"
    # the keyless record may land between them (a random partition)
    assert [(p, h, v) for p, _o, h, v in by_key["user-1"]] == [
        (user1, "trace:a1,region:eu", "hello"), (user1, "trace:a2", "null")]
    assert by_key["user-1"][0][1] == "Offset:0"
    assert [(p, h, v) for p, _o, h, v in by_key["user-2"]] == [
        (f"Partition:{murmur2_partition(b'user-2', 3)}", "NO_HEADERS", "world")]
    assert len({(row[1], row[2]) for row in rows}) == 4  # partition, offset
    assert [(h, v) for _p, _o, h, v in by_key["null"]] == [("NO_HEADERS", "keyless")]


def test_print_format_tokens(gateway, topic_name):
    cli(gateway, "topics", "create", topic_name, "--partitions", "2")
    cli(gateway, "produce", "--topic", topic_name, "--partition", "1", "--property",
        "parse.key=true", input="k1\tv1\nk2\tvalue-2\n")
    printed = cli(gateway, "consume", "--topic", topic_name, "--partition", "1", "--offset",
                  "earliest", "--max-messages", "2", "--format", r"%t/%p/%o %k=%s (%K,%S)\n")
    assert printed.stdout.splitlines() == [f"{topic_name}/1/0 k1=v1 (2,2)",
                                           f"{topic_name}/1/1 k2=value-2 (2,7)"]
    second = cli(gateway, "consume", "--topic", topic_name, "--partition", "1", "--offset", "1",
                 "--max-messages", "1")
    assert second.stdout == "value-2\n"


def test_group_consumer_commits_what_it_printed(gateway, topic_name):
    cli(gateway, "topics", "create", topic_name, "--partitions", "1")
    cli(gateway, "produce", "--topic", topic_name,
        input="".join(f"record-{i}\n" for i in range(5)))
    group = f"{topic_name}-console"
    first = cli(gateway, "consume", "--topic", topic_name, "--group", group, "--from-beginning",
                "--max-messages", "2")
    assert first.stdout.splitlines() == ["record-0", "record-1"]
    consumer = Consumer({"bootstrap.servers": gateway.bootstrap, "group.id": group})
    [position] = consumer.committed([TopicPartition(topic_name, 0)], TIMEOUT)
    consumer.close()
    assert position.offset == 2
    # the group goes on where it stopped; --from-beginning only applies without offsets
    rest = cli(gateway, "consume", "--topic", topic_name, "--group", group, "--from-beginning",
               "--max-messages", "3")
    assert rest.stdout.splitlines() == ["record-2", "record-3", "record-4"]


def test_timeout_ends_a_consumer_without_records(gateway, topic_name):
    cli(gateway, "topics", "create", topic_name)
    idle = cli(gateway, "consume", "--topic", topic_name, "--timeout-ms", "500")
    assert idle.stdout == "" and "Processed a total of 0 messages" in idle.stderr
    # without --from-beginning only new records are read: the earlier ones are not
    cli(gateway, "produce", "--topic", topic_name, input="old\n")
    assert cli(gateway, "consume", "--topic", topic_name, "--timeout-ms", "500").stdout == ""


def test_bad_input_and_unknown_topics_are_refused(gateway, topic_name):
    cli(gateway, "topics", "create", topic_name)
    missing = cli(gateway, "produce", "--topic", topic_name, "--property", "parse.key=true",
                  input="no separator here\n", check=False)
    assert missing.returncode != 0 and "no key separator on line 1" in missing.stderr
    lenient = cli(gateway, "produce", "--topic", topic_name, "--property", "parse.key=true",
                  "--property", "ignore.error=true", input="whole line\n")
    assert lenient.returncode == 0
    unknown = cli(gateway, "consume", "--topic", topic_name, "--property", "print.everything=1",
                  check=False)
    assert unknown.returncode != 0 and "unknown --property print.everything" in unknown.stderr
    absent = cli(gateway, "consume", "--topic", f"{topic_name}-absent", "--timeout-ms", "500",
                 check=False)
    assert absent.returncode != 0 and "Unknown topic" in absent.stderr
