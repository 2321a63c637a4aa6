"""ApiVersions (key 18), v0-3: the APIs and versions this gateway implements.

A request at a version above 3 gets the v0 answer with UNSUPPORTED_VERSION
(and the list), so the client retries at a version both sides know. Optional
tagged fields are left out (kio skips defaults): librdkafka 2.0.2 (Debian's
kcat) cannot parse a reply that carries them.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from ..codec import NO_THROTTLE, Request, build, response_schema
from ..context import HandlerContext
from ..contract import Response

API_KEY = 18
VERSIONS = (0, 3)


def response(version: int, error: ErrorCode = ErrorCode.none):
    from . import APIS  # the registry imports this module

    schema = response_schema(API_KEY, version)
    return build(
        schema.ApiVersionsResponse,
        error_code=error,
        api_keys=tuple(
            schema.ApiVersion(api_key=api.key, min_version=api.min_version,
                              max_version=api.max_version)
            for api in sorted(APIS.values(), key=lambda a: a.key)
        ),
        throttle_time=NO_THROTTLE,
    )


async def handle(broker: HandlerContext, request: Request) -> Response:
    return response(request.version)
