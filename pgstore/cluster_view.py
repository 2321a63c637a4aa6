"""The routing answers of a gateway in a cluster (the seam's ``ClusterView``):
who leads a partition, who coordinates a key, the live gateways and their
addresses, whether this gateway leads or coordinates, all as of its last
leadership pass (``pgstore.leadership``) and its logs' state. It owns that
state's registers: the current ``Leadership`` (a new one after each rejoin),
the coordinator slots gained and loaded (``open_slots``), and the watchers
of coordination. ``PgCluster`` (``pgstore.cluster``) is this view and keeps
it current; ``pgstore.cluster_opening`` opens what it gains. Answers are
hints for routing; every write is fenced by the database itself.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from tablets.seam import BrokerAddress, ClusterNode

from .placement import coordinator_slot

if TYPE_CHECKING:
    from .leadership import Leadership
    from .topics import PgTopicCatalog


class PgClusterView:
    """The seam's ``ClusterView`` over this gateway's leadership (see the
    module's docstring)."""

    def __init__(self, catalog: PgTopicCatalog, node_id: int) -> None:
        self.catalog = catalog
        self.node_id = node_id
        self.leadership: Leadership | None = None
        # Told when this gateway stops coordinating keys, and when it gains them.
        self.lost_watchers: list[Callable[[Callable[[str], bool]], None]] = []
        self.gained_watchers: list[Callable[[Callable[[str], bool]], None]] = []
        self.open_slots: set[int] = set()  # gained and loaded

    def brokers(self, listener: str) -> list[BrokerAddress]:
        lead = self.leadership
        if lead is None:
            return []
        out = []
        for node in lead.nodes:
            if not node.listeners:
                continue
            chosen = next((x for x in node.listeners if x.name == listener), node.listeners[0])
            out.append(BrokerAddress(node.node_id, chosen.host, chosen.port))
        return out

    def nodes(self, listener: str) -> list[ClusterNode]:
        lead = self.leadership
        if lead is None:
            return []
        partitions = Counter(x.leader_node for x in lead.partition_leaders.values())
        slots = Counter(x.leader_node for x in lead.slot_leaders.values())
        expiry = {node.node_id: node.lease_expires_at.timestamp() for node in lead.nodes}
        return [ClusterNode(address, expiry[address.node_id], partitions[address.node_id],
                            slots[address.node_id]) for address in self.brokers(listener)]

    def partition_leader(self, topic: str, index: int) -> int | None:
        lead = self.leadership
        if lead is None:
            return None
        found = lead.partition_leader(self.catalog.partition(topic, index).log_id)
        if found is None or found.leader_node is None or found.leader_node not in lead.live:
            return None
        return found.leader_node

    def leader_epoch(self, topic: str, index: int) -> int:
        partition = self.catalog.partition(topic, index)
        if not partition.fenced and not partition.deleted:
            return partition.leader_epoch
        lead = self.leadership
        found = None if lead is None else lead.partition_leader(partition.log_id)
        return -1 if found is None or found.leader_node is None else found.epoch

    def leads(self, topic: str, index: int) -> bool:
        partition = self.catalog.partition(topic, index)
        return not partition.fenced and not partition.deleted

    def coordinator(self, key: str) -> int | None:
        lead = self.leadership
        if lead is None:
            return None
        _, found = lead.coordinator(key)
        if found is None or found.leader_node is None or found.leader_node not in lead.live:
            return None
        return found.leader_node

    def coordinates(self, key: str) -> bool:
        return self.slot_held(key) is not None

    def slot_held(self, key: str) -> tuple[int, int, int] | None:
        """(slot, node id, epoch) of the key's slot when this gateway
        coordinates it (gained and loaded), else None: the coordinator's
        fence (``PgConsumerOffsets.fence_coordinator``)."""
        lead = self.leadership
        slot = coordinator_slot(key)
        if lead is None or slot not in self.open_slots:
            return None
        epoch = lead.slot_epoch(slot)
        return None if epoch is None else (slot, self.node_id, epoch)

    def watch_coordination(self, lost: Callable[[Callable[[str], bool]], None],
                           gained: Callable[[Callable[[str], bool]], None] | None = None,
                           ) -> None:
        self.lost_watchers.append(lost)
        if gained is not None:
            self.gained_watchers.append(gained)
