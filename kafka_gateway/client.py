"""A small Kafka protocol client on kio, for the CLI and the tests.

It sends one kio request entity at a time and reads the typed response; the
request's API key and version come from the entity's schema.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from typing import Any

from .codec import (
    API_VERSIONS_KEY,
    ChunkWriter,
    entity_reader_for,
    entity_writer_for,
    response_schema,
    skip_tagged_fields,
)

_SIZE = struct.Struct(">i")


class KafkaClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 client_id: str = "kafka-gateway-cli") -> None:
        self._reader = reader
        self._writer = writer
        self._client_id = client_id.encode()
        self._correlation = 0

    @classmethod
    async def connect(cls, host: str, port: int, timeout: float = 10.0,
                      client_id: str = "kafka-gateway-cli") -> KafkaClient:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        return cls(reader, writer, client_id)

    async def request(self, body: Any) -> Any:
        api_key = int(type(body).__api_key__)
        frame = await self.request_frame(body)
        schema = response_schema(api_key, int(type(body).__version__))
        response_cls = next(
            obj for name, obj in vars(schema).items()
            if name.endswith("Response") and isinstance(obj, type)
            and getattr(obj, "__api_key__", None) == api_key
            and obj.__name__ == type(body).__name__.replace("Request", "Response")
        )
        pos = 4
        if response_cls.__flexible__ and api_key != API_VERSIONS_KEY:
            pos = skip_tagged_fields(frame, pos)
        value, _ = entity_reader_for(response_cls)(frame, pos)
        return value

    async def request_frame(self, body: Any) -> bytes:
        """Send a request; the response frame, unread (correlation id first).

        For the few answers kio's reader refuses although Kafka sends them
        (a -1 timestamp in DescribeTransactions)."""
        cls = type(body)
        api_key, version = int(cls.__api_key__), int(cls.__version__)
        self._correlation += 1
        out = ChunkWriter()
        out.write(struct.pack(">hhih", api_key, version, self._correlation, len(self._client_id)))
        out.write(self._client_id)
        if cls.__flexible__:
            out.write(b"\x00")
        entity_writer_for(cls)(out, body)
        self._writer.write(_SIZE.pack(out.size) + b"".join(out.chunks))
        await self._writer.drain()
        (size,) = _SIZE.unpack(await self._reader.readexactly(4))
        frame = await self._reader.readexactly(size)
        (correlation,) = struct.unpack_from(">i", frame, 0)
        if correlation != self._correlation:
            raise RuntimeError(f"correlation id {correlation} != {self._correlation}")
        return frame

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()
