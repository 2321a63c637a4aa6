"""JoinGroup (key 11), v0-9: a member joins (or rejoins) a group and waits
for the generation to form.

- v4+ without a member id: answered at once with MEMBER_ID_REQUIRED and a new
  id, which the client sends back (KIP-394). Older versions join directly.
- A group.instance.id (v5+) makes a static member: a restart within its
  session timeout takes the old slot and assignment without a rebalance.
- The group picks the protocol (assignor) every member supports that most
  members prefer; the leader gets every member's metadata for it and sends
  the assignment in SyncGroup.
- A new group's first generation waits ``group.initial.rebalance.delay.ms``
  for more members; later rebalances wait until every member has rejoined or
  the rebalance timeout (v0: the session timeout) has passed.
- Session timeouts outside group.min/max.session.timeout.ms get
  INVALID_SESSION_TIMEOUT; protocols the group cannot share,
  INCONSISTENT_GROUP_PROTOCOL.

Needs READ on the group (GROUP_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, TypeAlias

from kio.schema.errors import ErrorCode
from kio.schema.join_group.v0 import request as v0

from ..codec import NO_THROTTLE, Request, build, build_response, response_schema
from ..context import HandlerContext
from ..contract import Response
from ..errors import code_of
from ..groups import JoinRequest
from ..routing import authorize_coordinated
from ..security.acls import Operation, ResourceType

if TYPE_CHECKING:
    from kio.schema.join_group.v1 import request as v1
    from kio.schema.join_group.v2 import request as v2
    from kio.schema.join_group.v3 import request as v3
    from kio.schema.join_group.v4 import request as v4
    from kio.schema.join_group.v5 import request as v5
    from kio.schema.join_group.v6 import request as v6
    from kio.schema.join_group.v7 import request as v7
    from kio.schema.join_group.v8 import request as v8
    from kio.schema.join_group.v9 import request as v9

    # The request body at each version served: kio generates one class per version.
    JoinGroupRequest: TypeAlias = (
        v0.JoinGroupRequest | v1.JoinGroupRequest | v2.JoinGroupRequest | v3.JoinGroupRequest
        | v4.JoinGroupRequest | v5.JoinGroupRequest | v6.JoinGroupRequest | v7.JoinGroupRequest
        | v8.JoinGroupRequest | v9.JoinGroupRequest
    )

API_KEY = 11
VERSIONS = (0, 9)

_MS = datetime.timedelta(milliseconds=1)


async def handle(broker: HandlerContext, request: Request[JoinGroupRequest]) -> Response:
    body = request.body
    version = request.version
    if code := code_of(authorize_coordinated, broker, request, Operation.READ, ResourceType.GROUP,
                       body.group_id):
        schema = response_schema(API_KEY, version)
        return build_response(schema.JoinGroupResponse, throttle_time=NO_THROTTLE, error_code=code,
                              generation_id=-1, protocol_type=None,
                              protocol_name=None if version >= 7 else "", leader="",
                              skip_assignment=False, member_id="", members=())
    session_timeout_ms = body.session_timeout // _MS
    result = await broker.groups.join_group(JoinRequest(
        group_id=body.group_id,
        member_id=body.member_id,
        group_instance_id=getattr(body, "group_instance_id", None),
        client_id=request.header.client_id or "",
        client_host=request.client_host,
        protocol_type=body.protocol_type,
        protocols=[(p.name, bytes(p.metadata)) for p in body.protocols],  # not views of the frame
        session_timeout_ms=session_timeout_ms,
        rebalance_timeout_ms=(session_timeout_ms if isinstance(body, v0.JoinGroupRequest)
                              else body.rebalance_timeout // _MS),  # v0 has none
        require_known_member_id=version >= 4,
        reason=getattr(body, "reason", None),
    ))
    schema = response_schema(API_KEY, version)
    protocol_name = result.protocol_name
    if protocol_name is None and version < 7:
        protocol_name = ""  # nullable only from v7
    return build_response(
        schema.JoinGroupResponse,
        throttle_time=NO_THROTTLE,
        error_code=result.error,
        generation_id=result.generation_id,
        protocol_type=result.protocol_type if result.error is ErrorCode.none else None,
        protocol_name=protocol_name,
        leader=result.leader_id,
        skip_assignment=result.skip_assignment,
        member_id=result.member_id,
        members=tuple(
            build(schema.JoinGroupResponseMember, member_id=m.member_id,
                  group_instance_id=m.group_instance_id, metadata=m.metadata)
            for m in result.members
        ),
    )
