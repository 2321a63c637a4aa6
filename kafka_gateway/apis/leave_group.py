"""LeaveGroup (key 13), v0-5: members leave, and the group rebalances at once
(no wait for a session timeout).

v0-2 name one member; v3+ a batch of (member id, group.instance.id), where a
static member may be named by instance id alone, each with its own error.

Needs READ on the group (GROUP_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from ..codec import NO_THROTTLE, Request, build, response_schema
from ..context import HandlerContext
from ..contract import Response
from ..errors import code_of
from ..security.acls import Operation, ResourceType
from ..security.authorizer import authorize

API_KEY = 13
VERSIONS = (0, 5)


async def handle(broker: HandlerContext, request: Request) -> Response:
    schema = response_schema(API_KEY, request.version)
    body = request.body
    if code := code_of(authorize, broker, request, Operation.READ, ResourceType.GROUP,
                       body.group_id):
        return build(schema.LeaveGroupResponse, throttle_time=NO_THROTTLE, error_code=code,
                     members=())
    if request.version < 3:
        _, (code,) = broker.groups.leave_group(body.group_id, [(body.member_id, None)])
        return build(schema.LeaveGroupResponse, throttle_time=NO_THROTTLE, error_code=code)
    leaving = [(m.member_id, m.group_instance_id) for m in body.members]
    group_code, codes = broker.groups.leave_group(body.group_id, leaving)
    return build(
        schema.LeaveGroupResponse, throttle_time=NO_THROTTLE, error_code=group_code,
        members=tuple(
            build(schema.MemberResponse, member_id=member_id, group_instance_id=instance_id,
                  error_code=code)
            for (member_id, instance_id), code in zip(leaving, codes, strict=True)
        ) if group_code is ErrorCode.none else (),
    )
