"""SyncGroup (key 14), v0-5: the leader hands in the assignment; every member
gets its own share.

Members wait until the leader's SyncGroup arrives; once the group is Stable
a SyncGroup answers at once with the member's current assignment (a static
member back from a restart gets its old one). REBALANCE_IN_PROGRESS when a
new rebalance started meanwhile, ILLEGAL_GENERATION for an old generation,
INCONSISTENT_GROUP_PROTOCOL (v5) when the protocol type or name differs or
is missing (both are mandatory from v5, as in Kafka).

Needs READ on the group (GROUP_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

from kio.schema.errors import ErrorCode
from kio.schema.sync_group.v5 import request as v5

from ..codec import NO_THROTTLE, Request, build_response, response_schema
from ..context import HandlerContext
from ..contract import Response
from ..errors import KafkaError
from ..routing import authorize_coordinated
from ..security.acls import Operation, ResourceType

if TYPE_CHECKING:
    from kio.schema.sync_group.v0 import request as v0
    from kio.schema.sync_group.v1 import request as v1
    from kio.schema.sync_group.v2 import request as v2
    from kio.schema.sync_group.v3 import request as v3
    from kio.schema.sync_group.v4 import request as v4

    # The request body at each version served: kio generates one class per version.
    SyncGroupRequest: TypeAlias = (
        v0.SyncGroupRequest | v1.SyncGroupRequest | v2.SyncGroupRequest | v3.SyncGroupRequest
        | v4.SyncGroupRequest | v5.SyncGroupRequest
    )

API_KEY = 14
VERSIONS = (0, 5)


async def handle(broker: HandlerContext, request: Request[SyncGroupRequest]) -> Response:
    body = request.body
    schema = response_schema(API_KEY, request.version)
    try:
        authorize_coordinated(broker, request, Operation.READ, ResourceType.GROUP,
                              body.group_id)
    except KafkaError as exc:
        return build_response(schema.SyncGroupResponse, throttle_time=NO_THROTTLE,
                              error_code=exc.code,
                              protocol_type=None, protocol_name=None, assignment=b"")
    if isinstance(body, v5.SyncGroupRequest) and (body.protocol_type is None
                                                  or body.protocol_name is None):
        # As Kafka: from v5 both are mandatory; the group is not touched.
        return build_response(schema.SyncGroupResponse, throttle_time=NO_THROTTLE,
                              error_code=ErrorCode.inconsistent_group_protocol, protocol_type=None,
                              protocol_name=None, assignment=b"")
    result = await broker.groups.sync_group(
        body.group_id, body.generation_id, body.member_id,
        getattr(body, "group_instance_id", None),
        getattr(body, "protocol_type", None), getattr(body, "protocol_name", None),
        {a.member_id: bytes(a.assignment) for a in body.assignments},  # kept: copy out of the frame
    )
    ok = result.error is ErrorCode.none
    return build_response(
        schema.SyncGroupResponse,
        throttle_time=NO_THROTTLE,
        error_code=result.error,
        protocol_type=result.protocol_type if ok else None,
        protocol_name=result.protocol_name if ok else None,
        assignment=result.assignment,
    )
