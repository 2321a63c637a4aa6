"""``kafka-gateway``: run the gateway, or manage topics on a running one.

    kafka-gateway serve [--listen HOST:PORT] [--data-dir DIR] [...]
    kafka-gateway topics list|describe|create|delete|alter [...]
    kafka-gateway groups list|describe GROUP
    kafka-gateway users add|delete|list [...]
    kafka-gateway acls list|add|remove [...]

The ``topics`` and ``groups`` commands speak the Kafka protocol to the gateway (or to any
Kafka broker), like ``kafka-topics.sh``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import logging
import sys

from kio.schema.create_partitions.v3 import request as create_partitions
from kio.schema.create_topics.v7 import request as create_topics
from kio.schema.delete_topics.v6 import request as delete_topics
from kio.schema.describe_configs.v4 import request as describe_configs
from kio.schema.errors import ErrorCode
from kio.schema.incremental_alter_configs.v1 import request as alter_configs
from kio.schema.list_offsets.v7 import request as list_offsets
from kio.schema.metadata.v12 import request as metadata
from kio.static.primitive import i32Timedelta

from . import config as settings
from .client import KafkaClient
from .groups_cli import add_groups_parser, run_groups
from .security_cli import add_security_parsers, run_acls, run_users
from .transactions_cli import add_transactions_parser, run_transactions

TIMEOUT = i32Timedelta.parse(datetime.timedelta(seconds=30))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="kafka-gateway", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the gateway")
    settings.add_arguments(serve)
    serve.add_argument("--log-level", default="INFO")

    topics = commands.add_parser("topics", help="manage topics on a running gateway")
    topics.add_argument("--bootstrap-server", default="127.0.0.1:9092", type=settings._hostport)
    actions = topics.add_subparsers(dest="action", required=True)
    actions.add_parser("list", help="topic names")
    describe = actions.add_parser("describe", help="partitions, watermarks and configs")
    describe.add_argument("name")
    create = actions.add_parser("create", help="create a topic")
    create.add_argument("name")
    create.add_argument("--partitions", type=int, default=-1)
    create.add_argument("--replication-factor", type=int, default=-1)
    create.add_argument("--config", action="append", default=[], metavar="KEY=VALUE")
    delete = actions.add_parser("delete", help="delete a topic")
    delete.add_argument("name")
    alter = actions.add_parser("alter", help="add partitions or change configs")
    alter.add_argument("name")
    alter.add_argument("--partitions", type=int, help="new (larger) partition count")
    alter.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    alter.add_argument("--delete", action="append", default=[], metavar="KEY")

    add_groups_parser(commands)
    add_transactions_parser(commands)
    add_security_parsers(commands)

    args = parser.parse_args(argv)
    if args.command == "serve":
        _serve(args)
    elif args.command == "groups":
        sys.exit(asyncio.run(run_groups(args)))
    elif args.command == "transactions":
        sys.exit(asyncio.run(run_transactions(args)))
    elif args.command == "users":
        sys.exit(asyncio.run(run_users(args)))
    elif args.command == "acls":
        sys.exit(asyncio.run(run_acls(args)))
    else:
        sys.exit(asyncio.run(_topics(args)))


def _serve(args: argparse.Namespace) -> None:
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = settings.from_arguments(args)
    except (ValueError, OSError) as exc:
        sys.exit(f"kafka-gateway: {exc}")
    import uvloop

    from .server import serve

    uvloop.run(serve(config))


def _pairs(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"expected KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def _check(code: ErrorCode, message: str | None, what: str) -> None:
    if code is not ErrorCode.none:
        raise SystemExit(f"{what}: {code.name.upper()}{': ' + message if message else ''}")


async def _topics(args: argparse.Namespace) -> int:
    client = await KafkaClient.connect(*args.bootstrap_server)
    try:
        return await _run_topics(client, args)
    finally:
        await client.close()


async def _run_topics(client: KafkaClient, args: argparse.Namespace) -> int:
    if args.action == "list":
        response = await client.request(metadata.MetadataRequest(
            topics=None, allow_auto_topic_creation=False,
            include_topic_authorized_operations=False))
        for topic in sorted(response.topics, key=lambda t: t.name or ""):
            print(topic.name)
    elif args.action == "create":
        response = await client.request(create_topics.CreateTopicsRequest(
            topics=(create_topics.CreatableTopic(
                name=args.name, num_partitions=args.partitions,
                replication_factor=args.replication_factor, assignments=(),
                configs=tuple(create_topics.CreatableTopicConfig(name=k, value=v)
                              for k, v in _pairs(args.config).items())),),
            timeout=TIMEOUT, validate_only=False))
        result = response.topics[0]
        _check(result.error_code, result.error_message, f"create {args.name}")
        print(f"Created topic {args.name} with {result.num_partitions} partitions "
              f"(id {result.topic_id}).")
    elif args.action == "delete":
        response = await client.request(delete_topics.DeleteTopicsRequest(
            topics=(delete_topics.DeleteTopicState(name=args.name, topic_id=None),),
            timeout=TIMEOUT))
        result = response.responses[0]
        _check(result.error_code, result.error_message, f"delete {args.name}")
        print(f"Deleted topic {args.name}.")
    elif args.action == "alter":
        await _alter(client, args)
    elif args.action == "describe":
        await _describe(client, args.name)
    return 0


async def _alter(client: KafkaClient, args: argparse.Namespace) -> None:
    if args.partitions is not None:
        response = await client.request(create_partitions.CreatePartitionsRequest(
            topics=(create_partitions.CreatePartitionsTopic(
                name=args.name, count=args.partitions, assignments=None),),
            timeout=TIMEOUT, validate_only=False))
        result = response.results[0]
        _check(result.error_code, result.error_message, f"alter {args.name}")
        print(f"Topic {args.name} now has {args.partitions} partitions.")
    changes = [alter_configs.AlterableConfig(name=k, config_operation=0, value=v)
               for k, v in _pairs(args.set).items()]
    changes += [alter_configs.AlterableConfig(name=k, config_operation=1, value=None)
                for k in args.delete]
    if changes:
        response = await client.request(alter_configs.IncrementalAlterConfigsRequest(
            resources=(alter_configs.AlterConfigsResource(
                resource_type=2, resource_name=args.name, configs=tuple(changes)),),
            validate_only=False))
        result = response.responses[0]
        _check(result.error_code, result.error_message, f"alter {args.name}")
        print(f"Updated {len(changes)} config(s) of {args.name}.")


async def _describe(client: KafkaClient, name: str) -> None:
    response = await client.request(metadata.MetadataRequest(
        topics=(metadata.MetadataRequestTopic(topic_id=None, name=name),),
        allow_auto_topic_creation=False, include_topic_authorized_operations=False))
    topic = response.topics[0]
    _check(topic.error_code, None, f"describe {name}")
    partitions = sorted(p.partition_index for p in topic.partitions)
    marks = {}
    for position in (-2, -1):
        offsets = await client.request(list_offsets.ListOffsetsRequest(
            replica_id=-1, isolation_level=0,
            topics=(list_offsets.ListOffsetsTopic(name=name, partitions=tuple(
                list_offsets.ListOffsetsPartition(partition_index=p, timestamp=position)
                for p in partitions)),)))
        for part in offsets.topics[0].partitions:
            marks[(position, part.partition_index)] = part.offset
    configs = await client.request(describe_configs.DescribeConfigsRequest(
        resources=(describe_configs.DescribeConfigsResource(
            resource_type=2, resource_name=name, configuration_keys=None),),
        include_synonyms=False, include_documentation=False))
    overrides = [f"{c.name}={c.value}" for c in configs.results[0].configs
                 if c.config_source == 1]
    print(f"Topic: {name}\tTopicId: {topic.topic_id}\tPartitionCount: {len(partitions)}\t"
          f"Configs: {','.join(overrides)}")
    for p in partitions:
        print(f"\tPartition: {p}\tLeader: {response.controller_id}\t"
              f"LogStartOffset: {marks[(-2, p)]}\tHighWatermark: {marks[(-1, p)]}")
