"""OffsetFetch (key 9), v1-8: a group's committed offsets.

- Named partitions, or (v2+, topics null) every partition the group has an
  offset for. A partition without one answers offset -1 and metadata "".
- v5+ returns the committed leader epoch; v8 asks for several groups at once.
- require_stable (v7+): a partition whose offset an open transaction has
  staged answers UNSTABLE_OFFSET_COMMIT, so the consumer retries instead of
  starting from an offset about to move.
- Offsets are read from memory (loaded at start-up), whatever the group's
  membership state; an unknown group simply has none. In a cluster, offsets
  staged here for a transaction another gateway coordinates are pending
  until the store says it ended; the group is read again then
  (``TransactionCoordinator.settle_offsets``).

Needs DESCRIBE on the group (GROUP_AUTHORIZATION_FAILED) and on each topic:
named ones the principal may not describe answer TOPIC_AUTHORIZATION_FAILED,
an all-topics answer leaves them out.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from types import ModuleType
from typing import TYPE_CHECKING, TypeAlias

from kio.schema.errors import ErrorCode
from kio.schema.offset_fetch.v8 import request as v8

from tablets.seam import CommittedOffset, TopicPartition

from ..codec import NO_THROTTLE, Request, build, build_response, response_schema
from ..context import HandlerContext
from ..contract import Response
from ..errors import EXPECTED, code_of
from ..routing import authorize_coordinated
from ..security.acls import Operation, ResourceType
from ..security.authorizer import denied_names
from ..slicing import sliced

if TYPE_CHECKING:
    from kio.schema.offset_fetch.v1 import request as v1
    from kio.schema.offset_fetch.v2 import request as v2
    from kio.schema.offset_fetch.v3 import request as v3
    from kio.schema.offset_fetch.v4 import request as v4
    from kio.schema.offset_fetch.v5 import request as v5
    from kio.schema.offset_fetch.v6 import request as v6
    from kio.schema.offset_fetch.v7 import request as v7

    # The request body at each version served: kio generates one class per version.
    OffsetFetchRequest: TypeAlias = (
        v1.OffsetFetchRequest | v2.OffsetFetchRequest | v3.OffsetFetchRequest
        | v4.OffsetFetchRequest | v5.OffsetFetchRequest | v6.OffsetFetchRequest
        | v7.OffsetFetchRequest | v8.OffsetFetchRequest
    )

    # The topics a request names (v1-7), or one group's of a v8 request.
    OffsetFetchTopic: TypeAlias = (
        v1.OffsetFetchRequestTopic | v2.OffsetFetchRequestTopic | v3.OffsetFetchRequestTopic
        | v4.OffsetFetchRequestTopic | v5.OffsetFetchRequestTopic | v6.OffsetFetchRequestTopic
        | v7.OffsetFetchRequestTopic | v8.OffsetFetchRequestTopics
    )

    # (committed offset or None, code) by partition
    _Found: TypeAlias = dict[TopicPartition, tuple[CommittedOffset | None, ErrorCode]]

API_KEY = 9
VERSIONS = (1, 8)


async def handle(broker: HandlerContext, request: Request[OffsetFetchRequest]) -> Response:
    schema = response_schema(API_KEY, request.version)
    body = request.body
    if isinstance(body, v8.OffsetFetchRequest):  # v8: a batch of groups
        return build_response(schema.OffsetFetchResponse, throttle_time=NO_THROTTLE, groups=tuple([
            await _group(broker, request, schema, g.group_id, g.topics, body.require_stable)
            async for g in sliced(body.groups)
        ]))
    group_denied = _group_denied(broker, request, body.group_id)
    if group_denied and request.version >= 2:
        return build_response(schema.OffsetFetchResponse, throttle_time=NO_THROTTLE, topics=(),
                              error_code=group_denied)
    topics = await _topics(broker, request, schema, body.group_id, body.topics,
                     getattr(body, "require_stable", False), "OffsetFetchResponseTopic",
                     "OffsetFetchResponsePartition", group_denied)
    return build_response(schema.OffsetFetchResponse, throttle_time=NO_THROTTLE, topics=topics,
                          error_code=ErrorCode.none)


def _group_denied(broker: HandlerContext, request: Request[object], group_id: str) -> ErrorCode:
    return code_of(authorize_coordinated, broker, request, Operation.DESCRIBE,
                   ResourceType.GROUP, group_id)


async def _group(broker: HandlerContext, request: Request[object], schema: ModuleType,
                 group_id: str, topics: Iterable[OffsetFetchTopic] | None,
                 require_stable: bool) -> object:
    if group_denied := _group_denied(broker, request, group_id):
        return build(schema.OffsetFetchResponseGroup, group_id=group_id,
                     error_code=group_denied, topics=())
    return build(
        schema.OffsetFetchResponseGroup, group_id=group_id, error_code=ErrorCode.none,
        topics=await _topics(broker, request, schema, group_id, topics, require_stable,
                       "OffsetFetchResponseTopics", "OffsetFetchResponsePartitions"),
    )


async def _topics(broker: HandlerContext, request: Request[object], schema: ModuleType,
                  group_id: str, topics: Iterable[OffsetFetchTopic] | None,
                  require_stable: bool, topic_cls: str, partition_cls: str,
                  group_denied: ErrorCode = ErrorCode.none) -> tuple[object, ...]:
    wanted: list[TopicPartition] | None = None if topics is None else [
        tp async for tp in sliced((t.name, p) for t in topics for p in t.partition_indexes)
    ]
    found: _Found
    if not group_denied:
        # Offsets staged here for transactions other gateways coordinate:
        # those committed since are read first (txn/remote_offsets.py). When
        # the store cannot be asked they stay held: require_stable answers
        # UNSTABLE_OFFSET_COMMIT for them.
        with contextlib.suppress(*EXPECTED):
            await broker.txns.settle_offsets(group_id)
    if group_denied:  # v1: the group's refusal is told per partition
        found = {tp: (None, group_denied) for tp in wanted or ()}
    elif broker.authorizer is None:
        found = broker.group_offsets.fetch_offsets(group_id, wanted, require_stable)
    else:
        found = _described(broker, request, group_id, wanted, require_stable)
    by_topic: dict[str, list[object]] = {}
    async for (topic, partition), (committed, code) in sliced(found.items()):
        by_topic.setdefault(topic, []).append(build(
            getattr(schema, partition_cls),
            partition_index=partition,
            committed_offset=committed.offset if committed else -1,
            committed_leader_epoch=committed.leader_epoch if committed else -1,
            metadata=committed.metadata if committed else "",
            error_code=code,
        ))
    return tuple(
        build(getattr(schema, topic_cls), name=name, partitions=tuple(partitions))
        for name, partitions in by_topic.items()
    )


def _described(broker: HandlerContext, request: Request[object], group_id: str,
               wanted: list[TopicPartition] | None, require_stable: bool) -> _Found:
    """Offsets of topics the principal may DESCRIBE: the others named in the
    request answer TOPIC_AUTHORIZATION_FAILED; left out of an all-topics answer."""
    if wanted is None:
        found = broker.group_offsets.fetch_offsets(group_id, None, require_stable)
        denied = denied_names(broker, request, Operation.DESCRIBE, ResourceType.TOPIC,
                              (topic for topic, _p in found), log=False)
        return {tp: value for tp, value in found.items() if tp[0] not in denied}
    denied = denied_names(broker, request, Operation.DESCRIBE, ResourceType.TOPIC,
                          (topic for topic, _p in wanted))
    allowed = [tp for tp in wanted if tp[0] not in denied]
    found = broker.group_offsets.fetch_offsets(group_id, allowed, require_stable)
    return {tp: found[tp] if tp in found else (None, denied[tp[0]]) for tp in wanted}
