"""The handlers' contract: ``async def handle(broker, request) -> Response``.

Every module of ``apis/`` declares ``API_KEY``, ``VERSIONS`` and a ``handle``
of type ``Handler[Body]``: the handlers' shared context (``HandlerContext``)
and the decoded request, ``Request[Body]``, whose ``body`` is typed. ``Body``
is named in the module: the union of kio's request classes for the versions
it serves (kio generates one dataclass per version,
``kio.schema.<api>.v<N>.request``), so mypy checks every field a handler
reads against every version it serves; or, for an API that reads its
requests by hand (Produce, the hot path), the class its ``Decoder`` returns.
The registry (``apis.Api``) ties a handler to its decoder through ``Body``,
and tests/test_contract.py checks that each union holds exactly the classes
kio decodes for the module's ``VERSIONS``.

A handler answers with the kio response entity, a body it encoded itself
(``EncodedBody``: Fetch, Produce v0-2) or None (no answer: Produce with acks=0).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeAlias, TypeVar

from kio.static.protocol import ResponsePayload

from .codec import EncodedBody, Request
from .context import HandlerContext

Body = TypeVar("Body")

Response: TypeAlias = ResponsePayload | EncodedBody | None
Handler: TypeAlias = Callable[[HandlerContext, Request[Body]], Awaitable[Response]]
# (frame, body position, version, max array items) -> the request body, for an
# API that reads its own requests (a measured hot path); the others go through kio.
Decoder: TypeAlias = Callable[[bytes | memoryview, int, int, int], Body]
