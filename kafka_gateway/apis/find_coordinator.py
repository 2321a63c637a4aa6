"""FindCoordinator (key 10), v0-4: the node coordinating a group or a
transactional id. A node alone coordinates every key; in a cluster of
gateways over PostgreSQL, the leader of the key's slot (Kafka's placement
by hash, ``pgstore.leadership``), or COORDINATOR_NOT_AVAILABLE while the
slot has no live leader (clients retry).

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
from ..errors import CoordinatorNotAvailable, InvalidGroupId, InvalidRequest, code_of
from ..routing import brokers, coordinator
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
    if coordinator(broker, key) is None:
        raise CoordinatorNotAvailable()


def _error_for(broker: HandlerContext, request: Request[object], key_type: int,
               key: str) -> ErrorCode:
    return code_of(_check, broker, request, key_type, key)


async def handle(broker: HandlerContext, request: Request[FindCoordinatorRequest]) -> Response:
    schema = response_schema(API_KEY, request.version)
    body = request.body
    key_type = getattr(body, "key_type", GROUP_KEY)
    live = {b.node_id: b for b in brokers(broker, request)}

    # As Kafka: a success says "NONE" (v1-3) or "" (v4, per key).
    success = "" if request.version >= 4 else "NONE"

    def answer(key: str) -> dict[str, Any]:
        """A key's answer: its coordinator, or the error."""
        code = _error_for(broker, request, key_type, key)
        node = coordinator(broker, key) if code is ErrorCode.none else None
        if code is ErrorCode.none and node not in live:  # not live as this gateway last read
            code = ErrorCode.coordinator_not_available
        if code is not ErrorCode.none or node is None:
            return {"throttle_time": NO_THROTTLE, "error_code": code,
                    "error_message": code.name.upper(), "node_id": -1, "host": "", "port": -1}
        found = live[node]
        return {"throttle_time": NO_THROTTLE, "error_code": code, "error_message": success,
                "node_id": node, "host": found.host, "port": found.port}

    if isinstance(body, v4.FindCoordinatorRequest):  # v4: a batch of keys
        return build_response(
            schema.FindCoordinatorResponse, throttle_time=NO_THROTTLE, coordinators=tuple(
                build(schema.Coordinator, key=key, **answer(key))
                for key in body.coordinator_keys))
    return build_response(schema.FindCoordinatorResponse,
                          **answer(body.key))
