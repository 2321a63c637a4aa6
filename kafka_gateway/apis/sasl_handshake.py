"""SaslHandshake (key 17), v0-1: the SASL mechanism a client will authenticate with.

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
    from kio.schema.sasl_handshake.v0 import request as v0
    from kio.schema.sasl_handshake.v1 import request as v1

    # The request body at each version served: kio generates one class per version.
    SaslHandshakeRequest: TypeAlias = v0.SaslHandshakeRequest | v1.SaslHandshakeRequest

API_KEY = 17
VERSIONS = (0, 1)


async def handle(broker: HandlerContext, request: Request[SaslHandshakeRequest]) -> Response:
    schema = response_schema(API_KEY, request.version)
    return build_response(schema.SaslHandshakeResponse, error_code=ErrorCode.illegal_sasl_state,
                          mechanisms=())
