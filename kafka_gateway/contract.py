"""The handlers' contract: ``async def handle(broker, request) -> Response``.

Every module of ``apis/`` declares ``API_KEY``, ``VERSIONS`` and a ``handle``
of type ``Handler``: the handlers' shared context (``HandlerContext``) and the
decoded request (its kio body in ``request.body``), answering with the kio
response entity, a body the handler encoded itself (``EncodedBody``: Fetch,
Produce v0-2) or None (no answer: Produce with acks=0).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeAlias

from kio.static.protocol import ResponsePayload

from .codec import EncodedBody, Request
from .context import HandlerContext

Response: TypeAlias = ResponsePayload | EncodedBody | None
Handler: TypeAlias = Callable[[HandlerContext, Request], Awaitable[Response]]
