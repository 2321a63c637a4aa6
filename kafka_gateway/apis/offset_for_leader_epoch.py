"""OffsetForLeaderEpoch (key 23), v2-4: where a leader epoch ends.

Clients ask it to detect log truncation after a leader change (KIP-320).
A node alone has one epoch, so epoch 0 ends at the high watermark; any other
epoch is unknown here and gets the undefined answer (-1, -1), as in Kafka.
In a cluster of gateways over PostgreSQL, the leaders share one log that is
never truncated, and batches carry the epochs of the gateways that wrote
them: any epoch up to the partition's current one ends at the high
watermark (so a client never finds a divergence), and a partition led
elsewhere answers NOT_LEADER_OR_FOLLOWER.
Needs DESCRIBE on each topic, or CLUSTER_ACTION on the cluster
(TOPIC_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

from kio.schema.errors import ErrorCode

from tablets.seam import LEADER_EPOCH

from ..answers import refuse_denied
from ..codec import NO_THROTTLE, Request, build, build_response, response_schema
from ..context import HandlerContext
from ..contract import Response
from ..errors import EXPECTED, error_code
from ..leader_epoch import leader_epoch_error
from ..routing import check_leader, leader_epoch
from ..security.acls import Operation, ResourceType
from ..security.authorizer import cluster_allowed, denied_names
from ..slicing import sliced

if TYPE_CHECKING:
    from kio.schema.offset_for_leader_epoch.v2 import request as v2
    from kio.schema.offset_for_leader_epoch.v3 import request as v3
    from kio.schema.offset_for_leader_epoch.v4 import request as v4

    # The request body at each version served: kio generates one class per version.
    OffsetForLeaderEpochRequest: TypeAlias = (
        v2.OffsetForLeaderEpochRequest | v3.OffsetForLeaderEpochRequest
        | v4.OffsetForLeaderEpochRequest
    )

    OffsetForLeaderPartition: TypeAlias = (
        v2.OffsetForLeaderPartition | v3.OffsetForLeaderPartition | v4.OffsetForLeaderPartition
    )

API_KEY = 23
VERSIONS = (2, 4)


async def handle(broker: HandlerContext, request: Request[OffsetForLeaderEpochRequest]) -> Response:
    schema = response_schema(API_KEY, request.version)
    topics = []
    denied = {}
    if not cluster_allowed(broker, request, Operation.CLUSTER_ACTION):
        denied = denied_names(broker, request, Operation.DESCRIBE, ResourceType.TOPIC,
                              (topic.topic for topic in request.body.topics))
    for topic in request.body.topics:
        partitions = []
        parts: tuple[OffsetForLeaderPartition, ...] = topic.partitions
        async for part in sliced(parts):
            epoch, end = -1, -1
            try:
                refuse_denied(denied, topic.topic)
                tablet = broker.engine.partition(topic.topic, part.partition)
                check_leader(broker, topic.topic, part.partition)
                current = leader_epoch(broker, topic.topic, part.partition)
                code = leader_epoch_error(part.current_leader_epoch, current)
                clustered = broker.engine.cluster() is not None
                if code is ErrorCode.none and (
                        part.leader_epoch == LEADER_EPOCH
                        or (clustered and 0 <= part.leader_epoch <= current)):
                    epoch, end = part.leader_epoch, tablet.high_watermark
            except EXPECTED as exc:
                code = error_code(exc)
            partitions.append(build(schema.EpochEndOffset, error_code=code,
                                    partition=part.partition, leader_epoch=epoch,
                                    end_offset=end))
        topics.append(build(schema.OffsetForLeaderTopicResult, topic=topic.topic,
                            partitions=tuple(partitions)))
    return build_response(schema.OffsetForLeaderEpochResponse, throttle_time=NO_THROTTLE,
                          topics=tuple(topics))
