"""The Java client (kafka-clients 3.4.1) through secured listeners, configured
with a client properties file as users write it: SASL PLAIN, SCRAM-SHA-256
and SCRAM-SHA-512 with and without TLS (PEM truststore), server TLS, mTLS
(PEM keystore); a wrong password, an unknown user and an untrusted client
certificate refused with the exceptions Kafka's clients raise
(jvm/src/security/SecurityCheck.java)."""

from __future__ import annotations

import json
import subprocess
import uuid

import pytest
from security_helpers import COMBINATIONS, PASSWORDS, start_secure_gateway

from testkit import jvm

IDS = [f"{listener}-{mechanism or 'cert'}" for listener, mechanism in COMBINATIONS]
LOGIN = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
         "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
         "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule"}


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    secure = start_secure_gateway(tmp_path_factory.mktemp("secure-java"))
    try:
        yield secure
    finally:
        secure.gateway.stop()


def java_properties(secure, listener: str, mechanism: str | None, user: str = "alice",
                    password: str | None = None, keystore: str | None = None) -> str:
    protocol = "SSL" if listener == "MTLS" else listener
    lines = [f"security.protocol={protocol}"]
    if mechanism:
        secret = PASSWORDS.get(user, "x") if password is None else password
        lines += [f"sasl.mechanism={mechanism}",
                  f'sasl.jaas.config={LOGIN[mechanism]} required username="{user}" '
                  f'password="{secret}";']
    if "SSL" in protocol:
        lines += ["ssl.truststore.type=PEM", f"ssl.truststore.location={secure.pki.ca}"]
    if listener == "MTLS":
        lines += ["ssl.keystore.type=PEM",
                  f"ssl.keystore.location={keystore or secure.client_pem}"]
    return "\n".join(lines) + "\n"


def run(secure, tmp_path, command: str, listener: str, properties: str,
        *args: str) -> dict:
    props = tmp_path / f"client-{uuid.uuid4().hex[:6]}.properties"
    props.write_text(properties)
    line = jvm.java_command("security.SecurityCheck", command, "--bootstrap",
                            secure.bootstrap(listener), "--props", str(props), *args,
                            classes=jvm.compile_java())
    done = subprocess.run(line, capture_output=True, text=True, timeout=180,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, (f"exit {done.returncode}:\n{done.stderr[-5000:]}\n"
                                  f"gateway:\n{secure.gateway.output()[-2000:]}")
    [result] = [json.loads(x) for x in done.stdout.splitlines() if x.strip()]
    return result


@pytest.mark.parametrize(("listener", "mechanism"), COMBINATIONS, ids=IDS)
def test_java_client(secure, tmp_path, listener, mechanism):
    topic = f"sec-java-{uuid.uuid4().hex[:8]}"
    result = run(secure, tmp_path, "roundtrip", listener,
                 java_properties(secure, listener, mechanism), "--topic", topic)
    assert result["values"] == ["one", "two", "three"]
    assert result["brokers"] == [secure.bootstrap(listener)]


def test_java_client_refused(secure, tmp_path):
    for listener, mechanism, kwargs, error in [
        ("SASL_SSL", "SCRAM-SHA-512", {"password": "wrong"}, "SaslAuthenticationException"),
        ("SASL_PLAINTEXT", "PLAIN", {"user": "nobody"}, "SaslAuthenticationException"),
        ("MTLS", None, {"keystore": str(secure.rogue_pem)}, None),
    ]:
        result = run(secure, tmp_path, "refused", listener,
                     java_properties(secure, listener, mechanism, **kwargs))
        assert result["refused"], result
        if error:
            assert result["error"] == error, result
