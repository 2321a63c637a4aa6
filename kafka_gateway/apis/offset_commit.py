"""OffsetCommit (key 8), v2-8: store a group's consumed positions, durably.

- Members of a group commit with their generation and member id: an old
  generation gets ILLEGAL_GENERATION, an unknown member UNKNOWN_MEMBER_ID,
  a fenced static member FENCED_INSTANCE_ID, and a commit between JoinGroup
  and SyncGroup REBALANCE_IN_PROGRESS (the fences of Kafka's coordinator).
- Generation -1 without a member id is the commit of a consumer that assigns
  partitions itself (``assign()``); accepted while the group has no members.
- Offset, leader epoch (v6+) and the metadata string are stored in the
  storage layer in one write, answered once it is in the WAL; OffsetFetch
  returns them as committed (a null metadata reads back as "", as in Kafka).
- Per partition: UNKNOWN_TOPIC_OR_PARTITION for a partition that does not
  exist, OFFSET_METADATA_TOO_LARGE beyond ``offset.metadata.max.bytes``.
- v2-4's retention_time is ignored: retention is the node's setting.

Needs READ on the group (GROUP_AUTHORIZATION_FAILED for every partition) and
on each topic (TOPIC_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

from kio.schema.errors import ErrorCode

from tablets.seam import OffsetCommit

from ..answers import answer_each, refuse_denied
from ..codec import NO_THROTTLE, Request, build, build_response, response_schema
from ..context import HandlerContext
from ..contract import Response
from ..errors import (
    EXPECTED,
    OffsetMetadataTooLarge,
    UnknownTopicOrPartition,
    code_of,
    error_class,
    error_code,
)
from ..routing import authorize_coordinated
from ..security.acls import Operation, ResourceType
from ..security.authorizer import denied_names
from ..slicing import sliced

if TYPE_CHECKING:
    from kio.schema.offset_commit.v2 import request as v2
    from kio.schema.offset_commit.v3 import request as v3
    from kio.schema.offset_commit.v4 import request as v4
    from kio.schema.offset_commit.v5 import request as v5
    from kio.schema.offset_commit.v6 import request as v6
    from kio.schema.offset_commit.v7 import request as v7
    from kio.schema.offset_commit.v8 import request as v8

    # The request body at each version served: kio generates one class per version.
    OffsetCommitRequest: TypeAlias = (
        v2.OffsetCommitRequest | v3.OffsetCommitRequest | v4.OffsetCommitRequest
        | v5.OffsetCommitRequest | v6.OffsetCommitRequest | v7.OffsetCommitRequest
        | v8.OffsetCommitRequest
    )

    OffsetCommitRequestTopic: TypeAlias = (
        v2.OffsetCommitRequestTopic | v3.OffsetCommitRequestTopic | v4.OffsetCommitRequestTopic
        | v5.OffsetCommitRequestTopic | v6.OffsetCommitRequestTopic | v7.OffsetCommitRequestTopic
        | v8.OffsetCommitRequestTopic
    )

    OffsetCommitRequestPartition: TypeAlias = (
        v2.OffsetCommitRequestPartition | v3.OffsetCommitRequestPartition
        | v4.OffsetCommitRequestPartition | v5.OffsetCommitRequestPartition
        | v6.OffsetCommitRequestPartition | v7.OffsetCommitRequestPartition
        | v8.OffsetCommitRequestPartition
    )

API_KEY = 8
VERSIONS = (2, 8)


async def handle(broker: HandlerContext, request: Request[OffsetCommitRequest]) -> Response:
    body = request.body
    max_metadata = broker.config.offset_metadata_max_bytes
    commits: dict[tuple[str, int], OffsetCommit] = {}
    group_denied = code_of(authorize_coordinated, broker, request, Operation.READ,
                           ResourceType.GROUP, body.group_id)
    denied = {} if group_denied else denied_names(broker, request, Operation.READ,
                                                  ResourceType.TOPIC,
                                                  (topic.name for topic in body.topics))

    async def check(item: tuple[OffsetCommitRequestTopic, OffsetCommitRequestPartition]
                    ) -> tuple[tuple[str, int], ErrorCode]:
        topic, part = item
        tp = (topic.name, part.partition_index)
        if group_denied:
            raise error_class(group_denied)()
        refuse_denied(denied, topic.name)
        if not broker.engine.has_partition(*tp):
            raise UnknownTopicOrPartition()
        metadata = part.committed_metadata or ""
        if len(metadata.encode()) > max_metadata:
            raise OffsetMetadataTooLarge()
        commits[tp] = OffsetCommit(part.committed_offset,
                                   getattr(part, "committed_leader_epoch", -1), metadata)
        return tp, ErrorCode.none  # the group's answer, once written

    codes = dict(await answer_each(
        ((t, p) for t in body.topics for p in t.partitions), check,
        lambda item, exc: ((item[0].name, item[1].partition_index), error_code(exc))))
    if commits:
        try:
            group_code = await broker.group_offsets.commit_offsets(
                body.group_id, body.generation_id_or_member_epoch, body.member_id,
                getattr(body, "group_instance_id", None), commits)
        except EXPECTED as exc:  # the store refused the write
            group_code = error_code(exc)
        codes.update(dict.fromkeys(commits, group_code))

    schema = response_schema(API_KEY, request.version)
    topics = []
    for topic in body.topics:  # in the request's order, as Kafka
        parts: tuple[OffsetCommitRequestPartition, ...] = topic.partitions
        partitions = [build(schema.OffsetCommitResponsePartition,
                            partition_index=p.partition_index,
                            error_code=codes[(topic.name, p.partition_index)])
                      async for p in sliced(parts)]
        topics.append(build(schema.OffsetCommitResponseTopic, name=topic.name,
                            partitions=tuple(partitions)))
    return build_response(schema.OffsetCommitResponse, throttle_time=NO_THROTTLE,
                          topics=tuple(topics))

