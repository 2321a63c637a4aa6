"""OffsetDelete (key 47), v0: delete some committed offsets of a group.

Offsets of topics the group's members subscribe to stay, with
GROUP_SUBSCRIBED_TO_TOPIC for those partitions; a group with members of a
non-consumer protocol answers NON_EMPTY_GROUP; an unknown group
GROUP_ID_NOT_FOUND; a partition that does not exist
UNKNOWN_TOPIC_OR_PARTITION.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from ..codec import NO_THROTTLE, build, response_schema
from ..errors import error_code

API_KEY = 47
VERSIONS = (0, 0)


async def handle(broker, request):
    schema = response_schema(API_KEY, request.version)
    body = request.body
    group_code, protected = broker.group_offsets.check_offset_delete(body.group_id)
    codes: dict[tuple[str, int], ErrorCode] = {}
    doomed = []
    if group_code is ErrorCode.none:
        for topic in body.topics:
            for part in topic.partitions:
                tp = (topic.name, part.partition_index)
                if not broker.engine.has_partition(*tp):
                    codes[tp] = ErrorCode.unknown_topic_or_partition
                elif protected is None or topic.name in protected:
                    codes[tp] = ErrorCode.group_subscribed_to_topic
                else:
                    codes[tp] = ErrorCode.none
                    doomed.append(tp)
        if doomed:
            try:
                await broker.group_offsets.offsets.delete(body.group_id, doomed)
            except Exception as exc:  # the store refused the write
                codes.update(dict.fromkeys(doomed, error_code(exc)))
    return build(
        schema.OffsetDeleteResponse,
        error_code=group_code,
        throttle_time=NO_THROTTLE,
        topics=tuple(
            build(schema.OffsetDeleteResponseTopic, name=topic.name, partitions=tuple(
                build(schema.OffsetDeleteResponsePartition, partition_index=p.partition_index,
                      error_code=codes[(topic.name, p.partition_index)])
                for p in topic.partitions
            ))
            for topic in body.topics
        ) if group_code is ErrorCode.none else (),
    )
