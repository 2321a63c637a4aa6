"""Requests at every advertised version, for the over-the-wire version tests."""

from __future__ import annotations

import datetime

from kafka_gateway.apis import APIS
from kafka_gateway.codec import build, request_schema


def ms(value: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=value)


class Versions:
    """Builds requests of one API at one version from every field any version has.

    Step ``n`` uses each API at ``min(lowest + n, highest)``; ``lowest`` is the
    advertised minimum unless ``floors`` raises it (versions kio cannot encode).
    """

    def __init__(self, step: int, floors: dict[int, int] | None = None) -> None:
        self.step = step
        self.floors = floors or {}

    def version(self, api_key: int) -> int:
        api = APIS[api_key]
        low = max(api.min_version, self.floors.get(api_key, api.min_version))
        return min(low + self.step, api.max_version)

    def make(self, api_key: int, entity: str, /, **fields):
        return build(getattr(request_schema(api_key, self.version(api_key)), entity), **fields)
