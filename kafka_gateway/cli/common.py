"""What every client command of ``kafka-gateway`` shares: the options that say
where the gateway is and how to reach it (accepted anywhere on the line, as
Kafka's tools do), the connection, lookups of topics, offsets and groups, and
the table printer.

argparse copies a subcommand's defaults over what an outer parser read, so
the client options are declared with ``SUPPRESS`` at every level and their
defaults applied here, after parsing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any

from kio.schema.describe_groups.v5 import request as describe_groups
from kio.schema.errors import ErrorCode
from kio.schema.list_offsets.v7 import request as list_offsets
from kio.schema.offset_fetch.v8 import request as offset_fetch

from ..client import ClientSecurity, KafkaClient
from ..cluster_client import (
    ATTEMPTS,
    GROUP,
    LEADER_MOVED,
    ClusterClient,
    Connect,
    RoutingError,
    backoff,
)
from ..settings import read_properties

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
DEFAULT_CLIENT_ID = "kafka-gateway-cli"


def _servers(value: str) -> list[tuple[str, int]]:
    """``HOST:PORT[,HOST:PORT...]``, as Kafka's bootstrap.servers."""
    out = []
    for item in value.split(","):
        host, sep, port = item.strip().rpartition(":")
        if not sep or not port.isdigit():
            raise argparse.ArgumentTypeError(f"expected HOST:PORT[,HOST:PORT...], got {value!r}")
        out.append((host or "127.0.0.1", int(port)))
    return out


def add_client_options(parser: argparse.ArgumentParser) -> None:
    """The options of a command that talks to a running gateway."""
    parser.add_argument(
        "--bootstrap-server", type=_servers, default=argparse.SUPPRESS, metavar="HOST:PORT",
        help=f"the gateway (or any Kafka broker) to connect to; a comma-separated list is "
             f"tried in order (default {DEFAULT_BOOTSTRAP}) [bootstrap.servers]")
    parser.add_argument(
        "--command-config", default=argparse.SUPPRESS, metavar="FILE",
        help="a properties file of client settings, as Kafka's tools take (key=value lines): "
             "bootstrap.servers, client.id, security.protocol, sasl.* and ssl.*, and for produce "
             "and consume any librdkafka setting; flags win (default: none)")


def client_properties(args: argparse.Namespace) -> dict[str, str]:
    """The --command-config file's settings ({} without one)."""
    path = getattr(args, "command_config", None)
    if path is None:
        return {}
    try:
        return read_properties(path)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"kafka-gateway: --command-config: {exc}") from None


def client_command(commands: argparse._SubParsersAction, name: str, *,
                   help: str, description: str | None = None) -> argparse.ArgumentParser:
    """A subcommand whose client options may come before or after its actions."""
    parser = commands.add_parser(name, help=help, description=description,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_client_options(parser)
    return parser


def client_action(actions: argparse._SubParsersAction, name: str, *,
                  help: str) -> argparse.ArgumentParser:
    parser = actions.add_parser(name, help=help, description=help)
    add_client_options(parser)
    return parser


def bootstrap_servers(args: argparse.Namespace) -> list[tuple[str, int]]:
    given = getattr(args, "bootstrap_server", None)
    if given:
        return given
    return _servers(client_properties(args).get("bootstrap.servers", DEFAULT_BOOTSTRAP))


def _connector(args: argparse.Namespace) -> Connect:
    """How to open a connection with the command's client id and security."""
    settings = client_properties(args)
    protocol = settings.get("security.protocol", "PLAINTEXT").upper()
    security = ClientSecurity.from_properties(settings) if protocol != "PLAINTEXT" else None
    client_id = settings.get("client.id", DEFAULT_CLIENT_ID)

    async def connect(host: str, port: int) -> KafkaClient:
        return await KafkaClient.connect(host, port, client_id=client_id, security=security)

    return connect


async def connect(args: argparse.Namespace) -> ClusterClient:
    """A connection to the first bootstrap server that answers; the brokers
    of its cluster are reached through it with the same settings."""
    connector = _connector(args)
    failure: OSError | None = None
    for host, port in bootstrap_servers(args):
        try:
            return ClusterClient(await connector(host, port), (host, port), connector)
        except (OSError, TimeoutError) as exc:
            failure = exc if isinstance(exc, OSError) else OSError(str(exc))
    servers = ",".join(f"{h}:{p}" for h, p in bootstrap_servers(args))
    raise SystemExit(f"kafka-gateway: cannot connect to {servers}: {failure}")


@contextlib.asynccontextmanager
async def connected(args: argparse.Namespace) -> AsyncIterator[ClusterClient]:
    """The cluster through the bootstrap; a request no broker could serve
    exits with its error, and every connection is closed after."""
    client = await connect(args)
    try:
        yield client
    except RoutingError as error:
        raise SystemExit(str(error)) from None
    finally:
        await client.close()


def print_rows(rows: Sequence[Sequence[str]]) -> None:
    """A table, columns padded to their widest cell."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
              .rstrip())


def check(code: ErrorCode, message: str | None, what: str) -> None:
    """Exit with the error's Kafka name when a request failed."""
    if code is not ErrorCode.none:
        raise SystemExit(f"{what}: {code.name.upper()}{': ' + message if message else ''}")


async def topic_partitions(client: ClusterClient,
                           topics: Iterable[str] | None) -> dict[str, list[int]]:
    """Partition indexes per topic (None: every topic); an unknown topic exits."""
    response = await client.metadata(None if topics is None else list(topics))
    out = {}
    for topic in response.topics:
        check(topic.error_code, None, f"topic {topic.name}")
        out[topic.name] = sorted(p.partition_index for p in topic.partitions)
    return out


EARLIEST = -2
LATEST = -1


async def offsets_at(client: ClusterClient,
                     timestamps: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], int]:
    """ListOffsets: per partition, the offset at a timestamp (EARLIEST, LATEST or
    milliseconds: -1 where no record is that recent), asked of each partition's
    leader (again, at most ATTEMPTS times, while it moves). Partitions in error
    are left out."""
    out: dict[tuple[str, int], int] = {}
    pending = dict(timestamps)
    for attempt in range(ATTEMPTS):
        if not pending:
            break
        if attempt:
            await asyncio.sleep(backoff(attempt - 1))
        found = await client.leaders(pending)
        by_leader: dict[tuple[str, int], dict[tuple[str, int], int]] = {}
        for tp, address in found.leaders.items():
            by_leader.setdefault(address, {})[tp] = pending[tp]
        moved = set(found.leaderless)
        for address, wanted in by_leader.items():
            try:
                leader = await client.client_of(address, found.single)
                response = await leader.request(_list_offsets(wanted))
            except (OSError, asyncio.IncompleteReadError, TimeoutError):
                moved.update(wanted)
                continue
            for topic in response.topics:
                for part in topic.partitions:
                    tp = (topic.name, int(part.partition_index))
                    if part.error_code is ErrorCode.none:
                        out[tp] = int(part.offset)
                    elif part.error_code in LEADER_MOVED:
                        moved.add(tp)
        pending = {tp: pending[tp] for tp in moved}
    return out


def _list_offsets(timestamps: Mapping[tuple[str, int], int]) -> Any:
    by_topic: dict[str, list[tuple[int, int]]] = {}
    for (topic, partition), timestamp in timestamps.items():
        by_topic.setdefault(topic, []).append((partition, timestamp))
    return list_offsets.ListOffsetsRequest(
        replica_id=-1, isolation_level=0,
        topics=tuple(list_offsets.ListOffsetsTopic(name=topic, partitions=tuple(
            list_offsets.ListOffsetsPartition(partition_index=p, timestamp=t,
                                              current_leader_epoch=-1)
            for p, t in wanted)) for topic, wanted in by_topic.items()))


async def group_state(client: ClusterClient, group_id: str) -> Any:
    """The DescribeGroups answer for one group (state "Dead" when it does not
    exist), from its coordinator."""
    async def send(coordinator: KafkaClient) -> Any:
        return (await coordinator.request(describe_groups.DescribeGroupsRequest(
            groups=(group_id,), include_authorized_operations=False))).groups[0]

    described = await client.to_coordinator(f"describe {group_id}", group_id, GROUP, send,
                                            lambda answer: answer.error_code)
    if described.error_code is not ErrorCode.none:
        raise SystemExit(f"describe {group_id}: {described.error_code.name.upper()}")
    return described


async def committed_offsets(client: ClusterClient, group_id: str) -> dict[tuple[str, int], int]:
    """The group's committed offsets, from its coordinator."""
    async def send(coordinator: KafkaClient) -> Any:
        return (await coordinator.request(offset_fetch.OffsetFetchRequest(
            groups=(offset_fetch.OffsetFetchRequestGroup(group_id=group_id, topics=None),),
            require_stable=False))).groups[0]

    fetched = await client.to_coordinator(f"offsets of {group_id}", group_id, GROUP, send,
                                          lambda answer: answer.error_code)
    return {(t.name, p.partition_index): p.committed_offset
            for t in fetched.topics for p in t.partitions if p.committed_offset >= 0}


async def to_every_broker(client: ClusterClient, what: str, body: Any) -> tuple[list[Any], int]:
    """A listing request sent to every broker (ListGroups, ListTransactions:
    each broker lists what it coordinates): the answers of those that
    answered without error, and 1 if any failed (each failure on stderr, as
    Kafka's tools report a broker's error), else 0."""
    answers = []
    status = 0
    for node, (host, port), answer in await client.to_every_broker(
            lambda broker: broker.request(body)):
        if isinstance(answer, Exception):
            failure = f"{type(answer).__name__}: {answer}"
        elif answer.error_code is not ErrorCode.none:
            failure = answer.error_code.name.upper()
        else:
            answers.append(answer)
            continue
        print(f"Error: {what} of broker {node} ({host}:{port}): {failure}", file=sys.stderr)
        status = 1
    return answers, status
