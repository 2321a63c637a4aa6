"""The ``kafka-gateway topics``, ``groups`` and ``transactions`` commands against a
running gateway (reset-offsets and deletion in test_cli_groups.py, the console
producer and consumer in test_console.py)."""

from __future__ import annotations

import subprocess

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from testkit.cli import run_cli

TIMEOUT = 30


def cli(gateway, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run_cli(gateway.bootstrap, *args, check=check)


def test_topics_lifecycle(gateway, topic_name):
    created = cli(gateway, "topics", "create", topic_name, "--partitions", "2",
                  "--config", "retention.ms=3600000")
    assert f"Created topic {topic_name} with 2 partitions" in created.stdout
    assert topic_name in cli(gateway, "topics", "list").stdout.split()

    producer = Producer({"bootstrap.servers": gateway.bootstrap})
    for i in range(5):
        producer.produce(topic_name, value=b"x", partition=i % 2)
    assert producer.flush(TIMEOUT) == 0

    described = cli(gateway, "topics", "describe", topic_name).stdout
    assert "PartitionCount: 2" in described and "retention.ms=3600000" in described
    assert "Partition: 0\tLeader: 0\tLogStartOffset: 0\tHighWatermark: 3" in described
    assert "Partition: 1\tLeader: 0\tLogStartOffset: 0\tHighWatermark: 2" in described

    cli(gateway, "topics", "alter", topic_name, "--partitions", "3",
        "--set", "max.message.bytes=2000000", "--delete", "retention.ms")
    described = cli(gateway, "topics", "describe", topic_name).stdout
    assert "PartitionCount: 3" in described
    assert "max.message.bytes=2000000" in described and "retention.ms" not in described

    refused = cli(gateway, "topics", "alter", topic_name, "--set", "retention.ms=soon",
                  check=False)
    assert refused.returncode != 0 and "INVALID_CONFIG" in refused.stderr
    again = cli(gateway, "topics", "create", topic_name, check=False)
    assert again.returncode != 0 and "TOPIC_ALREADY_EXISTS" in again.stderr

    cli(gateway, "topics", "delete", "--topic", topic_name)
    assert topic_name not in cli(gateway, "topics", "list").stdout.split()
    missing = cli(gateway, "topics", "describe", topic_name, check=False)
    assert missing.returncode != 0 and "UNKNOWN_TOPIC_OR_PARTITION" in missing.stderr


def test_groups_list_and_describe_show_offsets_and_lag(gateway, topic_name):
    cli(gateway, "topics", "create", topic_name, "--partitions", "2")
    producer = Producer({"bootstrap.servers": gateway.bootstrap})
    for i in range(10):
        producer.produce(topic_name, value=b"x", partition=i % 2)
    assert producer.flush(TIMEOUT) == 0

    group = f"{topic_name}-readers"
    consumer = Consumer({"bootstrap.servers": gateway.bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    consumer.commit(offsets=[TopicPartition(topic_name, 0, 4), TopicPartition(topic_name, 1, 1)],
                    asynchronous=False)
    consumer.close()

    assert group in cli(gateway, "groups", "list").stdout
    described = cli(gateway, "groups", "describe", group).stdout
    rows = {tuple(line.split()[:5]) for line in described.splitlines()}
    # topic, partition, committed offset, log end offset, lag
    assert (topic_name, "0", "4", "5", "1") in rows, described
    assert (topic_name, "1", "1", "5", "4") in rows, described


def test_transactions_list_describe_producers_abort(gateway, topic_name):
    """``kafka-gateway transactions``: an open transaction is listed, described
    with its partitions, its producer shown per partition, and aborted (fencing
    the producer, whose commit then fails and whose data never appears)."""
    txn_id = f"cli-{topic_name}"
    cli(gateway, "topics", "create", topic_name, "--partitions", "2")
    producer = Producer({"bootstrap.servers": gateway.bootstrap, "transactional.id": txn_id})
    producer.init_transactions(TIMEOUT)
    producer.begin_transaction()
    producer.produce(topic_name, value=b"never seen", partition=1)
    assert producer.flush(TIMEOUT) == 0

    listed = cli(gateway, "transactions", "list").stdout
    assert any(line.split()[0::2] == [txn_id, "Ongoing"] for line in listed.splitlines()[1:])
    described = cli(gateway, "transactions", "describe", txn_id).stdout.splitlines()[1].split()
    assert described[2:4] == ["0", "Ongoing"] and described[-1] == f"{topic_name}-1"
    producers = cli(gateway, "transactions", "producers", topic_name, "1").stdout.splitlines()
    assert producers[1].split()[1:3] == ["0", "0"]  # epoch 0, last sequence 0

    aborted = cli(gateway, "transactions", "abort", txn_id).stdout
    assert "is fenced (now epoch 1)" in aborted
    assert cli(gateway, "transactions", "describe", txn_id).stdout.splitlines()[1].split()[2:4] \
        == ["1", "Empty"]
    again = cli(gateway, "transactions", "abort", txn_id, check=False)
    assert again.returncode == 1 and "no open transaction" in again.stdout
    missing = cli(gateway, "transactions", "describe", "no-such-id", check=False)
    assert missing.returncode == 1 and "does not exist" in missing.stdout

    try:
        producer.commit_transaction(TIMEOUT)
        raise AssertionError("the fenced producer committed")
    except KafkaException as exc:
        assert exc.args[0].fatal()
    consumer = Consumer({"bootstrap.servers": gateway.bootstrap, "group.id": txn_id})
    low, high = consumer.get_watermark_offsets(TopicPartition(topic_name, 1), TIMEOUT)
    consumer.close()
    assert (low, high) == (0, 0)  # nothing of the aborted transaction entered the log


def test_topics_describe_without_a_name_describes_every_topic(gateway, topic_name):
    names = [f"{topic_name}-{i}" for i in range(3)]
    for count, name in enumerate(names, 1):
        cli(gateway, "topics", "create", name, "--partitions", str(count))
    described = cli(gateway, "topics", "describe").stdout
    headers = [line.split("\t")[0].removeprefix("Topic: ") for line in described.splitlines()
               if line.startswith("Topic: ")]
    assert headers == sorted(headers) and set(names) <= set(headers)
    for count, name in enumerate(names, 1):
        assert f"Topic: {name}\t" in described
        block = described.split(f"Topic: {name}\t")[1].split("Topic: ")[0]
        assert f"PartitionCount: {count}" in block and block.count("Partition: ") == count


def test_bootstrap_server_before_the_command_or_between_its_words(gateway, topic_name):
    cli(gateway, "topics", "create", topic_name)
    for argv in (["--bootstrap-server", gateway.bootstrap, "topics", "list"],
                 ["topics", "--bootstrap-server", gateway.bootstrap, "list"]):
        listed = run_cli(None, *argv).stdout.split()
        assert topic_name in listed
    unreachable = run_cli("127.0.0.1:1", "topics", "list", check=False)
    assert unreachable.returncode != 0 and "cannot connect to 127.0.0.1:1" in unreachable.stderr


def test_command_config_file(gateway, topic_name, tmp_path):
    """--command-config: Kafka's client properties file, for every client command."""
    config = tmp_path / "client.properties"
    config.write_text(f"# as kafka-topics.sh --command-config reads it\n"
                      f"bootstrap.servers={gateway.bootstrap}\nclient.id=ops-console\n")
    run_cli(None, "topics", "create", topic_name, "--command-config", str(config))
    assert topic_name in run_cli(None, "--command-config", str(config), "topics",
                                 "list").stdout.split()
    run_cli(None, "produce", "--topic", topic_name, "--command-config", str(config),
            input="from a file\n")
    consumed = run_cli(None, "consume", "--topic", topic_name, "--from-beginning",
                       "--max-messages", "1", "--command-config", str(config))
    assert consumed.stdout == "from a file\n"
    secured = tmp_path / "secured.properties"
    secured.write_text(f"bootstrap.servers={gateway.bootstrap}\nsecurity.protocol=SASL_SSL\n")
    # A SASL_SSL client against this plaintext listener: the TLS handshake fails.
    refused = run_cli(None, "topics", "list", "--command-config", str(secured), check=False)
    assert refused.returncode != 0
    assert "cannot connect to" in refused.stderr
