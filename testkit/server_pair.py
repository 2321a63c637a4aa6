"""Both servers side by side: each request goes to Apache Kafka and to the gateway.

    async with Pair(kafka_broker, gateway, Differ(EXPECTED)) as pair:
        await pair.create_topic("log/create", "t", partitions=3)
        kafka, gateway = await pair.check("log/fetch", fetch_request)

One raw kio client per server (``member`` opens more, for group members that
block in JoinGroup); ``check`` sends to both at once and compares every field
of the two responses (testkit/differential.py). ``run_pair`` runs a whole
scenario and fails on any difference not expected.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from kio.schema.errors import ErrorCode

from kafka_gateway.client import KafkaClient

from . import kafka_requests as requests
from .differential import CLOSED, Differ, Difference, Expected, Server, plain


class Pair:
    """One raw kio client per server; each request goes to both."""

    def __init__(self, kafka_broker: Any, gateway: Any, differ: Differ,
                 client_id: str = "diff-test") -> None:
        self.servers = {
            "kafka": Server("kafka", 1, kafka_broker.port),
            "gateway": Server("gateway", 0, gateway.port),
        }
        self.differ = differ
        self.client_id = client_id
        self.clients: dict[str, KafkaClient | None] = {"kafka": None, "gateway": None}
        self.members: list[Pair] = []
        # One request at a time per connection, whoever sends it.
        self.locks = {"kafka": asyncio.Lock(), "gateway": asyncio.Lock()}

    def member(self, client_id: str) -> Pair:
        """Another connection to each server, under its own client id (a group
        member blocks its connection while it waits in JoinGroup)."""
        other = Pair.__new__(Pair)
        other.servers, other.differ, other.client_id = self.servers, self.differ, client_id
        other.clients, other.members = {"kafka": None, "gateway": None}, []
        other.locks = {"kafka": asyncio.Lock(), "gateway": asyncio.Lock()}
        self.members.append(other)
        return other

    async def __aenter__(self) -> Pair:
        return self

    async def __aexit__(self, *exc: object) -> None:
        for member in self.members:
            await member.__aexit__()
        for client in self.clients.values():
            if client is not None:
                await client.close()

    async def _client(self, name: str) -> KafkaClient:
        client = self.clients[name]
        if client is None:
            server = self.servers[name]
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", server.port), 10)
            client = self.clients[name] = KafkaClient(reader, writer, self.client_id)
        return client

    async def _one(self, name: str, request: Any, timeout: float) -> Any:
        async with self.locks[name]:
            client = await self._client(name)
            try:
                return await asyncio.wait_for(client.request(request), timeout)
            except (asyncio.IncompleteReadError, ConnectionError):
                await client.close()
                self.clients[name] = None
                return CLOSED

    async def send(self, request: Any, gateway_request: Any = None,
                   timeout: float = 30.0) -> tuple[Any, Any]:
        """The raw responses of both servers (CLOSED if one closed the connection)."""
        return tuple(await asyncio.gather(  # type: ignore[return-value]
            self._one("kafka", request, timeout),
            self._one("gateway", request if gateway_request is None else gateway_request,
                      timeout)))

    def normalise(self, kafka: Any, gateway: Any) -> tuple[Any, Any]:
        return plain(kafka, self.servers["kafka"]), plain(gateway, self.servers["gateway"])

    def compare(self, step: str, kafka: Any, gateway: Any) -> list[Difference]:
        return self.differ.compare(f"{step}:", *self.normalise(kafka, gateway))

    async def check(self, step: str, request: Any, gateway_request: Any = None,
                    timeout: float = 30.0) -> tuple[Any, Any]:
        """Send to both, compare every field; returns the raw responses."""
        kafka, gateway = await self.send(request, gateway_request, timeout)
        self.compare(step, kafka, gateway)
        return kafka, gateway

    async def create_topic(self, step: str, name: str, partitions: int = 1,
                           configs: dict[str, str] | None = None) -> dict[str, Any]:
        """Create a topic on both (compared), then wait until both lead every
        partition: Kafka takes its leadership from the metadata log a moment
        after CreateTopics answers (a client retries NOT_LEADER_OR_FOLLOWER).
        Returns each server's id for the topic."""
        kafka, gateway = await self.check(
            step, requests.create_topics([(name, partitions, 1, configs)]))
        for response in (kafka, gateway):
            assert response.topics[0].error_code.value == 0, response
        await self.wait_ready(name, partitions)
        return {"kafka": kafka.topics[0].topic_id, "gateway": gateway.topics[0].topic_id}

    async def wait_ready(self, name: str, partitions: int, timeout: float = 30.0) -> None:
        probe = requests.list_offsets(name, [(p, -1) for p in range(partitions)])
        await self._until(probe, lambda answers: {
            p.error_code.value for a in answers for p in a.topics[0].partitions} == {0},
            f"{name} ready", timeout)

    async def wait_deleted(self, name: str, timeout: float = 30.0) -> None:
        """After DeleteTopics: the gateway forgets the topic before it answers,
        Kafka's broker a moment after its controller answers (it applies the
        metadata log asynchronously, so a Produce sent at once can still be
        appended there). Assert the first, wait for the second."""
        probe = requests.list_offsets(name, [(0, -1)])
        _kafka, gateway = await self.send(probe)
        assert _unknown(gateway), f"the gateway still knows {name} after deleting it: {gateway}"
        await self._until(probe, lambda answers: _unknown(answers[0]),
                          f"{name} deleted on Kafka", timeout)

    async def _until(self, probe: Any, done: Callable[[tuple[Any, Any]], bool], what: str,
                     timeout: float) -> None:
        """Send ``probe`` to both every 50 ms until ``done(answers)``, at most ``timeout`` s."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            answers = await self.send(probe)
            if done(answers):
                return
            assert asyncio.get_running_loop().time() < deadline, f"not {what}: {answers}"
            await asyncio.sleep(0.05)


def _unknown(list_offsets: Any) -> bool:
    """A ListOffsets answer of one partition says its topic is unknown."""
    return list_offsets.topics[0].partitions[0].error_code is ErrorCode.unknown_topic_or_partition


def unique_name(prefix: str) -> str:
    """A topic or group name no other scenario uses, on either server."""
    return f"diff-{prefix}-{uuid.uuid4().hex[:10]}"


def run_pair(scenario: Callable[[Pair], Awaitable[None]], kafka_broker: Any, gateway: Any,
             expected: Iterable[Expected], timeout: float = 120) -> Differ:
    """``scenario(pair)`` against both servers; fails on a difference not in
    ``expected`` (or an expected one that did not happen)."""
    differ = Differ(expected)

    async def main() -> None:
        async with Pair(kafka_broker, gateway, differ) as pair:
            await scenario(pair)

    asyncio.run(asyncio.wait_for(main(), timeout))
    differ.verify()
    return differ
