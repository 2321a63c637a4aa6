"""Heartbeat (key 12), v0-4: keeps a member's session alive.

Answers REBALANCE_IN_PROGRESS while the group prepares a rebalance (the
member's cue to rejoin), ILLEGAL_GENERATION for an old generation,
UNKNOWN_MEMBER_ID for a member the group does not have (e.g. after its
session expired or the gateway restarted), FENCED_INSTANCE_ID when another
process took over its group.instance.id.

Needs READ on the group (GROUP_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

from ..codec import NO_THROTTLE, Request, build_response, response_schema
from ..context import HandlerContext
from ..contract import Response
from ..errors import code_of
from ..routing import authorize_coordinated
from ..security.acls import Operation, ResourceType

if TYPE_CHECKING:
    from kio.schema.heartbeat.v0 import request as v0
    from kio.schema.heartbeat.v1 import request as v1
    from kio.schema.heartbeat.v2 import request as v2
    from kio.schema.heartbeat.v3 import request as v3
    from kio.schema.heartbeat.v4 import request as v4

    # The request body at each version served: kio generates one class per version.
    HeartbeatRequest: TypeAlias = (
        v0.HeartbeatRequest | v1.HeartbeatRequest | v2.HeartbeatRequest | v3.HeartbeatRequest
        | v4.HeartbeatRequest
    )

API_KEY = 12
VERSIONS = (0, 4)


async def handle(broker: HandlerContext, request: Request[HeartbeatRequest]) -> Response:
    body = request.body
    code = code_of(authorize_coordinated, broker, request, Operation.READ, ResourceType.GROUP,
                   body.group_id)
    if not code:
        code = broker.groups.heartbeat(body.group_id, body.generation_id, body.member_id,
                                       getattr(body, "group_instance_id", None))
    schema = response_schema(API_KEY, request.version)
    return build_response(schema.HeartbeatResponse, throttle_time=NO_THROTTLE, error_code=code)
