"""ListGroups (key 16), v0-4: every group this coordinator knows.

Groups with members, and groups known only by their committed offsets
(listed as Empty with protocol type "", e.g. after a restart or for
``assign()`` consumers). v4 filters by state names, case-insensitively.
In a cluster of gateways, only the groups this gateway coordinates (as each
Kafka broker lists its own; admin clients ask every broker).

With DESCRIBE on the cluster every group is listed; else only those the
principal may DESCRIBE.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

from kio.schema.errors import ErrorCode

from ..codec import NO_THROTTLE, Request, build, build_response, response_schema
from ..context import HandlerContext
from ..contract import Response
from ..routing import coordinates
from ..security.acls import Operation, ResourceType
from ..security.authorizer import allowed, cluster_allowed

if TYPE_CHECKING:
    from kio.schema.list_groups.v0 import request as v0
    from kio.schema.list_groups.v1 import request as v1
    from kio.schema.list_groups.v2 import request as v2
    from kio.schema.list_groups.v3 import request as v3
    from kio.schema.list_groups.v4 import request as v4

    # The request body at each version served: kio generates one class per version.
    ListGroupsRequest: TypeAlias = (
        v0.ListGroupsRequest | v1.ListGroupsRequest | v2.ListGroupsRequest | v3.ListGroupsRequest
        | v4.ListGroupsRequest
    )

API_KEY = 16
VERSIONS = (0, 4)


async def handle(broker: HandlerContext, request: Request[ListGroupsRequest]) -> Response:
    schema = response_schema(API_KEY, request.version)
    states = getattr(request.body, "states_filter", ())
    everything = cluster_allowed(broker, request, Operation.DESCRIBE)
    return build_response(
        schema.ListGroupsResponse,
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        groups=tuple(
            build(schema.ListedGroup, group_id=group_id, protocol_type=protocol_type,
                  group_state=state)
            for group_id, protocol_type, state in broker.groups.list_groups(states)
            if coordinates(broker, group_id)
            and (everything or allowed(broker, request, Operation.DESCRIBE, ResourceType.GROUP,
                                       group_id))
        ),
    )
