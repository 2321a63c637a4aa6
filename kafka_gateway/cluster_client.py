"""Requests routed over the brokers of a cluster as Kafka's AdminClient routes
them, for the CLI: any gateway of a cluster (docs/cluster.md) is a bootstrap.

- ``request``: what any broker answers (Metadata, topics, ACLs, users) goes
  to the bootstrap connection, as before;
- ``to_coordinator``: a request about a group (key type 0) or transactional
  id (1) goes to the broker FindCoordinator names, asked again after
  NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE or COORDINATOR_LOAD_IN_PROGRESS
  (and after a broker that cannot be reached or does not answer within
  ``REQUEST_TIMEOUT_S``), at most ``ATTEMPTS`` times within ``API_TIMEOUT_S``;
- ``to_leader`` / ``leaders``: a request about a partition goes to its leader
  as Metadata names it, asked again after NOT_LEADER_OR_FOLLOWER or
  LEADER_NOT_AVAILABLE;
- ``to_every_broker``: a listing (ListGroups, ListTransactions) goes to
  every broker Metadata lists, each answer or failure kept apart.

Connections are opened once per broker with the bootstrap's client id and
security (``connect``), and all closed by ``close``. The bootstrap connection
serves the broker whose advertised address it was opened to, and every
broker when Metadata lists only one (a single gateway: it is its own leader
and coordinator, whatever address it advertises).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v4 import request as find_coordinator
from kio.schema.metadata.v12 import request as metadata
from kio.schema.types import TopicName
from kio.static.primitive import i8

from .client import AuthenticationError, KafkaClient

T = TypeVar("T")
Address = tuple[str, int]
Connect = Callable[[str, int], Awaitable[KafkaClient]]

GROUP = 0  # FindCoordinator's key types
TRANSACTION = 1
ATTEMPTS = 12
BACKOFF_S = 0.1  # Kafka's retry.backoff.ms, doubled per attempt up to MAX_BACKOFF_S
MAX_BACKOFF_S = 1.0
REQUEST_TIMEOUT_S = 30.0  # Kafka's request.timeout.ms: one answer of a broker
API_TIMEOUT_S = 60.0  # Kafka's default.api.timeout.ms: a routed request, retries included
COORDINATOR_MOVED = frozenset({ErrorCode.not_coordinator, ErrorCode.coordinator_not_available,
                               ErrorCode.coordinator_load_in_progress})
LEADER_MOVED = frozenset({ErrorCode.not_leader_or_follower, ErrorCode.leader_not_available})


class RoutingError(Exception):
    """No broker could serve a request: ``code`` is the last error seen."""

    def __init__(self, what: str, code: ErrorCode, detail: str | None = None) -> None:
        super().__init__(f"{what}: {code.name.upper()}{': ' + detail if detail else ''}")
        self.code = code


@dataclasses.dataclass
class Leaders:
    """Partitions by where their leader is: ``leaders`` (its address),
    ``leaderless`` (none now: ask again), ``errors`` (an unknown topic or
    partition, or another error of its topic)."""

    single: bool  # Metadata lists one broker: it leads every partition
    leaders: dict[tuple[str, int], Address] = dataclasses.field(default_factory=dict)
    leaderless: set[tuple[str, int]] = dataclasses.field(default_factory=set)
    errors: dict[tuple[str, int], ErrorCode] = dataclasses.field(default_factory=dict)


def _brokers_of(answer: Any) -> dict[int, Address]:
    """A Metadata answer's brokers, by node id."""
    return {int(b.node_id): (b.host, int(b.port)) for b in answer.brokers}


def backoff(attempt: int) -> float:
    """The pause before attempt ``attempt + 1``."""
    return min(BACKOFF_S * 2.0 ** attempt, MAX_BACKOFF_S)


class ClusterClient:
    def __init__(self, bootstrap: KafkaClient, address: Address, connect: Connect) -> None:
        self.bootstrap = bootstrap
        self._bootstrap_address = address
        self._connect = connect
        self._clients: dict[Address, KafkaClient] = {address: bootstrap}

    async def request(self, body: Any) -> Any:
        """A request any broker answers, to the bootstrap."""
        return await self.bootstrap.request(body)

    async def request_frame(self, body: Any) -> bytes:
        return await self.bootstrap.request_frame(body)

    async def metadata(self, topics: Iterable[str] | None = ()) -> Any:
        """Metadata (``topics=()``: only the brokers; None: every topic)."""
        wanted = None if topics is None else tuple(
            metadata.MetadataRequestTopic(topic_id=None, name=TopicName(name)) for name in topics)
        return await self.bootstrap.request(metadata.MetadataRequest(
            topics=wanted, allow_auto_topic_creation=False,
            include_topic_authorized_operations=False))

    async def brokers(self) -> dict[int, Address]:
        """The brokers Metadata lists, by node id."""
        return _brokers_of(await self.metadata(()))

    async def client_of(self, address: Address, single: bool = False) -> KafkaClient:
        """The connection to a broker (``single``: the only broker Metadata
        lists, which is the bootstrap whatever address it advertises)."""
        if single:
            return self.bootstrap
        client = self._clients.get(address)
        if client is None:
            client = await self._connect(*address)
            self._clients[address] = client
        return client

    async def _drop(self, address: Address) -> None:
        """Forget a connection that failed (never the bootstrap's)."""
        if address != self._bootstrap_address:
            client = self._clients.pop(address, None)
            if client is not None:
                await client.close()

    async def _route(self, what: str, find: Callable[[], Awaitable[tuple[Address, bool]]],
                     send: Callable[[KafkaClient], Awaitable[T]],
                     error_of: Callable[[T], ErrorCode], moved: frozenset[ErrorCode]) -> T:
        """``send`` to the broker ``find`` names, found again while the answer
        (or ``find``) says it moved or the broker cannot be reached."""
        last: RoutingError | OSError | None = None
        deadline = asyncio.get_running_loop().time() + API_TIMEOUT_S
        for attempt in range(ATTEMPTS):
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                break
            if attempt:
                await asyncio.sleep(min(backoff(attempt - 1), left))
            try:
                address, single = await find()
            except RoutingError as error:
                if error.code not in moved:
                    raise
                last = error
                continue
            try:
                answer = await asyncio.wait_for(send(await self.client_of(address, single)),
                                                min(REQUEST_TIMEOUT_S, max(left, 1.0)))
            except (OSError, asyncio.IncompleteReadError, TimeoutError) as error:
                last = OSError(f"{address[0]}:{address[1]}: {str(error) or type(error).__name__}")
                await self._drop(address)
                continue
            code = error_of(answer)
            if code not in moved:
                return answer
            last = RoutingError(what, code)
        if isinstance(last, RoutingError):
            raise last
        raise RoutingError(what, ErrorCode.coordinator_not_available
                           if moved is COORDINATOR_MOVED else ErrorCode.leader_not_available,
                           f"no broker answered within {ATTEMPTS} attempts or "
                           f"{API_TIMEOUT_S:.0f} s: {last}")

    async def coordinator(self, what: str, key: str, key_type: int) -> tuple[Address, bool]:
        """The coordinator's address, FindCoordinator through the bootstrap
        (and whether it is the only broker)."""
        brokers = await self.brokers()
        answer = await self.bootstrap.request(find_coordinator.FindCoordinatorRequest(
            key_type=i8(key_type), coordinator_keys=(key,)))
        [found] = answer.coordinators
        if found.error_code is not ErrorCode.none:
            raise RoutingError(what, found.error_code, found.error_message)
        return (found.host, int(found.port)), len(brokers) == 1

    async def to_coordinator(self, what: str, key: str, key_type: int,
                             send: Callable[[KafkaClient], Awaitable[T]],
                             error_of: Callable[[T], ErrorCode]) -> T:
        """``send`` to the coordinator of a group (``GROUP``) or transactional id
        (``TRANSACTION``); ``error_of`` reads the answer's error code."""
        return await self._route(what, lambda: self.coordinator(what, key, key_type),
                                 send, error_of, COORDINATOR_MOVED)

    async def leaders(self, partitions: Iterable[tuple[str, int]]) -> Leaders:
        """Where each partition's leader is, as Metadata names it now."""
        wanted = set(partitions)
        answer = await self.metadata(sorted({topic for topic, _ in wanted}))
        brokers = _brokers_of(answer)
        found = Leaders(single=len(brokers) == 1)
        for topic in answer.topics:
            if topic.error_code is not ErrorCode.none:
                if topic.error_code in LEADER_MOVED:
                    found.leaderless.update(tp for tp in wanted if tp[0] == topic.name)
                else:
                    found.errors.update({tp: topic.error_code for tp in wanted
                                         if tp[0] == topic.name})
                continue
            for part in topic.partitions:
                key = (topic.name, int(part.partition_index))
                if key not in wanted:
                    continue
                if int(part.leader_id) in brokers:
                    found.leaders[key] = brokers[int(part.leader_id)]
                else:
                    found.leaderless.add(key)
        for tp in wanted - found.leaders.keys() - found.leaderless - found.errors.keys():
            found.errors[tp] = ErrorCode.unknown_topic_or_partition
        return found

    async def to_leader(self, what: str, topic: str, partition: int,
                        send: Callable[[KafkaClient], Awaitable[T]],
                        error_of: Callable[[T], ErrorCode]) -> T:
        """``send`` to the partition's leader; ``error_of`` reads the answer's
        error code for the partition."""
        async def find() -> tuple[Address, bool]:
            found = await self.leaders([(topic, partition)])
            if (topic, partition) in found.leaders:
                return found.leaders[(topic, partition)], found.single
            raise RoutingError(what, found.errors.get((topic, partition),
                                                      ErrorCode.leader_not_available))

        return await self._route(what, find, send, error_of, LEADER_MOVED)

    async def to_every_broker(self, send: Callable[[KafkaClient], Awaitable[T]],
                              ) -> list[tuple[int, Address, T | Exception]]:
        """``send`` to every broker Metadata lists, in node id order: each one's
        answer, or the error that kept it from answering."""
        brokers = await self.brokers()
        out: list[tuple[int, Address, T | Exception]] = []
        for node, address in sorted(brokers.items()):
            try:
                out.append((node, address, await asyncio.wait_for(
                    send(await self.client_of(address, len(brokers) == 1)),
                    REQUEST_TIMEOUT_S)))
            except (OSError, asyncio.IncompleteReadError, TimeoutError,
                    AuthenticationError) as error:
                await self._drop(address)
                out.append((node, address, error))
        return out

    async def close(self) -> None:
        """Close every connection, the bootstrap's too."""
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            with contextlib.suppress(OSError):
                await client.close()
