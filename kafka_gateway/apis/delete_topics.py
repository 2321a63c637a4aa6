"""DeleteTopics (key 20), v1-6: remove topics, by name or (v6) by id.

A topic's keys are one range per kind, so deletion is one atomic write of
range tombstones; fetchers long-polling on it are woken and see the error.

Needs DELETE on each topic (and DESCRIBE when named by id): TOPIC_AUTHORIZATION_FAILED.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, TypeAlias
from uuid import UUID

from kio.schema.delete_topics.v6 import request as v6
from kio.schema.errors import ErrorCode

from ..codec import NO_THROTTLE, Request, build, build_response, response_schema
from ..context import HandlerContext
from ..contract import Response
from ..errors import EXPECTED, error_code, error_message
from ..security.acls import Operation, ResourceType
from ..security.authorizer import authorize
from ..slicing import sliced

if TYPE_CHECKING:
    from kio.schema.delete_topics.v1 import request as v1
    from kio.schema.delete_topics.v2 import request as v2
    from kio.schema.delete_topics.v3 import request as v3
    from kio.schema.delete_topics.v4 import request as v4
    from kio.schema.delete_topics.v5 import request as v5

    # The request body at each version served: kio generates one class per version.
    DeleteTopicsRequest: TypeAlias = (
        v1.DeleteTopicsRequest | v2.DeleteTopicsRequest | v3.DeleteTopicsRequest
        | v4.DeleteTopicsRequest | v5.DeleteTopicsRequest | v6.DeleteTopicsRequest
    )

API_KEY = 20
VERSIONS = (1, 6)
_NO_ID = UUID(int=0)


async def handle(broker: HandlerContext, request: Request[DeleteTopicsRequest]) -> Response:
    schema = response_schema(API_KEY, request.version)
    body = request.body
    wanted: list[tuple[str | None, UUID | None]]
    if isinstance(body, v6.DeleteTopicsRequest):  # v6 names topics by name or id
        wanted = [(t.name, t.topic_id) for t in body.topics]
    else:
        wanted = [(name, None) for name in body.topic_names]
    results = []
    async for name, topic_id in sliced(wanted):
        by_id = name is None
        try:
            if name is None:
                topic = broker.engine.topic_by_id(topic_id) if topic_id is not None else None
                if topic is None:
                    results.append(_result(schema, None, topic_id, ErrorCode.unknown_topic_id,
                                           f"no topic with id {topic_id}"))
                    continue
                name = topic.name
            if by_id:
                authorize(broker, request, Operation.DESCRIBE, ResourceType.TOPIC, name,
                          "Authorization failed.")
            authorize(broker, request, Operation.DELETE, ResourceType.TOPIC, name,
                      "Authorization failed.")
            topic = await broker.engine.delete_topic(name)
            results.append(_result(schema, name, topic.topic_id, ErrorCode.none, None))
        except EXPECTED as exc:
            results.append(_result(schema, name, topic_id or _NO_ID, error_code(exc),
                                   error_message(exc)))
    return build_response(schema.DeleteTopicsResponse, throttle_time=NO_THROTTLE,
                          responses=tuple(results))


def _result(schema: ModuleType, name: str | None, topic_id: UUID | None, code: ErrorCode,
            message: str | None) -> object:
    return build(schema.DeletableTopicResult, name=name, topic_id=topic_id or _NO_ID,
                 error_code=code, error_message=message)
