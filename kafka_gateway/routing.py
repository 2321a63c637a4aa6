"""Routing in a cluster of gateways: who the brokers are, who leads a
partition, who coordinates a group or transactional id, read from the
engine's ``ClusterView`` (``engine.cluster()``; docs/cluster.md).

A node alone (the RocksDB engine: ``cluster()`` is None) is the only broker,
leads every partition and coordinates every key, as before. In a cluster, a
request for a partition this gateway does not lead gets
NOT_LEADER_OR_FOLLOWER, and one for a key it does not coordinate gets
NOT_COORDINATOR, so stock clients refresh their metadata and go where
Metadata and FindCoordinator send them.
"""

from __future__ import annotations

from tablets.seam import LEADER_EPOCH, BrokerAddress

from .codec import Request
from .context import HandlerContext
from .errors import NotCoordinator, NotLeaderOrFollower
from .security.acls import Operation, ResourceType
from .security.authorizer import authorize, authorize_txn


def listener_name(request: object) -> str:
    session = getattr(request, "session", None)
    return session.listener.name if session is not None else "PLAINTEXT"


def brokers(broker: HandlerContext, request: object) -> list[BrokerAddress]:
    """The live brokers, this one always among them."""
    host, port = broker.advertised(request)
    me = BrokerAddress(broker.node_id, host, port)
    cluster = broker.engine.cluster()
    if cluster is None:
        return [me]
    found = {b.node_id: b for b in cluster.brokers(listener_name(request))}
    found[me.node_id] = me
    return [found[node] for node in sorted(found)]


async def topics_current(broker: HandlerContext) -> None:
    """In a cluster, reread the topic catalog before answering from it: a
    request about topic configs reads what another gateway changed or made a
    moment ago (as Kafka's controller answers config changes), instead of
    the catalog as of this gateway's last topic notice."""
    cluster = broker.engine.cluster()
    if cluster is not None:
        await cluster.catch_up_topics()


def partition_leader(broker: HandlerContext, topic: str, index: int) -> int | None:
    cluster = broker.engine.cluster()
    return broker.node_id if cluster is None else cluster.partition_leader(topic, index)


def leader_epoch(broker: HandlerContext, topic: str, index: int) -> int:
    """The partition's leader epoch (KIP-320): a node alone has one forever."""
    cluster = broker.engine.cluster()
    return LEADER_EPOCH if cluster is None else cluster.leader_epoch(topic, index)


def coordinator(broker: HandlerContext, key: str) -> int | None:
    cluster = broker.engine.cluster()
    return broker.node_id if cluster is None else cluster.coordinator(key)


def check_leader(broker: HandlerContext, topic: str, index: int) -> None:
    """NOT_LEADER_OR_FOLLOWER unless this gateway leads the partition (an
    unknown partition is left to the caller's own check)."""
    cluster = broker.engine.cluster()
    if (cluster is not None and broker.engine.has_partition(topic, index)
            and not cluster.leads(topic, index)):
        raise NotLeaderOrFollower()


def coordinates(broker: HandlerContext, key: str) -> bool:
    """This gateway coordinates the group or transactional id (a node alone: every one)."""
    cluster = broker.engine.cluster()
    return cluster is None or cluster.coordinates(key)


def check_coordinator(broker: HandlerContext, key: str) -> None:
    """NOT_COORDINATOR unless this gateway coordinates the group or transactional id."""
    cluster = broker.engine.cluster()
    if cluster is not None and not cluster.coordinates(key):
        raise NotCoordinator()


def authorize_coordinated(broker: HandlerContext, request: Request[object],
                          operation: Operation, resource: ResourceType, key: str) -> None:
    """A group request's checks in Kafka's order: the ACL, then whether this
    gateway coordinates the group (NOT_COORDINATOR: the client asks
    FindCoordinator again)."""
    authorize(broker, request, operation, resource, key)
    check_coordinator(broker, key)


def authorize_txn_coordinated(broker: HandlerContext, request: Request[object],
                              transactional_id: str, group_id: str | None = None) -> None:
    """A transactional request's checks (``authorize_txn``), then whether this
    gateway coordinates the transactional id (NOT_COORDINATOR)."""
    authorize_txn(broker, request, transactional_id, group_id)
    check_coordinator(broker, transactional_id)


def authorize_txn_offsets(broker: HandlerContext, request: Request[object],
                          transactional_id: str, group_id: str) -> None:
    """TxnOffsetCommit's checks: it goes to the group's coordinator, as in Kafka."""
    authorize_txn(broker, request, transactional_id, group_id)
    check_coordinator(broker, group_id)
