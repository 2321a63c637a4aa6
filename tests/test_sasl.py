"""SASL over the wire, in-process: PLAIN and SCRAM-SHA-256/512, with and without
TLS; failures answered and disconnected as Kafka does, other connections
untouched; the v0 handshake's bare tokens; SCRAM credentials managed with
Describe/AlterUserScramCredentials and kept salted, never in plaintext."""

from __future__ import annotations

import asyncio
import hashlib
import os
import struct

import pytest
from kio.schema.alter_user_scram_credentials.v0 import request as alter_scram
from kio.schema.describe_user_scram_credentials.v0 import request as describe_scram
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12 import request as metadata
from kio.schema.sasl_authenticate.v2 import request as sasl_authenticate
from kio.schema.sasl_handshake.v0 import request as sasl_handshake_v0
from kio.schema.sasl_handshake.v1 import request as sasl_handshake

from kafka_gateway.client import AuthenticationError, ClientSecurity, KafkaClient
from kafka_gateway.security.scram import from_password
from testkit.certs import make_pki
from testkit.inprocess import port_of, running

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
LISTENERS = "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0"


def _metadata() -> metadata.MetadataRequest:
    return metadata.MetadataRequest(topics=None, allow_auto_topic_creation=False,
                                    include_topic_authorized_operations=False)


async def _add_user(server, user: str, password: str) -> None:
    await server.broker.credentials.change(
        [(user, from_password(m, password)) for m in ("SCRAM-SHA-256", "SCRAM-SHA-512")], [])


async def _closed(client: KafkaClient) -> bool:
    """Has the server closed this connection?"""
    return await asyncio.wait_for(client._reader.read(1), 10) == b""


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_each_mechanism_with_and_without_tls(tmp_path, mechanism):
    pki = make_pki(tmp_path / "pki")

    async def main():
        async with running(tmp_path, listeners=LISTENERS,
                           ssl_keystore_location=str(pki.server)) as server:
            await _add_user(server, "alice", "alice-secret")
            for listener in ("SASL_PLAINTEXT", "SASL_SSL"):
                security = ClientSecurity.from_properties({
                    "security.protocol": listener, "sasl.mechanism": mechanism,
                    "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule'
                                        ' required username="alice" password="alice-secret";',
                    "ssl.ca.location": str(pki.ca)})
                client = await KafkaClient.connect("127.0.0.1", port_of(server, listener),
                                                   security=security)
                answer = await client.request(_metadata())
                assert answer.brokers[0].port == port_of(server, listener)
                principals = {c.session.principal for c in server.connections}
                assert principals == {"User:alice"}
                await client.close()
            assert server.broker.metrics.authentication_successes == 2
            assert server.broker.metrics.authentication_failures == 0

    asyncio.run(main())


def test_failures_disconnect_and_leave_others_alone(tmp_path):
    async def main():
        async with running(tmp_path, listeners=LISTENERS,
                           ssl_keystore_location=str(make_pki(tmp_path / "pki").server),
                           sasl_enabled_mechanisms="PLAIN,SCRAM-SHA-256") as server:
            await _add_user(server, "alice", "alice-secret")
            port = port_of(server, "SASL_PLAINTEXT")
            good = await KafkaClient.connect("127.0.0.1", port, security=ClientSecurity(
                mechanism="SCRAM-SHA-256", username="alice", password="alice-secret"))
            metrics = server.broker.metrics
            for mechanism, user, password in [
                ("PLAIN", "alice", "wrong"), ("PLAIN", "nobody", "alice-secret"),
                ("SCRAM-SHA-256", "alice", "wrong"), ("SCRAM-SHA-256", "nobody", "x"),
                ("PLAIN", "", "x"),
            ]:
                client = await KafkaClient.connect("127.0.0.1", port)
                with pytest.raises(AuthenticationError, match="SASL_AUTHENTICATION_FAILED"):
                    await client.authenticate(ClientSecurity(mechanism=mechanism, username=user,
                                                             password=password))
                assert await _closed(client)
                await client.close()
            assert metrics.authentication_failures == 5

            # A mechanism not enabled: UNSUPPORTED_SASL_MECHANISM with the list, then closed.
            client = await KafkaClient.connect("127.0.0.1", port)
            answer = await client.request(sasl_handshake.SaslHandshakeRequest(
                mechanism="SCRAM-SHA-512"))
            assert answer.error_code is ErrorCode.unsupported_sasl_mechanism
            assert answer.mechanisms == ("PLAIN", "SCRAM-SHA-256")
            assert await _closed(client)
            await client.close()

            # No credentials at all: anything but ApiVersions/SaslHandshake is not served.
            client = await KafkaClient.connect("127.0.0.1", port)
            with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):
                await client.request(_metadata())
            await client.close()
            # Handshake, then a request instead of the token: closed too.
            client = await KafkaClient.connect("127.0.0.1", port)
            await client.request(sasl_handshake.SaslHandshakeRequest(mechanism="PLAIN"))
            with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):
                await client.request(_metadata())
            await client.close()

            # The authenticated connection never noticed.
            assert (await good.request(_metadata())).brokers[0].port == port
            # ... and SASL requests after authentication are ILLEGAL_SASL_STATE, as on
            # PLAINTEXT listeners.
            again = await good.request(sasl_handshake.SaslHandshakeRequest(mechanism="PLAIN"))
            assert again.error_code is ErrorCode.illegal_sasl_state
            await good.close()
            plain = await KafkaClient.connect("127.0.0.1", port_of(server, "PLAINTEXT"))
            token = await plain.request(sasl_authenticate.SaslAuthenticateRequest(auth_bytes=b""))
            assert token.error_code is ErrorCode.illegal_sasl_state
            await plain.close()

    asyncio.run(main())


def test_v0_handshake_takes_bare_tokens(tmp_path):
    async def main():
        async with running(tmp_path, listeners="SASL_PLAINTEXT://127.0.0.1:0") as server:
            await _add_user(server, "alice", "alice-secret")
            port = port_of(server, "SASL_PLAINTEXT")
            client = await KafkaClient.connect("127.0.0.1", port)
            answer = await client.request(sasl_handshake_v0.SaslHandshakeRequest(
                mechanism="PLAIN"))
            assert answer.error_code is ErrorCode.none
            token = b"\0alice\0alice-secret"
            client._writer.write(struct.pack(">i", len(token)) + token)
            assert await client._reader.readexactly(4) == b"\0\0\0\0"  # an empty server token
            assert (await client.request(_metadata())).brokers[0].port == port

            bad = await KafkaClient.connect("127.0.0.1", port)
            await bad.request(sasl_handshake_v0.SaslHandshakeRequest(mechanism="PLAIN"))
            token = b"\0alice\0nope"
            bad._writer.write(struct.pack(">i", len(token)) + token)
            assert await _closed(bad)  # no Kafka answer to a bare token: just closed
            await bad.close()
            await client.close()

    asyncio.run(main())


def test_scram_credentials_over_the_wire(tmp_path):
    def salted(password: bytes, salt: bytes, iterations: int, digest: str) -> bytes:
        return hashlib.pbkdf2_hmac(digest, password, salt, iterations)

    async def main():
        async with running(tmp_path, listeners="PLAINTEXT://127.0.0.1:0,"
                                               "SASL_PLAINTEXT://127.0.0.1:0") as server:
            admin = await KafkaClient.connect("127.0.0.1", port_of(server, "PLAINTEXT"))
            salt = os.urandom(16)
            answer = await admin.request(alter_scram.AlterUserScramCredentialsRequest(
                deletions=(alter_scram.ScramCredentialDeletion(name="ghost", mechanism=1),),
                upsertions=(
                    alter_scram.ScramCredentialUpsertion(
                        name="bob", mechanism=1, iterations=8192, salt=salt,
                        salted_password=salted(b"bob-secret", salt, 8192, "sha256")),
                    alter_scram.ScramCredentialUpsertion(
                        name="bob", mechanism=2, iterations=4096, salt=salt,
                        salted_password=salted(b"bob-secret", salt, 4096, "sha512")),
                    alter_scram.ScramCredentialUpsertion(
                        name="carol", mechanism=1, iterations=100, salt=salt,
                        salted_password=b"x"),
                    alter_scram.ScramCredentialUpsertion(
                        name="dave", mechanism=9, iterations=4096, salt=salt,
                        salted_password=b"x"),
                    alter_scram.ScramCredentialUpsertion(
                        name="erin", mechanism=1, iterations=4096, salt=salt,
                        salted_password=b"x"),
                    alter_scram.ScramCredentialUpsertion(
                        name="erin", mechanism=1, iterations=4096, salt=salt,
                        salted_password=b"y"),
                )))
            results = {r.user: (r.error_code, r.error_message) for r in answer.results}
            assert results == {
                "ghost": (ErrorCode.resource_not_found,
                          "Attempt to delete a user credential that does not exist"),
                "bob": (ErrorCode.none, None),
                "carol": (ErrorCode.unacceptable_credential, "Too few iterations"),
                "dave": (ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism"),
                "erin": (ErrorCode.duplicate_resource,
                         "A user credential cannot be altered twice in the same request"),
            }
            described = await admin.request(describe_scram.DescribeUserScramCredentialsRequest(
                users=None))
            assert [(r.user, [(c.mechanism, c.iterations) for c in r.credential_infos])
                    for r in described.results] == [("bob", [(1, 8192), (2, 4096)])]
            named = await admin.request(describe_scram.DescribeUserScramCredentialsRequest(
                users=(describe_scram.UserName(name="bob"),
                       describe_scram.UserName(name="nobody"))))
            assert [(r.user, r.error_code) for r in named.results] == [
                ("bob", ErrorCode.none), ("nobody", ErrorCode.resource_not_found)]

            port = port_of(server, "SASL_PLAINTEXT")
            for mechanism in MECHANISMS:
                client = await KafkaClient.connect("127.0.0.1", port, security=ClientSecurity(
                    mechanism=mechanism, username="bob", password="bob-secret"))
                await client.request(_metadata())
                await client.close()

            # Deleted: bob can no longer use SCRAM-SHA-256.
            answer = await admin.request(alter_scram.AlterUserScramCredentialsRequest(
                deletions=(alter_scram.ScramCredentialDeletion(name="bob", mechanism=1),),
                upsertions=()))
            assert answer.results[0].error_code is ErrorCode.none
            with pytest.raises(AuthenticationError):
                await KafkaClient.connect("127.0.0.1", port, security=ClientSecurity(
                    mechanism="SCRAM-SHA-256", username="bob", password="bob-secret"))
            await admin.close()
        # Salted: the password is nowhere in the store.
        stored = b"".join(path.read_bytes() for path in (tmp_path / "data").rglob("*")
                          if path.is_file())
        assert b"bob-secret" not in stored
        assert b"bob" in stored

    asyncio.run(main())
