"""DeleteAcls (key 31), v1-3: delete every ACL binding each filter matches.

Each filter's result lists the bindings it deleted; all deletions of the
request are one store write. Needs ALTER on the cluster
(CLUSTER_AUTHORIZATION_FAILED for each filter); without an authorizer,
SECURITY_DISABLED; a filter with an UNKNOWN field, INVALID_REQUEST.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeAlias

from kio.schema.errors import ErrorCode
from kio.static.protocol import ResponsePayload

from ..codec import NO_THROTTLE, Request, build, build_response, response_schema
from ..context import HandlerContext
from ..contract import Response
from ..errors import KafkaError
from ..security.acls import AclBinding, AclFilter, InvalidAcl, Operation
from ..security.authorizer import acl_authorizer
from ..slicing import sliced
from .describe_acls import acl_filter

if TYPE_CHECKING:
    from kio.schema.delete_acls.v1 import request as v1
    from kio.schema.delete_acls.v2 import request as v2
    from kio.schema.delete_acls.v3 import request as v3

    # The request body at each version served: kio generates one class per version.
    DeleteAclsRequest: TypeAlias = (
        v1.DeleteAclsRequest | v2.DeleteAclsRequest | v3.DeleteAclsRequest
    )

    DeleteAclsFilter: TypeAlias = v1.DeleteAclsFilter | v2.DeleteAclsFilter | v3.DeleteAclsFilter

API_KEY = 31
VERSIONS = (1, 3)


async def handle(broker: HandlerContext, request: Request[DeleteAclsRequest]) -> Response:
    schema = response_schema(API_KEY, request.version)

    def result(code: ErrorCode, message: str | None, deleted: Iterable[AclBinding] = ()) -> Any:
        return build(schema.DeleteAclsFilterResult, error_code=code, error_message=message,
                     matching_acls=tuple(
                         build(schema.DeleteAclsMatchingAcl, error_code=ErrorCode.none,
                               error_message=None, resource_type=b.resource_type,
                               resource_name=b.name, pattern_type=b.pattern_type,
                               principal=b.principal, host=b.host, operation=b.operation,
                               permission_type=b.permission) for b in deleted))

    async def response(results: Iterable[object]) -> ResponsePayload:
        return build_response(schema.DeleteAclsResponse, throttle_time=NO_THROTTLE,
                              filter_results=tuple([r async for r in sliced(results)]))

    filters: tuple[DeleteAclsFilter, ...] = request.body.filters
    try:
        authorizer = acl_authorizer(broker, request, Operation.ALTER,
                                    "No Authorizer is configured.")
    except KafkaError as exc:
        return await response(result(exc.code, exc.message) for _ in filters)
    parsed: list[AclFilter | InvalidAcl] = []
    async for item in sliced(filters):
        try:
            parsed.append(acl_filter(item))
        except InvalidAcl as exc:
            parsed.append(exc)
    valid = [f for f in parsed if isinstance(f, AclFilter)]
    deleted = iter(await authorizer.delete(valid))
    return await response(result(ErrorCode.invalid_request, str(f)) if isinstance(f, InvalidAcl)
                    else result(ErrorCode.none, None, next(deleted)) for f in parsed)
