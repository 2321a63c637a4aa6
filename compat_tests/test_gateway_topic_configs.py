"""The gateway's own topic config (gateway.transactional.produce.offset)
through the tools people use: Kafka 3.4.1's kafka-configs.sh sets, shows and
deletes it, and shows the gateway's message for a bad value; its
kafka-topics.sh refuses it in ``--create --config`` before sending anything
(it checks names against Kafka's own list), where the project's CLI
(``kafka-gateway topics create --config``) takes it.
"""

from __future__ import annotations

import subprocess

from compat_helpers import create_topic

from tablets.topic_config import TXN_PRODUCE_OFFSET
from testkit import jvm
from testkit.gateway import GatewayProcess


def kafka_tool(main_class: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(jvm.java_command(main_class, *args), capture_output=True, text=True,
                          timeout=180, stdin=subprocess.DEVNULL)


def test_kafka_configs_and_kafka_topics(tmp_path):
    with GatewayProcess(tmp_path / "data") as gw:
        create_topic(gw, "ours", configs={TXN_PRODUCE_OFFSET: "lower-bound"})
        create_topic(gw, "plain")

        def configs(topic: str, *args: str) -> subprocess.CompletedProcess[str]:
            return kafka_tool("kafka.admin.ConfigCommand", "--bootstrap-server", gw.bootstrap,
                              "--entity-type", "topics", "--entity-name", topic, *args)

        def described(topic: str) -> list[str]:
            done = configs(topic, "--describe")
            assert done.returncode == 0, done.stdout + done.stderr
            # "Dynamic configs for topic T are:", then "  name=value sensitive=..."
            return [line.split()[0] for line in done.stdout.splitlines()
                    if line.startswith("  ")]

        assert described("ours") == [f"{TXN_PRODUCE_OFFSET}=lower-bound"]
        assert described("plain") == []
        done = configs("plain", "--alter", "--add-config", f"{TXN_PRODUCE_OFFSET}=lower-bound")
        assert done.returncode == 0, done.stdout + done.stderr
        assert described("plain") == [f"{TXN_PRODUCE_OFFSET}=lower-bound"]
        done = configs("plain", "--alter", "--add-config", f"{TXN_PRODUCE_OFFSET}=exact")
        assert done.returncode != 0
        assert (f"InvalidConfigurationException: Invalid value exact for configuration "
                f"{TXN_PRODUCE_OFFSET}: String must be one of: unknown, lower-bound"
                ) in done.stderr + done.stdout
        done = configs("plain", "--alter", "--delete-config", TXN_PRODUCE_OFFSET)
        assert done.returncode == 0, done.stdout + done.stderr
        assert described("plain") == []

        done = kafka_tool("kafka.admin.TopicCommand", "--bootstrap-server", gw.bootstrap,
                          "--create", "--topic", "theirs", "--partitions", "1",
                          "--config", f"{TXN_PRODUCE_OFFSET}=lower-bound")
        assert done.returncode != 0
        assert f"Unknown topic config name: {TXN_PRODUCE_OFFSET}" in done.stdout + done.stderr
        # Refused by the tool: the gateway takes the name, so a request
        # would have created the topic.
        done = kafka_tool("kafka.admin.TopicCommand", "--bootstrap-server", gw.bootstrap,
                          "--list")
        assert done.returncode == 0, done.stdout + done.stderr
        assert [line for line in done.stdout.splitlines() if line in ("ours", "plain", "theirs")
                ] == ["ours", "plain"]
