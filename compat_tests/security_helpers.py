"""A gateway with every kind of listener, users and certificates, for the
real-client security tests (test_security_*.py), and each client's settings.

Listeners: PLAINTEXT, SSL (server TLS only), SASL_PLAINTEXT, SASL_SSL, and
MTLS (SSL with client certificates required, set per listener with
``listener.name.mtls.ssl.client.auth``). Users alice and admin have SCRAM-SHA-256
and -512 credentials, made with ``kafka-gateway users add`` over PLAINTEXT.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from testkit.certs import Pki, make_pki
from testkit.gateway import GatewayProcess

ROOT = Path(__file__).resolve().parent.parent
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
SASL_LISTENERS = ("SASL_PLAINTEXT", "SASL_SSL")
PASSWORDS = {"alice": "alice-secret", "admin": "admin-secret"}
# (listener, mechanism or None): every way in that should work.
COMBINATIONS = [(listener, mechanism) for listener in SASL_LISTENERS
                for mechanism in MECHANISMS] + [("SSL", None), ("MTLS", None)]
CLIENT_SUBJECT = "CN=alice,OU=eng,O=Acme,C=US"


@dataclass
class SecureGateway:
    gateway: GatewayProcess
    pki: Pki
    client_pem: Path  # key and certificate of CN=alice, signed by the CA
    expired_pem: Path
    rogue_pem: Path

    def bootstrap(self, listener: str) -> str:
        return self.gateway.bootstrap_of(listener)

    def metrics(self) -> dict[str, float]:
        """The gateway's unlabelled metrics, without the kafka_gateway_ prefix."""
        return {name.removeprefix("kafka_gateway_"): value
                for (name, labels), value in self.gateway.metrics().items() if not labels}


def start_secure_gateway(directory: Path, *extra: str) -> SecureGateway:
    pki = make_pki(directory / "pki")
    properties = directory / "gateway.properties"
    properties.write_text(
        "listeners=PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0,"
        "SASL_SSL://127.0.0.1:0,MTLS://127.0.0.1:0\n"
        "listener.security.protocol.map=MTLS:SSL\n"
        f"ssl.keystore.location={pki.server}\n"
        f"ssl.truststore.location={pki.ca}\n"
        "listener.name.mtls.ssl.client.auth=required\n")
    gateway = GatewayProcess(directory / "data", "--config", str(properties),
                             "--admin-listen", "127.0.0.1:0", *extra).start()
    try:
        for user, password in PASSWORDS.items():
            done = subprocess.run(
                [sys.executable, "-m", "kafka_gateway", "users", "--bootstrap-server",
                 gateway.bootstrap_of("PLAINTEXT"), "add", user, "--password", password],
                cwd=ROOT, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
    except BaseException:
        gateway.stop()
        raise
    return SecureGateway(gateway, pki, pki.client(CLIENT_SUBJECT),
                         pki.client("CN=old", expired=True), pki.rogue_client("CN=mallory"))


def librdkafka_config(secure: SecureGateway, listener: str, mechanism: str | None,
                      user: str = "alice", password: str | None = None) -> dict[str, str]:
    """Settings of confluent-kafka and kcat (librdkafka) for one way in."""
    protocol = "SSL" if listener == "MTLS" else listener
    config = {"bootstrap.servers": secure.bootstrap(listener), "security.protocol": protocol}
    if mechanism:
        config.update({"sasl.mechanism": mechanism, "sasl.username": user,
                       "sasl.password": PASSWORDS.get(user, "x") if password is None
                       else password})
    if "SSL" in protocol:
        config["ssl.ca.location"] = str(secure.pki.ca)
    if listener == "MTLS":
        config["ssl.certificate.location"] = str(secure.client_pem)
        config["ssl.key.location"] = str(secure.client_pem)
    return config
