"""FindCoordinator (key 10), v0-4: this node coordinates every group and
every transactional id (one node; the scale path places them by hash).

v0 asks for a group; v1-3 add the key type (0 group, 1 transaction); v4
batches keys and answers one coordinator per key. An unknown key type gets
INVALID_REQUEST. A group id containing NUL (which the offset store cannot
key) gets INVALID_GROUP_ID.

Needs DESCRIBE on the group or transactional id (GROUP_ or
TRANSACTIONAL_ID_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v4 import request as v4

from ..codec import NO_THROTTLE, Request, build, build_response, response_schema
from ..context import HandlerContext
from ..contract import Response
from ..errors import InvalidGroupId, InvalidRequest, code_of
from ..security.acls import Operation, ResourceType
from ..security.authorizer import authorize

if TYPE_CHECKING:
    from kio.schema.find_coordinator.v0 import request as v0
    from kio.schema.find_coordinator.v1 import request as v1
    from kio.schema.find_coordinator.v2 import request as v2
    from kio.schema.find_coordinator.v3 import request as v3

    # The request body at each version served: kio generates one class per version.
    FindCoordinatorRequest: TypeAlias = (
        v0.FindCoordinatorRequest | v1.FindCoordinatorRequest | v2.FindCoordinatorRequest
        | v3.FindCoordinatorRequest | v4.FindCoordinatorRequest
    )

API_KEY = 10
VERSIONS = (0, 4)

GROUP_KEY = 0
TRANSACTION_KEY = 1


def _check(broker: HandlerContext, request: Request[object], key_type: int, key: str) -> None:
    if key_type not in (GROUP_KEY, TRANSACTION_KEY):
        raise InvalidRequest()
    rtype = ResourceType.GROUP if key_type == GROUP_KEY else ResourceType.TRANSACTIONAL_ID
    authorize(broker, request, Operation.DESCRIBE, rtype, key)
    if key_type == GROUP_KEY and "\x00" in key:
        raise InvalidGroupId()


def _error_for(broker: HandlerContext, request: Request[object], key_type: int,
               key: str) -> ErrorCode:
    return code_of(_check, broker, request, key_type, key)


async def handle(broker: HandlerContext, request: Request[FindCoordinatorRequest]) -> Response:
    schema = response_schema(API_KEY, request.version)
    body = request.body
    key_type = getattr(body, "key_type", GROUP_KEY)
    host, port = broker.advertised(request)
    node = broker.node_id

    # As Kafka: a success says "NONE" (v1-3) or "" (v4, per key).
    success = "" if request.version >= 4 else "NONE"

    def answer(code: ErrorCode) -> dict[str, Any]:
        """A key's answer: the coordinator (this node), or the error."""
        ok = code is ErrorCode.none
        return {"throttle_time": NO_THROTTLE, "error_code": code,
                "error_message": success if ok else code.name.upper(),
                "node_id": node if ok else -1, "host": host if ok else "",
                "port": port if ok else -1}

    if isinstance(body, v4.FindCoordinatorRequest):  # v4: a batch of keys
        return build_response(
            schema.FindCoordinatorResponse, throttle_time=NO_THROTTLE, coordinators=tuple(
                build(schema.Coordinator, key=key,
                      **answer(_error_for(broker, request, key_type, key)))
                for key in body.coordinator_keys))
    return build_response(schema.FindCoordinatorResponse,
                          **answer(_error_for(broker, request, key_type, body.key)))
