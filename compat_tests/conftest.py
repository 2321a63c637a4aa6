"""Fixtures shared by the real-client tests: a gateway subprocess per module."""

from __future__ import annotations

import uuid

import pytest

from kafka_gateway.testing import GatewayProcess


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    """A gateway on a free port with a fresh data dir, shared by one test module."""
    data_dir = tmp_path_factory.mktemp("gateway") / "data"
    with GatewayProcess(data_dir, "--log-retention-check-interval-ms", "500") as gw:
        yield gw


@pytest.fixture
def topic_name():
    """A unique topic name per test, so tests sharing a gateway stay apart."""
    return f"t-{uuid.uuid4().hex[:12]}"
