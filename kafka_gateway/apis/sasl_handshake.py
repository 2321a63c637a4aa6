"""SaslHandshake (key 17), v0-1: the SASL mechanism a client will authenticate with.

On a SASL listener, before authentication, the connection's SASL gate
answers it (security/sasl.py). Here arrive only the ones that come too late
or to the wrong place: after authentication, or on a listener without SASL;
as Kafka, they get ILLEGAL_SASL_STATE.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from ..codec import Request, build, response_schema
from ..context import HandlerContext
from ..contract import Response

API_KEY = 17
VERSIONS = (0, 1)


async def handle(broker: HandlerContext, request: Request) -> Response:
    schema = response_schema(API_KEY, request.version)
    return build(schema.SaslHandshakeResponse, error_code=ErrorCode.illegal_sasl_state,
                 mechanisms=())
