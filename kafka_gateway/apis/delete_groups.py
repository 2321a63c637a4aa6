"""DeleteGroups (key 42), v0-2: delete groups and their committed offsets.

Only a group without members can go (NON_EMPTY_GROUP otherwise); a group
that is neither known nor has offsets is GROUP_ID_NOT_FOUND. The offsets are
deleted in one write (a range of the store's keys).

Needs DELETE on each group (GROUP_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

from kio.schema.errors import ErrorCode

from ..answers import answer_each
from ..codec import NO_THROTTLE, Request, build, build_response, response_schema
from ..context import HandlerContext
from ..contract import Response
from ..errors import error_code
from ..routing import authorize_coordinated
from ..security.acls import Operation, ResourceType

if TYPE_CHECKING:
    from kio.schema.delete_groups.v0 import request as v0
    from kio.schema.delete_groups.v1 import request as v1
    from kio.schema.delete_groups.v2 import request as v2

    # The request body at each version served: kio generates one class per version.
    DeleteGroupsRequest: TypeAlias = (
        v0.DeleteGroupsRequest | v1.DeleteGroupsRequest | v2.DeleteGroupsRequest
    )

API_KEY = 42
VERSIONS = (0, 2)


async def handle(broker: HandlerContext, request: Request[DeleteGroupsRequest]) -> Response:
    schema = response_schema(API_KEY, request.version)

    def answer(group_id: str, code: ErrorCode) -> object:
        return build(schema.DeletableGroupResult, group_id=group_id, error_code=code)

    async def delete(group_id: str) -> object:
        authorize_coordinated(broker, request, Operation.DELETE, ResourceType.GROUP, group_id)
        return answer(group_id, await broker.group_offsets.delete_group(group_id))

    results = await answer_each(request.body.groups_names, delete,
                                lambda group_id, exc: answer(group_id, error_code(exc)))
    return build_response(schema.DeleteGroupsResponse, throttle_time=NO_THROTTLE,
                          results=tuple(results))
