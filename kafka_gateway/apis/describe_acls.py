"""DescribeAcls (key 29), v1-3: the ACL bindings a filter matches, by resource pattern.

Needs DESCRIBE on the cluster (CLUSTER_AUTHORIZATION_FAILED); without an
authorizer, SECURITY_DISABLED; an UNKNOWN in the filter, INVALID_REQUEST.
The filter's semantics (ANY, MATCH) are Kafka's: security/acls.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import groupby
from typing import TYPE_CHECKING, Protocol, TypeAlias

from kio.schema.errors import ErrorCode
from kio.static.protocol import ResponsePayload

from ..codec import NO_THROTTLE, Request, build, build_response, response_schema
from ..context import HandlerContext
from ..contract import Response
from ..errors import KafkaError
from ..security.acls import (
    AclFilter,
    InvalidAcl,
    Operation,
    from_wire,
)
from ..security.authorizer import acl_authorizer
from ..slicing import sliced

if TYPE_CHECKING:
    from kio.schema.describe_acls.v1 import request as v1
    from kio.schema.describe_acls.v2 import request as v2
    from kio.schema.describe_acls.v3 import request as v3

    # The request body at each version served: kio generates one class per version.
    DescribeAclsRequest: TypeAlias = (
        v1.DescribeAclsRequest | v2.DescribeAclsRequest | v3.DescribeAclsRequest
    )

API_KEY = 29
VERSIONS = (1, 3)


class WireAclFilter(Protocol):
    """A filter's fields, as DescribeAcls and DeleteAcls requests name them."""

    @property
    def resource_type_filter(self) -> int: ...

    @property
    def resource_name_filter(self) -> str | None: ...

    @property
    def pattern_type_filter(self) -> int: ...

    @property
    def principal_filter(self) -> str | None: ...

    @property
    def host_filter(self) -> str | None: ...

    @property
    def operation(self) -> int: ...

    @property
    def permission_type(self) -> int: ...


def acl_filter(item: WireAclFilter) -> AclFilter:
    """A filter from a DescribeAcls request or a DeleteAcls filter entry."""
    return from_wire(AclFilter, item.resource_type_filter, item.resource_name_filter,
                     item.pattern_type_filter, item.principal_filter, item.host_filter,
                     item.operation, item.permission_type)


async def handle(broker: HandlerContext, request: Request[DescribeAclsRequest]) -> Response:
    schema = response_schema(API_KEY, request.version)

    def response(code: ErrorCode, message: str | None,
                 resources: Iterable[object] = ()) -> ResponsePayload:
        return build_response(schema.DescribeAclsResponse, throttle_time=NO_THROTTLE,
                              error_code=code, error_message=message, resources=tuple(resources))

    try:
        authorizer = acl_authorizer(broker, request, Operation.DESCRIBE,
                                    "No Authorizer is configured on the broker")
        wanted = acl_filter(request.body)
    except KafkaError as exc:
        return response(exc.code, exc.message)
    except InvalidAcl as exc:
        return response(ErrorCode.invalid_request, str(exc))
    found = await authorizer.describe(wanted)
    return response(ErrorCode.none, None, [
        build(schema.DescribeAclsResource, resource_type=rtype, resource_name=name,
              pattern_type=pattern, acls=tuple(
                  build(schema.AclDescription, principal=b.principal, host=b.host,
                        operation=b.operation, permission_type=b.permission)
                  for b in bindings))
        async for (rtype, pattern, name), bindings in sliced(groupby(
            found, key=lambda b: (b.resource_type, b.pattern_type, b.name)))])
