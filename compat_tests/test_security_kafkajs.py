"""kafkajs 2.2.4 through secured listeners: SASL PLAIN, SCRAM-SHA-256 and
SCRAM-SHA-512 with and without TLS, server TLS and mTLS; a wrong password, an
unknown user and an untrusted client certificate refused (js/secure.js)."""

from __future__ import annotations

import json
import uuid

import pytest
from security_helpers import COMBINATIONS, PASSWORDS, start_secure_gateway
from test_kafkajs import run_js

IDS = [f"{listener}-{mechanism or 'cert'}" for listener, mechanism in COMBINATIONS]


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    secure = start_secure_gateway(tmp_path_factory.mktemp("secure-js"))
    try:
        yield secure
    finally:
        secure.gateway.stop()


class _Bootstrap:
    """What run_js needs of a gateway, for one listener."""

    def __init__(self, secure, listener: str) -> None:
        self.bootstrap = secure.bootstrap(listener)
        self.output = secure.gateway.output


def _settings(secure, listener: str, mechanism: str | None, expect: str = "ok",
              password: str = PASSWORDS["alice"], user: str = "alice",
              cert: str | None = None) -> str:
    ssl = None
    if "SSL" in listener or listener == "MTLS":
        ssl = {"ca": str(secure.pki.ca)}
        if listener == "MTLS":
            cert = cert or str(secure.client_pem)
            ssl.update(cert=cert, key=cert)
    sasl = {"mechanism": mechanism.lower(), "username": user,
            "password": password} if mechanism else None
    return json.dumps({"ssl": ssl, "sasl": sasl, "expect": expect})


@pytest.mark.parametrize(("listener", "mechanism"), COMBINATIONS, ids=IDS)
def test_kafkajs(secure, listener, mechanism):
    topic = f"sec-js-{uuid.uuid4().hex[:8]}"
    result = run_js(_Bootstrap(secure, listener), "secure.js", topic,
                    _settings(secure, listener, mechanism))
    assert result["received"] == ["one", "two", "three"]
    assert result["brokers"] == [secure.bootstrap(listener)]  # this listener advertised


def test_kafkajs_refused(secure):
    for listener, mechanism, kwargs in [
        ("SASL_SSL", "SCRAM-SHA-256", {"password": "wrong"}),
        ("SASL_PLAINTEXT", "PLAIN", {"user": "nobody"}),
        ("MTLS", None, {"cert": str(secure.rogue_pem)}),
        ("MTLS", None, {"cert": str(secure.expired_pem)}),
    ]:
        result = run_js(_Bootstrap(secure, listener), "secure.js", "unused",
                        _settings(secure, listener, mechanism, expect="refused", **kwargs))
        assert result["refused"], (listener, mechanism, kwargs)
        if mechanism:
            assert "SASL" in result["error"]["name"] or "SASL" in result["error"]["message"], \
                result
