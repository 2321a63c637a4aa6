"""What the console shows, read from the running gateway (never changed).

Topics and partitions come from the storage engine, groups from the group
coordinator and the committed offsets, transactions from the transaction
coordinator, rates from the counters /metrics exports. The same sources as the
Kafka APIs, so the console and ``kafka-gateway topics|groups|transactions``
agree.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from tablets.seam import ImportantGroup, PartitionLog, TopicView
from tablets.topic_config import TOPIC_CONFIGS
from txn.state import TxnMetadata

from .. import routing
from ..context import HandlerContext
from ..groups.consumer_protocol import PROTOCOL_TYPE, assigned_partitions
from ..topic_configs import SOURCE_DEFAULT, SOURCE_DYNAMIC_TOPIC, topic_entries
from .paging import Page, page_of, page_of_sorted

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class PartitionRow:
    partition: int
    log_start_offset: int
    high_watermark: int
    size_bytes: int

    @property
    def records(self) -> int:
        return self.high_watermark - self.log_start_offset


@dataclass(frozen=True, slots=True)
class TopicSummary:
    name: str
    topic_id: str
    partitions: list[PartitionRow]
    overrides: dict[str, str]

    @property
    def size_bytes(self) -> int:
        return sum(p.size_bytes for p in self.partitions)

    @property
    def records(self) -> int:
        return sum(p.records for p in self.partitions)


@dataclass(frozen=True, slots=True)
class ConfigRow:
    name: str
    value: str
    source: str


@dataclass(frozen=True, slots=True)
class OffsetRow:
    topic: str
    partition: int
    committed: int | None
    end: int | None
    owner: str | None  # member id
    client_id: str | None

    @property
    def lag(self) -> int | None:
        if self.committed is None or self.end is None:
            return None
        return max(self.end - self.committed, 0)


@dataclass(frozen=True, slots=True)
class MemberRow:
    member_id: str
    instance_id: str | None
    client_id: str
    host: str
    assignment: list[TopicPartition]


@dataclass(slots=True)
class GroupView:
    group_id: str
    state: str
    protocol_type: str
    protocol: str
    members: list[MemberRow] = field(default_factory=list)
    offsets: list[OffsetRow] = field(default_factory=list)

    @property
    def lag(self) -> int:
        return sum(row.lag or 0 for row in self.offsets)


@dataclass(frozen=True, slots=True)
class NodeRow:
    node_id: int
    address: str
    lease_expires_ms: int  # Unix time, by the store's clock
    partitions_led: int
    coordinator_slots_led: int
    this_gateway: bool


def cluster_nodes(broker: HandlerContext) -> list[NodeRow] | None:
    """The live gateways of the cluster (None: this gateway runs alone)."""
    cluster = broker.engine.cluster()
    if cluster is None:
        return None
    return [NodeRow(n.address.node_id, f"{n.address.host}:{n.address.port}",
                    int(n.lease_expires_at * 1000), n.partitions_led, n.coordinator_slots_led,
                    n.address.node_id == broker.node_id)
            for n in cluster.nodes(routing.listener_name(None))]


def partition_leaders(broker: HandlerContext, topic_name: str,
                      partitions: Sequence[PartitionRow]) -> list[tuple[int | None, int]]:
    """(leader node, leader epoch) of each partition, as Metadata answers them."""
    return [(routing.partition_leader(broker, topic_name, p.partition),
             routing.leader_epoch(broker, topic_name, p.partition)) for p in partitions]


def _summary(topic: TopicView) -> TopicSummary:
    return TopicSummary(topic.name, str(topic.topic_id), [
        PartitionRow(t.partition, t.log_start_offset, t.high_watermark, t.size_bytes)
        for t in topic.partitions], dict(topic.configs))


def topics(broker: HandlerContext) -> list[TopicSummary]:
    return [_summary(t) for t in broker.engine.list_topics()]


@dataclass(frozen=True, slots=True)
class Totals:
    topics: int
    partitions: int
    records: int
    size_bytes: int


def totals(broker: HandlerContext) -> Totals:
    """The node's totals, without sorting or building a summary per topic."""
    partitions = records = size_bytes = 0
    every = broker.engine.list_topics()
    for found in every:
        for tablet in found.partitions:
            partitions += 1
            records += tablet.high_watermark - tablet.log_start_offset
            size_bytes += tablet.size_bytes
    return Totals(len(every), partitions, records, size_bytes)


def topic_page(broker: HandlerContext, after: str | None, before: str | None,
               size: int) -> tuple[Page, list[TopicSummary]]:
    """One page of topics, by name: only its topics are summarized."""
    found = {t.name: t for t in broker.engine.list_topics()}
    page = page_of(found.keys(), after=after, before=before, size=size)
    return page, [_summary(found[name]) for name in page.keys]


def topic(broker: HandlerContext, name: str) -> TopicSummary | None:
    found = broker.engine.find_topic(name)
    return None if found is None else _summary(found)


def topic_configs(broker: HandlerContext, name: str) -> list[ConfigRow]:
    """Every topic config with its value and where it comes from, as DescribeConfigs."""
    found = broker.engine.topic(name)
    rows = []
    for entry in topic_entries(found.configs, broker.config.topic_defaults(),
                               named=TOPIC_CONFIGS):  # the gateway's own too
        if entry.source == SOURCE_DYNAMIC_TOPIC:
            source = "topic"
        elif entry.source == SOURCE_DEFAULT:
            source = "default"
        else:
            source = f"gateway ({entry.synonyms[0][0]})"
        rows.append(ConfigRow(entry.name, "" if entry.value is None else entry.value, source))
    return rows


def group_ids(broker: HandlerContext) -> list[tuple[str, str, str]]:
    """(group id, protocol type, state) of every group."""
    return broker.groups.list_groups()


def group(broker: HandlerContext, group_id: str) -> GroupView | None:
    described = broker.groups.describe(group_id)
    committed = broker.engine.consumer_offsets.group_offsets(group_id)
    if described.state == "Dead" and not committed:
        return None
    view = GroupView(group_id, described.state, described.protocol_type,
                     described.protocol_data)
    owners: dict[TopicPartition, MemberRow] = {}
    for member in described.members:
        assignment: list[TopicPartition] = []
        if described.protocol_type == PROTOCOL_TYPE:
            parsed = assigned_partitions(member.assignment) or {}
            assignment = sorted((t, p) for t, ps in parsed.items() for p in ps)
        row = MemberRow(member.member_id, member.group_instance_id, member.client_id,
                        member.client_host, assignment)
        view.members.append(row)
        owners.update(dict.fromkeys(assignment, row))
    for topic_name, partition in sorted(set(committed) | set(owners)):
        end = None
        if broker.engine.has_partition(topic_name, partition):
            end = broker.engine.partition(topic_name, partition).high_watermark
        offset = committed.get((topic_name, partition))
        owner = owners.get((topic_name, partition))
        view.offsets.append(OffsetRow(
            topic_name, partition, None if offset is None else offset.offset, end,
            owner.member_id if owner else None, owner.client_id if owner else None))
    return view


def groups(broker: HandlerContext) -> list[GroupView]:
    return [view for group_id, _protocol, _state in group_ids(broker)
            if (view := group(broker, group_id)) is not None]


def group_keys(broker: HandlerContext) -> Collection[str]:
    """Every group id: groups the coordinator has, and groups with committed offsets."""
    committed = broker.engine.consumer_offsets
    return broker.groups.groups.keys() | set(committed.groups())


def group_page(broker: HandlerContext, after: str | None, before: str | None,
               size: int) -> tuple[Page, list[GroupView]]:
    """One page of groups, by id: only its groups are described and their lag read."""
    page = page_of(group_keys(broker), after=after, before=before, size=size)
    return page, [view for group_id in page.keys
                  if (view := group(broker, group_id)) is not None]


def transaction_page(broker: HandlerContext, after: str | None, before: str | None,
                     size: int) -> tuple[Page, list[TxnMetadata]]:
    """One page of transactional ids."""
    txns = broker.txns
    page = page_of_sorted(txns.ordered.ids, after=after, before=before, size=size)
    return page, [txns.txns[transactional_id] for transactional_id in page.keys]


def readers_of(broker: HandlerContext, topic_name: str) -> list[tuple[str, int]]:
    """Groups with offsets on a topic, and their lag on it."""
    offsets = broker.engine.consumer_offsets
    out = []
    for group_id in sorted(offsets.groups()):
        committed = {tp: c for tp, c in offsets.group_offsets(group_id).items()
                     if tp[0] == topic_name}
        if committed and broker.engine.find_topic(topic_name) is not None:
            lag = 0
            for (name, partition), offset in committed.items():
                if broker.engine.has_partition(name, partition):
                    lag += max(broker.engine.partition(name, partition).high_watermark
                               - offset.offset, 0)
            out.append((group_id, lag))
    return out


def important_of(broker: HandlerContext, topic_name: str) -> list[ImportantGroup]:
    """The topic's important consumer groups per partition: lag, and what they
    hold back from retention (tablets/important.py)."""
    return broker.engine.important_groups(topic_name)


def rates(broker: HandlerContext, topic_name: str | None = None) -> dict[str, float]:
    """Counters the charts turn into rates: bytes in and out, records appended
    (the high watermarks) and records consumed (the groups' committed offsets)."""
    metrics = broker.metrics
    engine = broker.engine
    if topic_name is None:
        bytes_in, bytes_out = metrics.produced_bytes, metrics.fetched_bytes
        tablets: Sequence[PartitionLog] = [t for topic_ in engine.list_topics()
                                           for t in topic_.partitions]
    else:
        found = engine.find_topic(topic_name)
        tablets = [] if found is None else found.partitions
        bytes_in = 0 if found is None else metrics.topic_bytes_in.get(found.topic_id, 0)
        bytes_out = 0 if found is None else metrics.topic_bytes_out.get(found.topic_id, 0)
    consumed = 0
    offsets = engine.consumer_offsets
    for group_id in offsets.groups():
        for (name, _partition), committed in offsets.group_offsets(group_id).items():
            if topic_name is None or name == topic_name:
                consumed += committed.offset
    return {"time": time.time(), "bytes_in": bytes_in, "bytes_out": bytes_out,
            "records_in": sum(t.high_watermark for t in tablets), "records_out": consumed}
