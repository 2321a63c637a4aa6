"""``kafka-gateway users`` and ``kafka-gateway acls`` against a gateway subprocess
with a SASL listener and the ACL authorizer: the first user made offline
(``--data-dir``), the rest over the wire with ``--command-config``."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from kio.schema.metadata.v12 import request as metadata

from kafka_gateway.client import ClientSecurity, KafkaClient
from testkit.gateway import GatewayProcess

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kafka_gateway", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, input=stdin)


def ok(*args: str, stdin: str | None = None) -> str:
    done = cli(*args, stdin=stdin)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_users_and_acls(tmp_path):
    data = tmp_path / "data"
    # Offline, before the first start: the administrator (password on stdin).
    assert "Set SCRAM-SHA-256, SCRAM-SHA-512 credentials of admin" in ok(
        "users", "--data-dir", str(data), "add", "admin", stdin="admin-secret\n")
    assert "admin\tSCRAM-SHA-256 (iterations 4096), SCRAM-SHA-512 (iterations 4096)" in ok(
        "users", "--data-dir", str(data), "list")
    config = tmp_path / "admin.properties"
    config.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-512\n"
                      "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule "
                      'required username="admin" password="admin-secret";\n')
    with GatewayProcess(data, "--listeners", "SASL_PLAINTEXT://127.0.0.1:0",
                        "--authorizer-class-name", "acl", "--super-users", "User:admin") as gw:
        conn = ["--bootstrap-server", gw.bootstrap_of("SASL_PLAINTEXT"),
                "--command-config", str(config)]
        assert "Set SCRAM-SHA-256 credentials of alice" in ok(
            "users", *conn, "add", "alice", "--password", "alice-secret",
            "--mechanism", "SCRAM-SHA-256", "--iterations", "8192")
        listed = ok("users", *conn, "list")
        assert "alice\tSCRAM-SHA-256 (iterations 8192)" in listed and "admin\t" in listed
        assert "Added 2 ACL(s)." in ok("acls", *conn, "add", "--allow-principal", "User:alice",
                                      "--operation", "Read", "--operation", "Describe",
                                      "--topic", "orders-", "--resource-pattern-type",
                                      "prefixed")
        listing = ok("acls", *conn, "list", "--topic", "orders-")
        assert "patternType=PREFIXED" in listing
        assert "(principal=User:alice, host=*, operation=READ, permissionType=ALLOW)" in listing
        assert "Removed 1 ACL(s)." in ok("acls", *conn, "remove", "--allow-principal",
                                        "User:alice", "--operation", "Read",
                                        "--topic", "orders-", "--resource-pattern-type",
                                        "prefixed")
        assert "operation=READ" not in ok("acls", *conn, "list")

        async def as_alice() -> None:
            client = await KafkaClient.connect(*gw.bootstrap_of("SASL_PLAINTEXT").split(":"),
                                               security=ClientSecurity(
                                                   mechanism="SCRAM-SHA-256", username="alice",
                                                   password="alice-secret"))
            await client.request(metadata.MetadataRequest(
                topics=None, allow_auto_topic_creation=False,
                include_topic_authorized_operations=False))
            await client.close()

        asyncio.run(as_alice())
        # alice may not administer: the CLI says why.
        alice = tmp_path / "alice.properties"
        alice.write_text(config.read_text().replace("admin", "alice").replace(
            "SCRAM-SHA-512", "SCRAM-SHA-256"))
        refused = cli("acls", "--bootstrap-server", gw.bootstrap_of("SASL_PLAINTEXT"),
                      "--command-config", str(alice), "list")
        assert refused.returncode != 0 and "CLUSTER_AUTHORIZATION_FAILED" in refused.stderr
        assert "Deleted SCRAM-SHA-256 credentials of alice" in ok("users", *conn, "delete",
                                                                  "alice")
        assert "alice" not in ok("users", *conn, "list")
