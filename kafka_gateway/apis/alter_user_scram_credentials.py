"""AlterUserScramCredentials (key 51), v0: set and delete users' SCRAM credentials.

An upsertion carries what the client derived: salt, iterations and the
salted password; the stored and server keys are derived from it here, and
that is all that is kept. Per user, all or nothing, as Kafka: an empty name
or iterations outside 4096-16384 are UNACCEPTABLE_CREDENTIAL, an unknown
mechanism UNSUPPORTED_SASL_MECHANISM, one credential named twice
DUPLICATE_RESOURCE, deleting a missing one RESOURCE_NOT_FOUND. Every
accepted change of the request is one store write. Needs ALTER on the
cluster (CLUSTER_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, TypeAlias

from kio.schema.errors import ErrorCode
from kio.static.protocol import ResponsePayload

from ..codec import NO_THROTTLE, Request, build, build_response, response_schema
from ..context import HandlerContext
from ..contract import Response
from ..errors import code_of
from ..security.acls import Operation
from ..security.authorizer import authorize_cluster
from ..security.scram import BY_CODE, MAX_ITERATIONS, MIN_ITERATIONS, from_salted_password

if TYPE_CHECKING:
    from kio.schema.alter_user_scram_credentials.v0 import request as v0

    # The request body at each version served: kio generates one class per version.
    AlterUserScramCredentialsRequest: TypeAlias = v0.AlterUserScramCredentialsRequest

API_KEY = 51
VERSIONS = (0, 0)


def _problem(name: str, mechanism: int, iterations: int | None) -> tuple[ErrorCode, str] | None:
    if not name:
        return ErrorCode.unacceptable_credential, "Username must not be empty"
    if mechanism not in BY_CODE:
        return ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism"
    if iterations is not None and iterations < MIN_ITERATIONS:
        return ErrorCode.unacceptable_credential, "Too few iterations"
    if iterations is not None and iterations > MAX_ITERATIONS:
        return ErrorCode.unacceptable_credential, "Too many iterations"
    return None


async def handle(broker: HandlerContext,
                 request: Request[AlterUserScramCredentialsRequest]) -> Response:
    schema = response_schema(API_KEY, request.version)
    body = request.body
    users = list(dict.fromkeys([d.name for d in body.deletions]
                               + [u.name for u in body.upsertions]))

    def response(errors: dict[str, tuple[ErrorCode, str | None]]) -> ResponsePayload:
        return build_response(
            schema.AlterUserScramCredentialsResponse, throttle_time=NO_THROTTLE,
            results=tuple(build(schema.AlterUserScramCredentialsResult, user=user,
                                error_code=errors.get(user, (ErrorCode.none, None))[0],
                                error_message=errors.get(user, (None, None))[1])
                          for user in users))

    if denied := code_of(authorize_cluster, broker, request, Operation.ALTER):
        return response({user: (denied, None) for user in users})
    errors: dict[str, tuple[ErrorCode, str | None]] = {}
    items: tuple[v0.ScramCredentialDeletion | v0.ScramCredentialUpsertion, ...] = (
        *body.deletions, *body.upsertions)
    for item in items:
        problem = _problem(item.name, item.mechanism, getattr(item, "iterations", None))
        if problem and item.name not in errors:
            errors[item.name] = problem
    named = Counter((item.name, item.mechanism) for item in items)
    for (user, _mechanism), count in named.items():
        if count > 1 and user not in errors:
            errors[user] = (ErrorCode.duplicate_resource,
                            "A user credential cannot be altered twice in the same request")
    credentials = broker.credentials
    for deletion in body.deletions:
        if deletion.name not in errors and credentials.get(
                deletion.name, BY_CODE[deletion.mechanism]) is None:
            errors[deletion.name] = (ErrorCode.resource_not_found,
                                     "Attempt to delete a user credential that does not exist")
    upserts = [(u.name, from_salted_password(BY_CODE[u.mechanism], bytes(u.salt),
                                             bytes(u.salted_password), u.iterations))
               for u in body.upsertions if u.name not in errors]
    deletions = [(d.name, BY_CODE[d.mechanism]) for d in body.deletions if d.name not in errors]
    if upserts or deletions:
        await credentials.change(upserts, deletions)
    return response(errors)
