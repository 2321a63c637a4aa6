"""DeleteRecords (key 21), v0-2: move a partition's log start offset forward.

Batches wholly below the new start are deleted in one write; the one that
contains it stays (fetches return it and clients skip the records below).
-1 means the high watermark. Beyond it: OFFSET_OUT_OF_RANGE.

Needs DELETE on each topic (TOPIC_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

from kio.schema.errors import ErrorCode

from ..answers import each_partition, refuse_denied
from ..codec import NO_THROTTLE, Request, build, build_response, response_schema
from ..context import HandlerContext
from ..contract import Response
from ..errors import error_code
from ..security.acls import Operation, ResourceType
from ..security.authorizer import denied_names

if TYPE_CHECKING:
    from kio.schema.delete_records.v0 import request as v0
    from kio.schema.delete_records.v1 import request as v1
    from kio.schema.delete_records.v2 import request as v2

    # The request body at each version served: kio generates one class per version.
    DeleteRecordsRequest: TypeAlias = (
        v0.DeleteRecordsRequest | v1.DeleteRecordsRequest | v2.DeleteRecordsRequest
    )

    DeleteRecordsTopic: TypeAlias = (
        v0.DeleteRecordsTopic | v1.DeleteRecordsTopic | v2.DeleteRecordsTopic
    )

    DeleteRecordsPartition: TypeAlias = (
        v0.DeleteRecordsPartition | v1.DeleteRecordsPartition | v2.DeleteRecordsPartition
    )

API_KEY = 21
VERSIONS = (0, 2)


async def handle(broker: HandlerContext, request: Request[DeleteRecordsRequest]) -> Response:
    schema = response_schema(API_KEY, request.version)
    denied = denied_names(broker, request, Operation.DELETE, ResourceType.TOPIC,
                          (topic.name for topic in request.body.topics))

    def answer(part: DeleteRecordsPartition, low: int = -1,
               code: ErrorCode = ErrorCode.none) -> object:
        return build(schema.DeleteRecordsPartitionResult, partition_index=part.partition_index,
                     low_watermark=low, error_code=code)

    async def delete(topic: DeleteRecordsTopic, part: DeleteRecordsPartition) -> object:
        refuse_denied(denied, topic.name)
        tablet = broker.engine.partition(topic.name, part.partition_index)
        return answer(part, await tablet.delete_records(part.offset))

    topics: tuple[DeleteRecordsTopic, ...] = request.body.topics
    answered = await each_partition(topics, lambda topic: topic.partitions, delete,
                                    lambda _topic, part, exc: answer(part, code=error_code(exc)))
    return build_response(schema.DeleteRecordsResponse, throttle_time=NO_THROTTLE, topics=tuple(
        build(schema.DeleteRecordsTopicResult, name=topic.name, partitions=tuple(parts))
        for topic, parts in answered))
