"""``kafka-gateway topics list|describe|create|delete|alter``: topics of a running
gateway (or any Kafka broker), like ``kafka-topics.sh`` (and ``kafka-configs.sh``
for topic configs)."""

from __future__ import annotations

import argparse
import datetime

from kio.schema.create_partitions.v3 import request as create_partitions
from kio.schema.create_topics.v7 import request as create_topics
from kio.schema.delete_topics.v6 import request as delete_topics
from kio.schema.describe_configs.v4 import request as describe_configs
from kio.schema.incremental_alter_configs.v1 import request as alter_configs
from kio.schema.metadata.v12 import request as metadata
from kio.static.primitive import i32Timedelta

from common.key_value import parse_pairs

from ..cluster_client import ClusterClient
from .common import (
    EARLIEST,
    LATEST,
    check,
    client_action,
    client_command,
    connected,
    offsets_at,
    topic_partitions,
)

TIMEOUT = i32Timedelta.parse(datetime.timedelta(seconds=30))


def add_topics_parser(commands: argparse._SubParsersAction) -> None:
    topics = client_command(commands, "topics", help="manage topics on a running gateway")
    actions = topics.add_subparsers(dest="action", required=True)
    _topic_name(client_action(actions, "list", help="topic names"), required=False,
                help="only this topic (default: every topic)")
    _topic_name(client_action(actions, "describe",
                              help="partitions, watermarks and configs of topics"),
                required=False, help="the topic (default: every topic)")
    create = client_action(actions, "create", help="create a topic")
    _topic_name(create)
    create.add_argument("--partitions", type=int, default=-1,
                        help="partition count (default: the gateway's num.partitions)")
    create.add_argument("--replication-factor", type=int, default=-1,
                        help="accepted for kafka-topics.sh compatibility; the gateway keeps "
                             "one copy, so only 1 or -1 (default -1: the gateway's) "
                             "[default.replication.factor]")
    create.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                        help="a topic config, e.g. retention.ms=3600000 or "
                             "cleanup.policy=compact (repeatable; default: the gateway's "
                             "log.* settings)")
    delete = client_action(actions, "delete", help="delete a topic and its data")
    _topic_name(delete)
    alter = client_action(actions, "alter", help="add partitions or change topic configs")
    _topic_name(alter)
    alter.add_argument("--partitions", type=int,
                       help="new, larger partition count (default: unchanged)")
    alter.add_argument("--set", "--config", dest="set", action="append", default=[],
                       metavar="KEY=VALUE",
                       help="set a topic config (repeatable), as kafka-configs.sh --add-config")
    alter.add_argument("--delete", action="append", default=[], metavar="KEY",
                       help="reset a topic config to the gateway's default (repeatable), as "
                            "kafka-configs.sh --delete-config")


def _topic_name(parser: argparse.ArgumentParser, required: bool = True,
                help: str = "the topic") -> None:
    """The topic as a positional argument, or as kafka-topics.sh's --topic."""
    parser.add_argument("name", nargs="?", metavar="TOPIC", help=help)
    parser.add_argument("--topic", dest="topic_flag", metavar="TOPIC",
                        help="the same, as kafka-topics.sh names it")
    parser.set_defaults(topic_required=required)


async def run_topics(args: argparse.Namespace) -> int:
    if args.name and args.topic_flag and args.name != args.topic_flag:
        raise SystemExit("kafka-gateway: two different topics named")
    args.name = args.name or args.topic_flag
    if args.topic_required and not args.name:
        raise SystemExit(f"kafka-gateway: topics {args.action} needs a TOPIC")
    async with connected(args) as client:
        return await _run_topics(client, args)


async def _run_topics(client: ClusterClient, args: argparse.Namespace) -> int:
    if args.action == "list":
        for name in sorted(await topic_partitions(client, [args.name] if args.name else None)):
            print(name)
    elif args.action == "create":
        configs = parse_pairs(args.config, "kafka-gateway: --config")
        response = await client.request(create_topics.CreateTopicsRequest(
            topics=(create_topics.CreatableTopic(
                name=args.name, num_partitions=args.partitions,
                replication_factor=args.replication_factor, assignments=(),
                configs=tuple(create_topics.CreatableTopicConfig(name=k, value=v)
                              for k, v in configs.items())),),
            timeout=TIMEOUT, validate_only=False))
        result = response.topics[0]
        check(result.error_code, result.error_message, f"create {args.name}")
        print(f"Created topic {args.name} with {result.num_partitions} partitions "
              f"(id {result.topic_id}).")
    elif args.action == "delete":
        response = await client.request(delete_topics.DeleteTopicsRequest(
            topics=(delete_topics.DeleteTopicState(name=args.name, topic_id=None),),
            timeout=TIMEOUT))
        result = response.responses[0]
        check(result.error_code, result.error_message, f"delete {args.name}")
        print(f"Deleted topic {args.name}.")
    elif args.action == "alter":
        await _alter(client, args)
    elif args.action == "describe":
        names = [args.name] if args.name else sorted(await topic_partitions(client, None))
        for name in names:
            await _describe(client, name)
    return 0


async def _alter(client: ClusterClient, args: argparse.Namespace) -> None:
    if args.partitions is not None:
        response = await client.request(create_partitions.CreatePartitionsRequest(
            topics=(create_partitions.CreatePartitionsTopic(
                name=args.name, count=args.partitions, assignments=None),),
            timeout=TIMEOUT, validate_only=False))
        result = response.results[0]
        check(result.error_code, result.error_message, f"alter {args.name}")
        print(f"Topic {args.name} now has {args.partitions} partitions.")
    changes = [alter_configs.AlterableConfig(name=k, config_operation=0, value=v)
               for k, v in parse_pairs(args.set, "kafka-gateway: --set").items()]
    changes += [alter_configs.AlterableConfig(name=k, config_operation=1, value=None)
                for k in args.delete]
    if changes:
        response = await client.request(alter_configs.IncrementalAlterConfigsRequest(
            resources=(alter_configs.AlterConfigsResource(
                resource_type=2, resource_name=args.name, configs=tuple(changes)),),
            validate_only=False))
        result = response.responses[0]
        check(result.error_code, result.error_message, f"alter {args.name}")
        print(f"Updated {len(changes)} config(s) of {args.name}.")


async def _describe(client: ClusterClient, name: str) -> None:
    response = await client.request(metadata.MetadataRequest(
        topics=(metadata.MetadataRequestTopic(topic_id=None, name=name),),
        allow_auto_topic_creation=False, include_topic_authorized_operations=False))
    topic = response.topics[0]
    check(topic.error_code, None, f"describe {name}")
    partitions = sorted(p.partition_index for p in topic.partitions)
    starts = await offsets_at(client, {(name, p): EARLIEST for p in partitions})
    ends = await offsets_at(client, {(name, p): LATEST for p in partitions})
    configs = await client.request(describe_configs.DescribeConfigsRequest(
        resources=(describe_configs.DescribeConfigsResource(
            resource_type=2, resource_name=name, configuration_keys=None),),
        include_synonyms=False, include_documentation=False))
    overrides = [f"{c.name}={c.value}" for c in configs.results[0].configs
                 if c.config_source == 1]
    print(f"Topic: {name}\tTopicId: {topic.topic_id}\tPartitionCount: {len(partitions)}\t"
          f"Configs: {','.join(overrides)}")
    # Important consumer groups (a list: its commas would blur into Configs' own).
    important = [c.value for c in configs.results[0].configs
                 if c.name == "gateway.important.consumer.groups" and c.value]
    if important:
        print(f"\tImportantConsumerGroups: {important[0]}")
    for p in partitions:
        print(f"\tPartition: {p}\tLeader: {response.controller_id}\t"
              f"LogStartOffset: {starts.get((name, p), '-')}\t"
              f"HighWatermark: {ends.get((name, p), '-')}")
