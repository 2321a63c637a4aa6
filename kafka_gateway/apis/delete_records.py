"""DeleteRecords (key 21), v0-2: move a partition's log start offset forward.

Batches wholly below the new start are deleted in one write; the one that
contains it stays (fetches return it and clients skip the records below).
-1 means the high watermark. Beyond it: OFFSET_OUT_OF_RANGE.

Needs DELETE on each topic (TOPIC_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from ..codec import NO_THROTTLE, build, response_schema
from ..errors import EXPECTED, error_class, error_code
from ..security.acls import Operation, ResourceType
from ..security.authorizer import denied_names
from ..slicing import sliced

API_KEY = 21
VERSIONS = (0, 2)


async def handle(broker, request):
    schema = response_schema(API_KEY, request.version)
    topics = []
    denied = denied_names(broker, request, Operation.DELETE, ResourceType.TOPIC,
                          (topic.name for topic in request.body.topics))
    for topic in request.body.topics:
        partitions = []
        async for part in sliced(topic.partitions):
            try:
                if code := denied.get(topic.name):
                    raise error_class(code)()
                tablet = broker.engine.partition(topic.name, part.partition_index)
                low = await tablet.delete_records(part.offset)
                code = ErrorCode.none
            except EXPECTED as exc:
                low, code = -1, error_code(exc)
            partitions.append(build(schema.DeleteRecordsPartitionResult,
                                    partition_index=part.partition_index, low_watermark=low,
                                    error_code=code))
        topics.append(build(schema.DeleteRecordsTopicResult, name=topic.name,
                            partitions=tuple(partitions)))
    return build(schema.DeleteRecordsResponse, throttle_time=NO_THROTTLE, topics=tuple(topics))
