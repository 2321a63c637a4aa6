"""The Java client (kafka-clients 3.4.1) through secured listeners, configured
with a client properties file as users write it: SASL PLAIN, SCRAM-SHA-256
and SCRAM-SHA-512 with and without TLS (PEM truststore), server TLS, mTLS
(PEM keystore); a wrong password, an unknown user and an untrusted client
certificate refused with the exceptions Kafka's clients raise
(jvm/src/security/SecurityCheck.java)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from security_helpers import COMBINATIONS, PASSWORDS, start_secure_gateway

from testkit import jvm

ROOT = Path(__file__).resolve().parent.parent
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


def _kafka_tool(main_class: str, *args: str) -> subprocess.CompletedProcess[str]:
    """One of Kafka 3.4.1's own command-line tools (kafka-configs.sh, kafka-acls.sh)."""
    return subprocess.run(jvm.java_command(main_class, *args), capture_output=True, text=True,
                          timeout=180, stdin=subprocess.DEVNULL)


def test_kafka_configs_and_kafka_acls(tmp_path):
    """kafka-configs.sh adds a SCRAM user and kafka-acls.sh manages ACLs on the gateway."""
    import asyncio

    from kafka_gateway.client import ClientSecurity, KafkaClient
    from testkit.gateway import GatewayProcess

    data = tmp_path / "data"
    done = subprocess.run(
        [sys.executable, "-m", "kafka_gateway", "users", "--data-dir", str(data), "add",
         "admin", "--password", "admin-secret"], cwd=ROOT, capture_output=True, text=True,
        timeout=60)
    assert done.returncode == 0, done.stderr
    admin = tmp_path / "admin.properties"
    admin.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-256\n"
                     "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule"
                     ' required username="admin" password="admin-secret";\n')
    with GatewayProcess(data, "--listeners", "SASL_PLAINTEXT://127.0.0.1:0",
                        "--authorizer-class-name", "kafka.security.authorizer.AclAuthorizer",
                        "--super-users", "User:admin") as gw:
        connect = ["--bootstrap-server", gw.bootstrap_of("SASL_PLAINTEXT"),
                   "--command-config", str(admin)]
        configs = _kafka_tool("kafka.admin.ConfigCommand", *connect, "--alter", "--add-config",
                              "SCRAM-SHA-256=[iterations=8192,password=carol-secret]",
                              "--entity-type", "users", "--entity-name", "carol")
        assert configs.returncode == 0, configs.stdout + configs.stderr
        # (kafka-configs --describe of users also asks for client quotas, which the
        # gateway does not have: the login below is the check.)

        async def login() -> None:
            client = await KafkaClient.connect(
                "127.0.0.1", gw.listener_ports["SASL_PLAINTEXT"], security=ClientSecurity(
                    mechanism="SCRAM-SHA-256", username="carol", password="carol-secret"))
            await client.close()

        asyncio.run(login())
        added = _kafka_tool("kafka.admin.AclCommand", *connect, "--add", "--allow-principal",
                            "User:carol", "--operation", "Read", "--topic", "orders",
                            "--group", "app")
        assert added.returncode == 0, added.stdout + added.stderr
        listed = _kafka_tool("kafka.admin.AclCommand", *connect, "--list", "--topic", "orders")
        assert "principal=User:carol, host=*, operation=READ, permissionType=ALLOW" in \
            listed.stdout, listed.stdout
        removed = _kafka_tool("kafka.admin.AclCommand", *connect, "--remove", "--force",
                              "--allow-principal", "User:carol", "--operation", "Read",
                              "--topic", "orders")
        assert removed.returncode == 0, removed.stdout + removed.stderr
        listed = _kafka_tool("kafka.admin.AclCommand", *connect, "--list", "--topic", "orders")
        assert "User:carol" not in listed.stdout, listed.stdout
