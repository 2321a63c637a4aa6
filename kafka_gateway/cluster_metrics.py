"""/metrics of the cluster: several gateways over one store (docs/cluster.md).

Per live gateway, as this gateway's last leadership pass read it: when its
lease runs out (by the store's clock, a timestamp, so that an alert computes
``expiry - time()``), and how many partitions and coordinator slots it leads.
Per partition: its leader's node id (-1 while it has none) and its leader
epoch, which grows on every change of leader. A gateway alone over its
embedded store has no cluster, and none of these series.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from tablets.seam import NodeStorage

PREFIX = "kafka_gateway_"
NODE_LABELS = ["node_id"]
PARTITION_LABELS = ["topic", "partition"]
# Where the nodes' advertised addresses come from: a listener of that name,
# else each node's first (tablets.seam.ClusterView.brokers).
LISTENER = "PLAINTEXT"


def cluster_families(engine: NodeStorage) -> Iterator[Metric]:
    cluster = engine.cluster()
    if cluster is None:
        return
    nodes = cluster.nodes(LISTENER)
    yield GaugeMetricFamily(PREFIX + "cluster_nodes", "Live gateways in the cluster",
                            value=len(nodes))
    lease = GaugeMetricFamily(
        PREFIX + "cluster_node_lease_expiry_timestamp_seconds", "When the gateway's lease "
        "runs out unless renewed (Unix time, by PostgreSQL's clock; renewed every third of "
        "broker.session.timeout.ms)", labels=NODE_LABELS)
    partitions = GaugeMetricFamily(
        PREFIX + "cluster_node_partitions_led", "Partitions the gateway leads",
        labels=NODE_LABELS)
    slots = GaugeMetricFamily(
        PREFIX + "cluster_node_coordinator_slots_led", "Coordinator slots (of 50) the "
        "gateway leads: the groups and transactional ids it coordinates", labels=NODE_LABELS)
    for node in nodes:
        labels = [str(node.address.node_id)]
        lease.add_metric(labels, node.lease_expires_at)
        partitions.add_metric(labels, node.partitions_led)
        slots.add_metric(labels, node.coordinator_slots_led)
    leader = GaugeMetricFamily(
        PREFIX + "partition_leader", "Node id of the partition's leader (-1: none live)",
        labels=PARTITION_LABELS)
    epoch = GaugeMetricFamily(
        PREFIX + "partition_leader_epoch", "The partition's leader epoch (-1: unknown)",
        labels=PARTITION_LABELS)
    for topic in engine.list_topics():
        for tablet in topic.partitions:
            labels = [topic.name, str(tablet.partition)]
            found = cluster.partition_leader(topic.name, tablet.partition)
            leader.add_metric(labels, -1 if found is None else found)
            epoch.add_metric(labels, cluster.leader_epoch(topic.name, tablet.partition))
    yield from (lease, partitions, slots, leader, epoch)
