"""CreateAcls (key 30), v1-3: add ACL bindings, all accepted ones in one store write.

Needs ALTER on the cluster (CLUSTER_AUTHORIZATION_FAILED for each);
without an authorizer, SECURITY_DISABLED for each. A binding Kafka refuses
(an UNKNOWN or ANY field, the cluster under another name than
``kafka-cluster``, an empty name, an operation the resource type does not
have, a principal not ``Type:name``) gets INVALID_REQUEST and the others
are still created. Creating one that exists changes nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

from kio.schema.errors import ErrorCode

from ..codec import NO_THROTTLE, Request, build, build_response, response_schema
from ..context import HandlerContext
from ..contract import Response
from ..errors import KafkaError
from ..security.acls import (
    AclBinding,
    InvalidAcl,
    Operation,
    from_wire,
)
from ..security.authorizer import acl_authorizer
from ..slicing import sliced

if TYPE_CHECKING:
    from kio.schema.create_acls.v1 import request as v1
    from kio.schema.create_acls.v2 import request as v2
    from kio.schema.create_acls.v3 import request as v3

    # The request body at each version served: kio generates one class per version.
    CreateAclsRequest: TypeAlias = (
        v1.CreateAclsRequest | v2.CreateAclsRequest | v3.CreateAclsRequest
    )

    AclCreation: TypeAlias = v1.AclCreation | v2.AclCreation | v3.AclCreation

API_KEY = 30
VERSIONS = (1, 3)


def _binding(item: AclCreation) -> AclBinding:
    return from_wire(AclBinding, item.resource_type, item.resource_name,
                     item.resource_pattern_type, item.principal, item.host, item.operation,
                     item.permission_type)


async def handle(broker: HandlerContext, request: Request[CreateAclsRequest]) -> Response:
    schema = response_schema(API_KEY, request.version)
    creations: tuple[AclCreation, ...] = request.body.creations
    results: list[tuple[ErrorCode, str | None]] = []
    valid: list[AclBinding] = []
    refused: KafkaError | None = None
    try:
        authorizer = acl_authorizer(broker, request, Operation.ALTER,
                                    "No Authorizer is configured.")
    except KafkaError as exc:
        refused = exc
    async for item in sliced(creations):
        if refused is not None:
            results.append((refused.code, refused.message))
        else:
            try:
                valid.append(_binding(item))
                results.append((ErrorCode.none, None))
            except InvalidAcl as exc:
                results.append((ErrorCode.invalid_request, str(exc)))
    if valid:
        await authorizer.create(valid)
    return build_response(schema.CreateAclsResponse, throttle_time=NO_THROTTLE, results=tuple([
        build(schema.AclCreationResult, error_code=code, error_message=message)
        async for code, message in sliced(results)]))
