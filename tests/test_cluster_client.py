"""kafka_gateway/cluster_client.py's routing rules, on fake brokers (the CLI
against real gateways: compat_tests/test_pg_cli.py, test_cli.py): the
coordinator looked up again after it moved, a bounded number of times; a
refusal that is not a move ends at once; the leader followed; a listing
asks every broker, keeping each one's failure; one broker is the bootstrap
whatever it advertises; every connection closed."""

from __future__ import annotations

import argparse
import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from kafka_gateway import cluster_client
from kafka_gateway.cli import common
from kafka_gateway.cluster_client import GROUP, ClusterClient, RoutingError

Address = tuple[str, int]


class FakeBroker:
    """A connection to one broker: Metadata and FindCoordinator from the
    cluster's current view, every other request answered by ``answers``."""

    def __init__(self, cluster: FakeCluster, address: Address) -> None:
        self.cluster = cluster
        self.address = address
        self.closed = False
        self.asked: list[str] = []

    async def request(self, body: Any) -> Any:
        kind = type(body).__name__
        self.asked.append(kind)
        if kind == "MetadataRequest":
            return self.cluster.metadata()
        if kind == "FindCoordinatorRequest":
            node, code = self.cluster.coordinators.pop(0)
            host, port = self.cluster.brokers[node]
            return SimpleNamespace(coordinators=[SimpleNamespace(
                node_id=node, host=host, port=port, error_code=code, error_message=None)])
        return self.cluster.answer(self.address)

    async def close(self) -> None:
        self.closed = True


class FakeCluster:
    def __init__(self, brokers: dict[int, Address]) -> None:
        self.brokers = brokers
        self.coordinators: list[tuple[int, ErrorCode]] = []  # FindCoordinator's answers
        self.leaders: list[int] = []  # partition 0's leader per Metadata (the last stays)
        self.codes: dict[Address, list[ErrorCode]] = {}  # answers, per broker
        self.unreachable: set[Address] = set()
        self.connections: list[FakeBroker] = []

    def metadata(self) -> Any:
        leader = self.leaders.pop(0) if len(self.leaders) > 1 else (
            self.leaders[0] if self.leaders else -1)
        return SimpleNamespace(
            brokers=[SimpleNamespace(node_id=n, host=h, port=p)
                     for n, (h, p) in self.brokers.items()],
            topics=[SimpleNamespace(name="t", error_code=ErrorCode.none, partitions=[
                SimpleNamespace(partition_index=0, leader_id=leader)])])

    def answer(self, address: Address) -> Any:
        codes = self.codes[address]
        return SimpleNamespace(error_code=codes.pop(0) if len(codes) > 1 else codes[0],
                               address=address)

    async def connect(self, host: str, port: int) -> Any:
        if (host, port) in self.unreachable:
            raise ConnectionRefusedError(f"{host}:{port}")
        broker = FakeBroker(self, (host, port))
        self.connections.append(broker)
        return broker

    def client(self, bootstrap: Address) -> ClusterClient:
        first = FakeBroker(self, bootstrap)
        self.connections.append(first)
        return ClusterClient(first, bootstrap, self.connect)


THREE = {1: ("gw1", 9092), 2: ("gw2", 9092), 3: ("gw3", 9092)}


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster_client, "BACKOFF_S", 0.0)


def send(broker: Any) -> Any:
    return broker.request(SimpleNamespace())


def code_of(answer: Any) -> ErrorCode:
    return answer.error_code


def test_a_moved_coordinator_is_looked_up_again() -> None:
    cluster = FakeCluster(THREE)
    cluster.coordinators = [(2, ErrorCode.none), (3, ErrorCode.none)]
    cluster.codes = {THREE[2]: [ErrorCode.not_coordinator], THREE[3]: [ErrorCode.none]}

    async def body() -> None:
        client = cluster.client(THREE[1])
        answer = await client.to_coordinator("describe g", "g", GROUP, send, code_of)
        assert answer.address == THREE[3] and answer.error_code is ErrorCode.none
        assert client.bootstrap.asked.count("FindCoordinatorRequest") == 2
        await client.close()

    asyncio.run(body())
    assert all(broker.closed for broker in cluster.connections)
    assert len(cluster.connections) == 3  # the bootstrap, gw2, gw3


def test_retries_are_bounded_and_end_with_the_last_error() -> None:
    cluster = FakeCluster(THREE)
    cluster.coordinators = [(2, ErrorCode.none)] * cluster_client.ATTEMPTS
    cluster.codes = {THREE[2]: [ErrorCode.coordinator_load_in_progress]}

    async def body() -> None:
        client = cluster.client(THREE[1])
        with pytest.raises(RoutingError) as failed:
            await client.to_coordinator("describe g", "g", GROUP, send, code_of)
        assert failed.value.code is ErrorCode.coordinator_load_in_progress
        assert str(failed.value) == "describe g: COORDINATOR_LOAD_IN_PROGRESS"
        await client.close()

    asyncio.run(body())
    assert cluster.coordinators == []  # looked up exactly ATTEMPTS times


def test_a_refusal_that_is_not_a_move_ends_at_once() -> None:
    cluster = FakeCluster(THREE)
    cluster.coordinators = [(2, ErrorCode.group_authorization_failed), (2, ErrorCode.none)]

    async def body() -> None:
        client = cluster.client(THREE[1])
        with pytest.raises(RoutingError) as failed:
            await client.to_coordinator("describe g", "g", GROUP, send, code_of)
        assert failed.value.code is ErrorCode.group_authorization_failed
        await client.close()

    asyncio.run(body())
    assert len(cluster.coordinators) == 1


def test_an_unreachable_coordinator_is_looked_up_again() -> None:
    cluster = FakeCluster(THREE)
    cluster.unreachable = {THREE[2]}
    cluster.coordinators = [(2, ErrorCode.none), (3, ErrorCode.none)]
    cluster.codes = {THREE[3]: [ErrorCode.none]}

    async def body() -> None:
        client = cluster.client(THREE[1])
        answer = await client.to_coordinator("describe g", "g", GROUP, send, code_of)
        assert answer.address == THREE[3]
        await client.close()

    asyncio.run(body())


def test_the_leader_is_followed_when_it_moves() -> None:
    cluster = FakeCluster(THREE)
    cluster.leaders = [2, -1, 3]  # gw2, then none for a while, then gw3
    cluster.codes = {THREE[2]: [ErrorCode.not_leader_or_follower], THREE[3]: [ErrorCode.none]}

    async def body() -> None:
        client = cluster.client(THREE[1])
        answer = await client.to_leader("producers t-0", "t", 0, send, code_of)
        assert answer.address == THREE[3]
        await client.close()

    asyncio.run(body())


def test_a_listing_asks_every_broker_and_keeps_each_failure() -> None:
    cluster = FakeCluster(THREE)
    cluster.unreachable = {THREE[3]}
    cluster.codes = {THREE[1]: [ErrorCode.none], THREE[2]: [ErrorCode.none]}

    async def body() -> list[tuple[int, Address, Any]]:
        client = cluster.client(THREE[1])
        try:
            return await client.to_every_broker(send)
        finally:
            await client.close()

    answers = asyncio.run(body())
    assert [(node, getattr(a, "address", None)) for node, _, a in answers] == [
        (1, THREE[1]), (2, THREE[2]), (3, None)]
    assert isinstance(answers[2][2], ConnectionRefusedError)
    # The bootstrap served node 1: its advertised address is the one connected to.
    assert len(cluster.connections) == 2 and all(b.closed for b in cluster.connections)


def test_one_broker_is_the_bootstrap_whatever_it_advertises() -> None:
    cluster = FakeCluster({0: ("gateway.internal", 9092)})
    cluster.unreachable = {("gateway.internal", 9092)}
    cluster.coordinators = [(0, ErrorCode.none)]
    cluster.leaders = [0]
    cluster.codes = {("127.0.0.1", 9092): [ErrorCode.none]}

    async def body() -> None:
        client = cluster.client(("127.0.0.1", 9092))
        assert (await client.to_coordinator("d", "g", GROUP, send, code_of)).address == (
            "127.0.0.1", 9092)
        assert (await client.to_leader("p", "t", 0, send, code_of)).address == (
            "127.0.0.1", 9092)
        [(node, _, answer)] = await client.to_every_broker(send)
        assert node == 0 and answer.address == ("127.0.0.1", 9092)
        await client.close()

    asyncio.run(body())
    assert len(cluster.connections) == 1 and cluster.connections[0].closed


def test_the_cli_reaches_every_broker_with_the_bootstrap_settings(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """``kafka_gateway/cli/common.py``'s ``connect``: the other brokers are
    opened with the same client id and security (SASL here) as the bootstrap."""
    opened: list[tuple[str, int, dict[str, Any]]] = []

    async def fake_connect(host: str, port: int, **kwargs: Any) -> Any:
        opened.append((host, port, kwargs))
        return FakeBroker(FakeCluster(THREE), (host, port))

    monkeypatch.setattr(common.KafkaClient, "connect", fake_connect)
    config = tmp_path / "client.properties"
    config.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-512\n"
                      "sasl.username=admin\nsasl.password=secret\nclient.id=ops\n")
    args = argparse.Namespace(bootstrap_server=[("127.0.0.1", 9092)],
                              command_config=str(config))

    async def body() -> None:
        client = await common.connect(args)
        await client.client_of(THREE[2])
        await client.close()

    asyncio.run(body())
    assert [(host, port) for host, port, _ in opened] == [("127.0.0.1", 9092), THREE[2]]
    first, second = opened[0][2], opened[1][2]
    assert first == second and first["client_id"] == "ops"
    assert first["security"].mechanism == "SCRAM-SHA-512"
    assert first["security"].username == "admin"
