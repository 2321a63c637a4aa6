"""LeaveGroup (key 13), v0-5: members leave, and the group rebalances at once
(no wait for a session timeout).

v0-2 name one member; v3+ a batch of (member id, group.instance.id), where a
static member may be named by instance id alone, each with its own error.

Needs READ on the group (GROUP_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

from kio.schema.errors import ErrorCode
from kio.schema.leave_group.v0 import request as v0
from kio.schema.leave_group.v1 import request as v1
from kio.schema.leave_group.v2 import request as v2

from ..codec import NO_THROTTLE, Request, build, build_response, response_schema
from ..context import HandlerContext
from ..contract import Response
from ..errors import code_of
from ..routing import authorize_coordinated
from ..security.acls import Operation, ResourceType

if TYPE_CHECKING:
    from kio.schema.leave_group.v3 import request as v3
    from kio.schema.leave_group.v4 import request as v4
    from kio.schema.leave_group.v5 import request as v5

    # The request body at each version served: kio generates one class per version.
    LeaveGroupRequest: TypeAlias = (
        v0.LeaveGroupRequest | v1.LeaveGroupRequest | v2.LeaveGroupRequest | v3.LeaveGroupRequest
        | v4.LeaveGroupRequest | v5.LeaveGroupRequest
    )

API_KEY = 13
VERSIONS = (0, 5)


async def handle(broker: HandlerContext, request: Request[LeaveGroupRequest]) -> Response:
    schema = response_schema(API_KEY, request.version)
    body = request.body
    if code := code_of(authorize_coordinated, broker, request, Operation.READ, ResourceType.GROUP,
                       body.group_id):
        return build_response(schema.LeaveGroupResponse, throttle_time=NO_THROTTLE, error_code=code,
                              members=())
    if isinstance(body, (v0.LeaveGroupRequest, v1.LeaveGroupRequest, v2.LeaveGroupRequest)):
        # v0-2: one member, by id
        _, (code,) = broker.groups.leave_group(body.group_id, [(body.member_id, None)])
        return build_response(schema.LeaveGroupResponse, throttle_time=NO_THROTTLE, error_code=code)
    leaving = [(m.member_id, m.group_instance_id) for m in body.members]
    group_code, codes = broker.groups.leave_group(body.group_id, leaving)
    return build_response(
        schema.LeaveGroupResponse, throttle_time=NO_THROTTLE, error_code=group_code,
        members=tuple(
            build(schema.MemberResponse, member_id=member_id, group_instance_id=instance_id,
                  error_code=code)
            for (member_id, instance_id), code in zip(leaving, codes, strict=True)
        ) if group_code is ErrorCode.none else (),
    )
