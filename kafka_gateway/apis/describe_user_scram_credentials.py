"""DescribeUserScramCredentials (key 50), v0: each user's SCRAM mechanisms and iterations.

Never the keys. Null or no users: every user with a credential, sorted. A
named user without credentials gets RESOURCE_NOT_FOUND, an empty name too,
a name asked twice DUPLICATE_RESOURCE (as Kafka). Needs DESCRIBE on the
cluster (CLUSTER_AUTHORIZATION_FAILED).
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
from ..security.acls import Operation
from ..security.authorizer import authorize_cluster
from ..security.scram import MECHANISMS, ScramCredential

if TYPE_CHECKING:
    from kio.schema.describe_user_scram_credentials.v0 import request as v0

    # The request body at each version served: kio generates one class per version.
    DescribeUserScramCredentialsRequest: TypeAlias = v0.DescribeUserScramCredentialsRequest

API_KEY = 50
VERSIONS = (0, 0)


async def handle(broker: HandlerContext,
                 request: Request[DescribeUserScramCredentialsRequest]) -> Response:
    schema = response_schema(API_KEY, request.version)

    def response(code: ErrorCode, results: list[object]) -> ResponsePayload:
        return build_response(schema.DescribeUserScramCredentialsResponse,
                              throttle_time=NO_THROTTLE, error_code=code, error_message=None,
                              results=tuple(results))

    def result(user: str, code: ErrorCode = ErrorCode.none, message: str | None = None,
               credentials: Iterable[ScramCredential] = ()) -> Any:
        return build(schema.DescribeUserScramCredentialsResult, user=user, error_code=code,
                     error_message=message, credential_infos=tuple(
                         build(schema.CredentialInfo, mechanism=MECHANISMS[c.mechanism][1],
                               iterations=c.iterations) for c in credentials))

    try:
        authorize_cluster(broker, request, Operation.DESCRIBE)
    except KafkaError as exc:
        return response(exc.code, [])
    users = broker.credentials.users()
    wanted = [u.name for u in request.body.users or ()]
    if not wanted:
        return response(ErrorCode.none, [result(user, credentials=creds)
                                         for user, creds in sorted(users.items())])
    out = []
    for name in dict.fromkeys(wanted):  # each once, in request order
        if not name:
            out.append(result(name, ErrorCode.resource_not_found, "Username must not be empty"))
        elif wanted.count(name) > 1:
            out.append(result(name, ErrorCode.duplicate_resource,
                              "Cannot describe SCRAM credentials for the same user twice in a "
                              "single request"))
        elif name not in users:
            out.append(result(name, ErrorCode.resource_not_found,
                              f"Attempt to describe a user credential that does not exist: "
                              f"{name}"))
        else:
            out.append(result(name, credentials=users[name]))
    return response(ErrorCode.none, out)
