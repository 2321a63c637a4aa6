"""``kafka-gateway groups``: consumer groups of a running gateway (or any Kafka
broker), like ``kafka-consumer-groups.sh``.

- ``list``: group ids with state and protocol type;
- ``describe``: the group's state, protocol and members, then per partition
  the committed offset, the log end offset and the lag, with the member that
  holds the partition;
- ``delete``: groups without members, with their offsets;
- ``delete-offsets``: some committed offsets of a group (not of topics its
  members subscribe to);
- ``reset-offsets``: move a group's committed offsets (groups_reset.py).

Groups are named as positional arguments or with ``--group`` (repeatable, as
in Kafka's tool); ``--all-groups`` names every group.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kio.schema.delete_groups.v2 import request as delete_groups
from kio.schema.errors import ErrorCode
from kio.schema.list_groups.v4 import request as list_groups
from kio.schema.offset_delete.v0 import request as offset_delete

from ..client import KafkaClient
from ..cluster_client import GROUP, ClusterClient
from ..groups.consumer_protocol import PROTOCOL_TYPE, assigned_partitions
from .common import (
    LATEST,
    client_action,
    client_command,
    committed_offsets,
    connected,
    group_state,
    offsets_at,
    print_rows,
    to_every_broker,
    topic_partitions,
)
from .groups_reset import add_reset_arguments, parse_topic_partitions, reset_offsets


def add_groups_parser(commands: argparse._SubParsersAction) -> None:
    groups = client_command(commands, "groups", help="consumer groups on a running gateway",
                            description=__doc__)
    actions = groups.add_subparsers(dest="action", required=True)
    listing = client_action(actions, "list", help="group ids with state and protocol type")
    listing.add_argument("--state", action="append", default=[],
                         help="only groups in this state, e.g. Stable or Empty (repeatable; "
                              "default: every state)")
    describe = client_action(actions, "describe",
                             help="members, assignment, committed offsets and lag")
    add_group_selection(describe)
    delete = client_action(actions, "delete",
                           help="delete groups without members, with their committed offsets")
    add_group_selection(delete)
    delete_offsets = client_action(
        actions, "delete-offsets",
        help="delete a group's committed offsets of some topics or partitions")
    delete_offsets.add_argument("group_args", nargs="?", metavar="GROUP", help="the group id")
    delete_offsets.add_argument("--group", dest="group_flags", action="append", default=[],
                                help="the group whose offsets go")
    delete_offsets.add_argument("--topic", action="append", default=[], required=True,
                                metavar="TOPIC[:P,P...]",
                                help="a topic, or some of its partitions (repeatable)")
    reset = client_action(actions, "reset-offsets",
                          help="move committed offsets of inactive groups (dry run by default)")
    add_group_selection(reset)
    add_reset_arguments(reset)


def add_group_selection(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("group_args", nargs="*", metavar="GROUP", help="group ids")
    parser.add_argument("--group", dest="group_flags", action="append", default=[],
                        help="a group id (repeatable)")
    parser.add_argument("--all-groups", action="store_true",
                        help="every group the gateway knows (default: only those named)")


async def listed_groups(client: ClusterClient, states: tuple[str, ...]) -> tuple[list[Any], int]:
    """ListGroups of every broker (each lists the groups it coordinates), by
    group id; and 1 if a broker failed (reported on stderr), else 0."""
    answers, status = await to_every_broker(client, "list groups",
                                            list_groups.ListGroupsRequest(states_filter=states))
    listed = {g.group_id: g for answer in answers for g in answer.groups}
    return [listed[group] for group in sorted(listed)], status


async def selected_groups(client: ClusterClient, args: argparse.Namespace
                          ) -> tuple[list[str], int]:
    """The groups named, or every group with --all-groups (and the listing's status)."""
    named = [*(args.group_args or []), *args.group_flags]
    if getattr(args, "all_groups", False):
        if named:
            raise SystemExit("kafka-gateway: name groups or give --all-groups, not both")
        listed, status = await listed_groups(client, ())
        return [g.group_id for g in listed], status
    if not named:
        raise SystemExit("kafka-gateway: name a group (GROUP or --group GROUP) or --all-groups")
    return list(dict.fromkeys(named)), 0


async def run_groups(args: argparse.Namespace) -> int:
    async with connected(args) as client:
        if args.action == "list":
            listed, status = await listed_groups(client, tuple(args.state))
            print_rows([("GROUP", "STATE", "PROTOCOL-TYPE")] + [
                (g.group_id, g.group_state, g.protocol_type or "-") for g in listed])
            return status
        if args.action == "delete-offsets":
            return await _delete_offsets(client, args)
        groups, status = await selected_groups(client, args)
        if args.action == "delete":
            return max(status, await _delete(client, groups))
        if args.action == "reset-offsets":
            return max(status, await reset_offsets(client, groups, args))
        for number, group in enumerate(groups):
            if number:
                print()
            status = max(status, await _describe(client, group))
        return status


async def _describe(client: ClusterClient, group_id: str) -> int:
    described = await group_state(client, group_id)
    if described.group_state == "Dead":
        print(f"Group {group_id} does not exist.")
        return 1
    committed = await committed_offsets(client, group_id)
    owners: dict[tuple[str, int], object] = {}
    for member in described.members:
        if described.protocol_type == PROTOCOL_TYPE:
            for topic, partitions in (assigned_partitions(member.member_assignment) or {}).items():
                owners.update({(topic, p): member for p in partitions})
    partitions = sorted(set(committed) | set(owners))
    ends = await offsets_at(client, dict.fromkeys(partitions, LATEST))

    protocol = "/".join(x for x in (described.protocol_type, described.protocol_data) if x)
    print(f"Group: {group_id}\tState: {described.group_state}\tProtocol: {protocol or '-'}\t"
          f"Members: {len(described.members)}")
    if described.members:
        print()
        print_rows([("MEMBER-ID", "INSTANCE-ID", "CLIENT-ID", "HOST", "ASSIGNMENT")] + [
            (m.member_id, m.group_instance_id or "-", m.client_id, m.client_host or "-",
             _assignment_text(m.member_assignment) if described.protocol_type == PROTOCOL_TYPE
             else f"{len(m.member_assignment)} bytes")
            for m in described.members])
    print()
    rows: list[tuple[str, ...]] = [("TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET",
                                    "LAG", "CONSUMER-ID", "CLIENT-ID")]
    for topic, partition in partitions:
        current = committed.get((topic, partition), -1)
        end = ends.get((topic, partition), -1)
        lag = end - current if current >= 0 and end >= 0 else None
        owner = owners.get((topic, partition))
        rows.append((topic, str(partition), str(current) if current >= 0 else "-",
                     str(end) if end >= 0 else "-", str(lag) if lag is not None else "-",
                     owner.member_id if owner else "-", owner.client_id if owner else "-"))
    print_rows(rows)
    return 0


async def _delete(client: ClusterClient, groups: list[str]) -> int:
    """DeleteGroups of each group at its coordinator."""
    if not groups:
        print("No groups to delete.")
        return 0
    results = []
    for group in groups:
        async def send(coordinator: KafkaClient, group: str = group) -> Any:
            return (await coordinator.request(
                delete_groups.DeleteGroupsRequest(groups_names=(group,)))).results[0]

        results.append(await client.to_coordinator(f"delete {group}", group, GROUP, send,
                                                   lambda result: result.error_code))
    failed = [r for r in results if r.error_code is not ErrorCode.none]
    for result in results:
        if result.error_code is ErrorCode.none:
            print(f"Deleted group {result.group_id}.")
        else:
            print(f"Group {result.group_id} could not be deleted: "
                  f"{result.error_code.name.upper()}", file=sys.stderr)
    return 1 if failed else 0


async def _delete_offsets(client: ClusterClient, args: argparse.Namespace) -> int:
    named = [*([args.group_args] if args.group_args else []), *args.group_flags]
    if len(named) != 1:
        raise SystemExit("kafka-gateway: delete-offsets takes exactly one group")
    [group] = named
    wanted = parse_topic_partitions(args.topic)
    whole = [topic for topic, partitions in wanted.items() if partitions is None]
    if whole:
        wanted.update(await topic_partitions(client, whole))
    request = offset_delete.OffsetDeleteRequest(
        group_id=group, topics=tuple(
            offset_delete.OffsetDeleteRequestTopic(name=topic, partitions=tuple(
                offset_delete.OffsetDeleteRequestPartition(partition_index=p)
                for p in partitions or ()))
            for topic, partitions in wanted.items()))
    response = await client.to_coordinator(
        f"delete offsets of {group}", group, GROUP,
        lambda coordinator: coordinator.request(request), lambda answer: answer.error_code)
    if response.error_code is not ErrorCode.none:
        print(f"Offsets of group {group} could not be deleted: "
              f"{response.error_code.name.upper()}", file=sys.stderr)
        return 1
    rows = [("TOPIC", "PARTITION", "STATUS")]
    failed = False
    for topic in response.topics:
        for part in sorted(topic.partitions, key=lambda p: p.partition_index):
            ok = part.error_code is ErrorCode.none
            failed |= not ok
            rows.append((topic.name, str(part.partition_index),
                         "Successful" if ok else f"Error: {part.error_code.name.upper()}"))
    print_rows(rows)
    return 1 if failed else 0


def _assignment_text(assignment: bytes) -> str:
    partitions = assigned_partitions(assignment)
    if partitions is None:
        return "?"
    return ",".join(f"{t}-{p}" for t in sorted(partitions) for p in sorted(partitions[t])) or "-"
