"""OffsetDelete (key 47), v0: delete some committed offsets of a group.

Offsets of topics the group's members subscribe to stay, with
GROUP_SUBSCRIBED_TO_TOPIC for those partitions; a group with members of a
non-consumer protocol answers NON_EMPTY_GROUP; an unknown group
GROUP_ID_NOT_FOUND; a partition that does not exist
UNKNOWN_TOPIC_OR_PARTITION.

Needs DELETE on the group (GROUP_AUTHORIZATION_FAILED) and READ on each topic
(TOPIC_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

from kio.schema.errors import ErrorCode

from ..answers import answer_each, refuse_denied
from ..codec import NO_THROTTLE, Request, build, build_response, response_schema
from ..context import HandlerContext
from ..contract import Response
from ..errors import EXPECTED, GroupSubscribedToTopic, UnknownTopicOrPartition, code_of, error_code
from ..routing import authorize_coordinated
from ..security.acls import Operation, ResourceType
from ..security.authorizer import denied_names

if TYPE_CHECKING:
    from kio.schema.offset_delete.v0 import request as v0

    # The request body at each version served: kio generates one class per version.
    OffsetDeleteRequest: TypeAlias = v0.OffsetDeleteRequest

    OffsetDeleteRequestTopic: TypeAlias = v0.OffsetDeleteRequestTopic

    OffsetDeleteRequestPartition: TypeAlias = v0.OffsetDeleteRequestPartition

API_KEY = 47
VERSIONS = (0, 0)


async def handle(broker: HandlerContext, request: Request[OffsetDeleteRequest]) -> Response:
    schema = response_schema(API_KEY, request.version)
    body = request.body
    group_code = code_of(authorize_coordinated, broker, request, Operation.DELETE,
                         ResourceType.GROUP, body.group_id)
    protected = None
    if not group_code:
        group_code, protected = broker.group_offsets.check_offset_delete(body.group_id)
    denied = denied_names(broker, request, Operation.READ, ResourceType.TOPIC,
                          (topic.name for topic in body.topics)) if not group_code else {}
    doomed = []

    async def check(item: tuple[OffsetDeleteRequestTopic, OffsetDeleteRequestPartition]
                    ) -> tuple[tuple[str, int], ErrorCode]:
        topic, part = item
        tp = (topic.name, part.partition_index)
        refuse_denied(denied, topic.name)
        if not broker.engine.has_partition(*tp):
            raise UnknownTopicOrPartition()
        if protected is None or topic.name in protected:
            raise GroupSubscribedToTopic()
        doomed.append(tp)
        return tp, ErrorCode.none

    codes: dict[tuple[str, int], ErrorCode] = {}
    if group_code is ErrorCode.none:
        codes = dict(await answer_each(
            ((t, p) for t in body.topics for p in t.partitions), check,
            lambda item, exc: ((item[0].name, item[1].partition_index), error_code(exc))))
        if doomed:
            try:
                await broker.group_offsets.offsets.delete(body.group_id, doomed)
            except EXPECTED as exc:  # the store refused the write
                codes.update(dict.fromkeys(doomed, error_code(exc)))
    return build_response(
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
