"""ApiVersions (key 18), v0-3: the APIs and versions this gateway implements.

A request at a version above 3 gets the v0 answer with UNSUPPORTED_VERSION
(and the list), so the client retries at a version both sides know. Optional
tagged fields are left out (kio skips defaults): librdkafka 2.0.2 (Debian's
kcat) cannot parse a reply that carries them.

The registry (apis/__init__.py) hands this module the table it advertises,
``advertise(APIS.values())``, once it is built: this module does not import
the registry that imports it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol, TypeAlias

from kio.schema.errors import ErrorCode
from kio.static.protocol import ResponsePayload

from ..codec import NO_THROTTLE, Request, build_response, response_schema
from ..context import HandlerContext
from ..contract import Response

if TYPE_CHECKING:
    from kio.schema.api_versions.v0 import request as v0
    from kio.schema.api_versions.v1 import request as v1
    from kio.schema.api_versions.v2 import request as v2
    from kio.schema.api_versions.v3 import request as v3

    # The request body at each version served: kio generates one class per version.
    ApiVersionsRequest: TypeAlias = (
        v0.ApiVersionsRequest | v1.ApiVersionsRequest | v2.ApiVersionsRequest
        | v3.ApiVersionsRequest
    )

API_KEY = 18
VERSIONS = (0, 3)


class Advertised(Protocol):
    # Read-only: the registry's entries are frozen.
    @property
    def key(self) -> int: ...

    @property
    def min_version(self) -> int: ...

    @property
    def max_version(self) -> int: ...


# (api key, min version, max version) of every API served, by key; set by the registry.
_advertised: tuple[tuple[int, int, int], ...] = ()


def advertise(apis: Iterable[Advertised]) -> None:
    global _advertised
    _advertised = tuple(sorted((api.key, api.min_version, api.max_version) for api in apis))


def response(version: int, error: ErrorCode = ErrorCode.none) -> ResponsePayload:
    assert _advertised, "the registry (apis/__init__.py) has not called advertise()"
    schema = response_schema(API_KEY, version)
    return build_response(
        schema.ApiVersionsResponse,
        error_code=error,
        api_keys=tuple(
            schema.ApiVersion(api_key=key, min_version=low, max_version=high)
            for key, low, high in _advertised
        ),
        throttle_time=NO_THROTTLE,
    )


async def handle(broker: HandlerContext, request: Request[ApiVersionsRequest]) -> Response:
    return response(request.version)
