"""``kafka-gateway groups list|describe GROUP``: consumer groups of a running
gateway (or any Kafka broker), like ``kafka-consumer-groups.sh``.

``describe`` shows the group's state, protocol and members, then per
partition the committed offset, the log end offset and the lag, with the
member that holds the partition.
"""

from __future__ import annotations

import argparse

from kio.schema.describe_groups.v5 import request as describe_groups
from kio.schema.errors import ErrorCode
from kio.schema.list_groups.v4 import request as list_groups
from kio.schema.list_offsets.v7 import request as list_offsets
from kio.schema.offset_fetch.v8 import request as offset_fetch

from . import config as settings
from .client import KafkaClient
from .groups.consumer_protocol import PROTOCOL_TYPE, assigned_partitions

LATEST = -1


def add_groups_parser(commands: argparse._SubParsersAction) -> None:
    groups = commands.add_parser("groups", help="inspect consumer groups on a running gateway")
    groups.add_argument("--bootstrap-server", default="127.0.0.1:9092", type=settings._hostport)
    actions = groups.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="group ids with state and protocol type")
    listing.add_argument("--state", action="append", default=[],
                         help="only groups in this state (repeatable)")
    describe = actions.add_parser("describe", help="members, assignment, offsets and lag")
    describe.add_argument("group")


async def run_groups(args: argparse.Namespace) -> int:
    client = await KafkaClient.connect(*args.bootstrap_server)
    try:
        if args.action == "list":
            response = await client.request(
                list_groups.ListGroupsRequest(states_filter=tuple(args.state)))
            _rows([("GROUP", "STATE", "PROTOCOL-TYPE")] + [
                (g.group_id, g.group_state, g.protocol_type or "-")
                for g in sorted(response.groups, key=lambda g: g.group_id)])
            return 0
        return await _describe(client, args.group)
    finally:
        await client.close()


async def _describe(client: KafkaClient, group_id: str) -> int:
    described = (await client.request(describe_groups.DescribeGroupsRequest(
        groups=(group_id,), include_authorized_operations=False))).groups[0]
    if described.error_code is not ErrorCode.none:
        raise SystemExit(f"describe {group_id}: {described.error_code.name.upper()}")
    if described.group_state == "Dead":
        print(f"Group {group_id} does not exist.")
        return 1
    fetched = (await client.request(offset_fetch.OffsetFetchRequest(
        groups=(offset_fetch.OffsetFetchRequestGroup(group_id=group_id, topics=None),),
        require_stable=False))).groups[0]
    committed = {(t.name, p.partition_index): p.committed_offset
                 for t in fetched.topics for p in t.partitions}
    owners: dict[tuple[str, int], object] = {}
    for member in described.members:
        if described.protocol_type == PROTOCOL_TYPE:
            for topic, partitions in (assigned_partitions(member.member_assignment) or {}).items():
                owners.update({(topic, p): member for p in partitions})
    partitions = sorted(set(committed) | set(owners))
    ends = await _log_end_offsets(client, partitions)

    protocol = "/".join(x for x in (described.protocol_type, described.protocol_data) if x)
    print(f"Group: {group_id}\tState: {described.group_state}\tProtocol: {protocol or '-'}\t"
          f"Members: {len(described.members)}")
    if described.members:
        print()
        _rows([("MEMBER-ID", "INSTANCE-ID", "CLIENT-ID", "HOST", "ASSIGNMENT")] + [
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
    _rows(rows)
    return 0


async def _log_end_offsets(client: KafkaClient,
                           partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    if not by_topic:
        return {}
    response = await client.request(list_offsets.ListOffsetsRequest(
        replica_id=-1, isolation_level=0,
        topics=tuple(list_offsets.ListOffsetsTopic(name=topic, partitions=tuple(
            list_offsets.ListOffsetsPartition(partition_index=p, timestamp=LATEST,
                                              current_leader_epoch=-1)
            for p in indexes)) for topic, indexes in by_topic.items())))
    return {(t.name, p.partition_index): p.offset for t in response.topics
            for p in t.partitions if p.error_code is ErrorCode.none}


def _assignment_text(assignment: bytes) -> str:
    partitions = assigned_partitions(assignment)
    if partitions is None:
        return "?"
    return ",".join(f"{t}-{p}" for t in sorted(partitions) for p in sorted(partitions[t])) or "-"


def _rows(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
              .rstrip())
