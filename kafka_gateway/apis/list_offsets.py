"""ListOffsets (key 2), v1-7: offsets by position or by timestamp.

- -2 (earliest): the log start offset.
- -1 (latest): the high watermark, which is also the last stable offset
  (transactional data reaches the log only when committed), so both
  isolation levels get the same, correct answer; Spark's source asks this way.
- -3 (max timestamp, v7): the record with the largest timestamp.
- any other timestamp: the first record stamped at or after it, found with
  the time index and a scan of that one batch; (-1, -1) and leader epoch -1
  when there is none.
- a partition asked for twice in one request: INVALID_REQUEST for both, as Kafka.

Needs DESCRIBE on each topic (TOPIC_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

from collections import Counter
from types import ModuleType
from typing import TYPE_CHECKING, TypeAlias

from kio.schema.errors import ErrorCode

from tablets.seam import LEADER_EPOCH, PartitionLog

from ..answers import each_partition, refuse_denied
from ..codec import NO_THROTTLE, Request, build, build_response, response_schema
from ..context import HandlerContext
from ..contract import Response
from ..errors import InvalidRequest, error_class, error_code
from ..leader_epoch import leader_epoch_error
from ..routing import check_leader, leader_epoch
from ..security.acls import Operation, ResourceType
from ..security.authorizer import denied_names

if TYPE_CHECKING:
    from kio.schema.list_offsets.v1 import request as v1
    from kio.schema.list_offsets.v2 import request as v2
    from kio.schema.list_offsets.v3 import request as v3
    from kio.schema.list_offsets.v4 import request as v4
    from kio.schema.list_offsets.v5 import request as v5
    from kio.schema.list_offsets.v6 import request as v6
    from kio.schema.list_offsets.v7 import request as v7

    # The request body at each version served: kio generates one class per version.
    ListOffsetsRequest: TypeAlias = (
        v1.ListOffsetsRequest | v2.ListOffsetsRequest | v3.ListOffsetsRequest
        | v4.ListOffsetsRequest | v5.ListOffsetsRequest | v6.ListOffsetsRequest
        | v7.ListOffsetsRequest
    )

    ListOffsetsTopic: TypeAlias = (
        v1.ListOffsetsTopic | v2.ListOffsetsTopic | v3.ListOffsetsTopic | v4.ListOffsetsTopic
        | v5.ListOffsetsTopic | v6.ListOffsetsTopic | v7.ListOffsetsTopic
    )

    ListOffsetsPartition: TypeAlias = (
        v1.ListOffsetsPartition | v2.ListOffsetsPartition | v3.ListOffsetsPartition
        | v4.ListOffsetsPartition | v5.ListOffsetsPartition | v6.ListOffsetsPartition
        | v7.ListOffsetsPartition
    )

API_KEY = 2
VERSIONS = (1, 7)

LATEST = -1
EARLIEST = -2
MAX_TIMESTAMP = -3


async def handle(broker: HandlerContext, request: Request[ListOffsetsRequest]) -> Response:
    schema = response_schema(API_KEY, request.version)
    asked = Counter((t.name, p.partition_index) for t in request.body.topics for p in t.partitions)
    denied = denied_names(broker, request, Operation.DESCRIBE, ResourceType.TOPIC,
                          (topic.name for topic in request.body.topics))

    async def look_up(topic: ListOffsetsTopic, part: ListOffsetsPartition) -> object:
        refuse_denied(denied, topic.name)
        if asked[topic.name, part.partition_index] > 1:  # as Kafka: ambiguous
            raise InvalidRequest()
        check_leader(broker, topic.name, part.partition_index)
        epoch = (leader_epoch(broker, topic.name, part.partition_index)
                 if broker.engine.has_partition(topic.name, part.partition_index)
                 else LEADER_EPOCH)
        code = leader_epoch_error(getattr(part, "current_leader_epoch", -1), epoch)
        if code is not ErrorCode.none:
            raise error_class(code)()
        tablet = broker.engine.partition(topic.name, part.partition_index)
        offset, timestamp = await _lookup(tablet, part.timestamp)
        return _answer(schema, part.partition_index, ErrorCode.none, offset, timestamp, epoch)

    topics: tuple[ListOffsetsTopic, ...] = request.body.topics
    answered = await each_partition(
        topics, lambda topic: topic.partitions, look_up,
        lambda _topic, part, exc: _answer(schema, part.partition_index, error_code(exc)))
    return build_response(schema.ListOffsetsResponse, throttle_time=NO_THROTTLE, topics=tuple(
        build(schema.ListOffsetsTopicResponse, name=topic.name, partitions=tuple(parts))
        for topic, parts in answered))


async def _lookup(tablet: PartitionLog, timestamp: int) -> tuple[int, int]:
    if timestamp == LATEST:
        return tablet.last_stable_offset, -1
    if timestamp == EARLIEST:
        return tablet.log_start_offset, -1
    found = await (
        tablet.max_timestamp() if timestamp == MAX_TIMESTAMP
        else tablet.offset_for_timestamp(timestamp)
    )
    return found if found is not None else (-1, -1)


def _answer(schema: ModuleType, index: int, code: ErrorCode, offset: int = -1,
            timestamp: int = -1, epoch: int = LEADER_EPOCH) -> object:
    return build(
        schema.ListOffsetsPartitionResponse,
        partition_index=index,
        error_code=code,
        timestamp=timestamp,
        offset=offset,
        # As Kafka: no epoch when no offset was found.
        leader_epoch=epoch if code is ErrorCode.none and offset != -1 else -1,
    )
