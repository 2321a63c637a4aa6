"""A gateway in this process, on a free loopback port, with one client.

    serve(tmp_path, scenario)   # scenario(client, server) runs, then both stop
    async with running(tmp_path, listeners=...) as server: ...
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from kafka_gateway.client import KafkaClient
from kafka_gateway.server import GatewayServer
from kafka_gateway.settings import GatewayConfig

Scenario = Callable[[KafkaClient, GatewayServer], Awaitable[None]]


def serve(tmp_path: Path, scenario: Scenario, **settings: Any) -> None:
    """Run ``scenario`` against a fresh gateway (``settings``: GatewayConfig fields)."""

    async def main() -> None:
        config = dataclasses.replace(GatewayConfig(), listen=("127.0.0.1", 0),
                                     data_dir=str(tmp_path / "data"), **settings)
        server = GatewayServer(config)
        await server.start()
        try:
            client = await KafkaClient.connect(*server.config.listen)
            try:
                await scenario(client, server)
            finally:
                await client.close()
        finally:
            await server.stop()

    asyncio.run(main())


@contextlib.asynccontextmanager
async def running(tmp_path: Path, **settings: Any) -> AsyncIterator[GatewayServer]:
    """A fresh gateway in this process for the ``async with`` block (``settings``:
    GatewayConfig fields); its listeners' bound ports are in ``server.listeners``."""
    config = dataclasses.replace(GatewayConfig(), listen=("127.0.0.1", 0),
                                 data_dir=str(tmp_path / "data"), **settings)
    server = GatewayServer(config)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def port_of(server: GatewayServer, name: str) -> int:
    """The bound port of the listener called ``name``."""
    return next(listener.port for listener in server.listeners if listener.name == name)
