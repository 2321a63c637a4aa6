"""SaslAuthenticate (key 36), v0-2: one SASL token of an authentication.

On a SASL listener, before authentication, the connection's SASL gate
answers it (security/sasl.py). Here arrive only the ones that come too late
or to the wrong place: after authentication, or on a listener without SASL;
as Kafka, they get ILLEGAL_SASL_STATE.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

from kio.schema.errors import ErrorCode

from ..codec import Request, build_response, response_schema
from ..context import HandlerContext
from ..contract import Response

if TYPE_CHECKING:
    from kio.schema.sasl_authenticate.v0 import request as v0
    from kio.schema.sasl_authenticate.v1 import request as v1
    from kio.schema.sasl_authenticate.v2 import request as v2

    # The request body at each version served: kio generates one class per version.
    SaslAuthenticateRequest: TypeAlias = (
        v0.SaslAuthenticateRequest | v1.SaslAuthenticateRequest | v2.SaslAuthenticateRequest
    )

API_KEY = 36
VERSIONS = (0, 2)


async def handle(broker: HandlerContext, request: Request[SaslAuthenticateRequest]) -> Response:
    schema = response_schema(API_KEY, request.version)
    return build_response(schema.SaslAuthenticateResponse, error_code=ErrorCode.illegal_sasl_state,
                          error_message="SaslAuthenticate request received after successful "
                               "authentication or on a listener without SASL",
                          auth_bytes=b"")
