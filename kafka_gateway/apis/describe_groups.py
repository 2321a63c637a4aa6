"""DescribeGroups (key 15), v0-5: state, protocol and members of groups.

While a group is Stable each member comes with its subscription metadata
and assignment for the chosen protocol, and protocol_data names that
protocol (the assignor); in other states members are listed without them,
as Kafka does. A group only known by its committed offsets is Empty; an
unknown group is Dead (error NONE, like Kafka). v5's authorized operations
are every group operation: the gateway has no ACLs.

Needs DESCRIBE on each group (GROUP_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

from kio.schema.errors import ErrorCode

from ..codec import NO_THROTTLE, Request, build, build_response, response_schema
from ..context import HandlerContext
from ..contract import Response
from ..errors import code_of
from ..routing import authorize_coordinated
from ..security.acls import Operation, ResourceType
from ..slicing import sliced

if TYPE_CHECKING:
    from kio.schema.describe_groups.v0 import request as v0
    from kio.schema.describe_groups.v1 import request as v1
    from kio.schema.describe_groups.v2 import request as v2
    from kio.schema.describe_groups.v3 import request as v3
    from kio.schema.describe_groups.v4 import request as v4
    from kio.schema.describe_groups.v5 import request as v5

    # The request body at each version served: kio generates one class per version.
    DescribeGroupsRequest: TypeAlias = (
        v0.DescribeGroupsRequest | v1.DescribeGroupsRequest | v2.DescribeGroupsRequest
        | v3.DescribeGroupsRequest | v4.DescribeGroupsRequest | v5.DescribeGroupsRequest
    )

API_KEY = 15
VERSIONS = (0, 5)

# READ (3), DELETE (6), DESCRIBE (8): every operation on a group, as a bit set.
_ALL_GROUP_OPERATIONS = (1 << 3) | (1 << 6) | (1 << 8)
_NOT_REQUESTED = -(2**31)


async def handle(broker: HandlerContext, request: Request[DescribeGroupsRequest]) -> Response:
    schema = response_schema(API_KEY, request.version)
    body = request.body
    operations = (_ALL_GROUP_OPERATIONS if getattr(body, "include_authorized_operations", False)
                  else _NOT_REQUESTED)
    groups = []
    async for group_id in sliced(body.groups):
        if code := code_of(authorize_coordinated, broker, request, Operation.DESCRIBE,
                           ResourceType.GROUP, group_id):
            groups.append(build(schema.DescribedGroup, error_code=code, group_id=group_id,
                                group_state="", protocol_type="", protocol_data="",
                                authorized_operations=_NOT_REQUESTED, members=()))
            continue
        described = broker.groups.describe(group_id)
        groups.append(build(
            schema.DescribedGroup,
            error_code=ErrorCode.none,
            group_id=group_id,
            group_state=described.state,
            protocol_type=described.protocol_type,
            protocol_data=described.protocol_data,
            authorized_operations=operations,
            members=tuple(
                build(schema.DescribedGroupMember, member_id=m.member_id,
                      group_instance_id=m.group_instance_id, client_id=m.client_id,
                      client_host=m.client_host, member_metadata=m.metadata,
                      member_assignment=m.assignment)
                for m in described.members
            ),
        ))
    return build_response(schema.DescribeGroupsResponse, throttle_time=NO_THROTTLE,
                          groups=tuple(groups))
