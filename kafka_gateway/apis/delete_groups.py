"""DeleteGroups (key 42), v0-2: delete groups and their committed offsets.

Only a group without members can go (NON_EMPTY_GROUP otherwise); a group
that is neither known nor has offsets is GROUP_ID_NOT_FOUND. The offsets are
deleted in one write (a range of the store's keys).

Needs DELETE on each group (GROUP_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

from ..codec import NO_THROTTLE, build, response_schema
from ..errors import code_of
from ..security.acls import Operation, ResourceType
from ..security.authorizer import authorize

API_KEY = 42
VERSIONS = (0, 2)


async def handle(broker, request):
    schema = response_schema(API_KEY, request.version)
    results = []
    for group_id in request.body.groups_names:
        code = code_of(authorize, broker, request, Operation.DELETE, ResourceType.GROUP,
                       group_id)
        if not code:
            code = await broker.group_offsets.delete_group(group_id)
        results.append(build(schema.DeletableGroupResult, group_id=group_id, error_code=code))
    return build(schema.DeleteGroupsResponse, throttle_time=NO_THROTTLE, results=tuple(results))
