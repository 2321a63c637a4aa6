"""Listeners in Kafka's syntax and TLS: several listeners at once, Metadata
advertising each client's own listener, server TLS, client certificates
(mTLS) naming the principal, and every bad handshake refused alone."""

from __future__ import annotations

import argparse
import asyncio
import ssl

import pytest
from kio.schema.api_versions.v3 import request as api_versions
from kio.schema.find_coordinator.v4 import request as find_coordinator
from kio.schema.metadata.v12 import request as metadata

from kafka_gateway import settings
from kafka_gateway.client import ClientSecurity, KafkaClient
from kafka_gateway.security.listeners import ListenerError, parse_listeners
from kafka_gateway.security.tls import TlsSettingError, rfc2253
from testkit.certs import make_pki
from testkit.inprocess import port_of, running

ALICE = "CN=alice,OU=eng,O=Acme,C=US"


def _metadata() -> metadata.MetadataRequest:
    return metadata.MetadataRequest(topics=None, allow_auto_topic_creation=False,
                                    include_topic_authorized_operations=False)


def _tls(pki, certificate=None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca))
    if certificate is not None:
        context.load_cert_chain(str(certificate))
    return context


def _principals(server) -> set[str]:
    return {c.session.principal for c in server.connections if c.session is not None}


def test_listener_syntax():
    [plain, secure, internal] = parse_listeners(
        "PLAINTEXT://127.0.0.1:9092,SASL_SSL://:9094,INTERNAL://[::1]:9095",
        "SASL_SSL://kafka.example:19094", "INTERNAL:SSL")
    assert (plain.protocol, plain.advertised) == ("PLAINTEXT", ("127.0.0.1", 9092))
    assert (secure.protocol, secure.host, secure.advertised) == (
        "SASL_SSL", "", ("kafka.example", 19094))
    assert (internal.protocol, internal.host, internal.tls, internal.sasl) == (
        "SSL", "::1", True, False)
    for listeners, advertised, mapping, message in [
        ("CLIENT://:1", "", "", "no security protocol"),
        ("PLAINTEXT://:1", "SSL://h:2", "", "which listeners does not"),
        ("PLAINTEXT://:1,PLAINTEXT://:2", "", "", "once"),
        ("PLAINTEXT://:1,SSL://:1", "", "", "two listeners on one port"),
        ("PLAINTEXT://:1", "PLAINTEXT://0.0.0.0:1", "", "meta-address"),
        ("PLAINTEXT:/x:1", "", "", "NAME://HOST:PORT"),
        ("A://:1", "", "A:TLS", "NAME:PROTOCOL"),
    ]:
        with pytest.raises(ListenerError, match=message):
            parse_listeners(listeners, advertised, mapping)


def test_subject_as_rfc2253():
    subject = ((("countryName", "US"),), (("organizationName", "Acme, Inc."),),
               (("commonName", "alice"), ("userId", "a1")))
    assert rfc2253(subject) == "CN=alice+UID=a1,O=Acme\\, Inc.,C=US"


def test_several_listeners_each_advertised_to_its_own_clients(tmp_path):
    pki = make_pki(tmp_path / "pki")

    async def main():
        async with running(
            tmp_path, listeners="PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,"
                                "EXTERNAL://127.0.0.1:0",
            advertised_listeners="EXTERNAL://kafka.example:19093",
            listener_security_protocol_map="EXTERNAL:SSL",
            ssl_keystore_location=str(pki.server),
        ) as server:
            ports = {listener.name: listener.port for listener in server.listeners}
            assert len(set(ports.values())) == 3 and 0 not in ports.values()
            seen = {}
            for name, security in (("PLAINTEXT", None),
                                   ("SSL", ClientSecurity(ssl=_tls(pki))),
                                   ("EXTERNAL", ClientSecurity(ssl=_tls(pki)))):
                client = await KafkaClient.connect("127.0.0.1", ports[name], security=security)
                try:
                    answer = await client.request(_metadata())
                    [broker] = answer.brokers
                    coordinator = await client.request(find_coordinator.FindCoordinatorRequest(
                        key_type=0, coordinator_keys=("g",)))
                    [found] = coordinator.coordinators
                    assert (found.host, found.port) == (broker.host, broker.port)
                    seen[name] = (broker.host, broker.port)
                finally:
                    await client.close()
            assert seen == {"PLAINTEXT": ("127.0.0.1", ports["PLAINTEXT"]),
                            "SSL": ("127.0.0.1", ports["SSL"]),
                            "EXTERNAL": ("kafka.example", 19093)}
            props = server.config.properties()
            assert props["listeners"] == ",".join(
                f"{n}://127.0.0.1:{p}" for n, p in ports.items())
            assert "EXTERNAL://kafka.example:19093" in props["advertised.listeners"]
            assert "ssl.key.password" not in props

    asyncio.run(main())


def test_tls_listener_needs_a_keystore(tmp_path):
    async def main():
        with pytest.raises(TlsSettingError, match=r"ssl\.keystore\.location"):
            async with running(tmp_path, listeners="SSL://127.0.0.1:0"):
                pass

    asyncio.run(main())


def test_settings_checked_at_start():
    parser = argparse.ArgumentParser()
    settings.add_arguments(parser)
    with pytest.raises(ValueError, match=r"authorizer\.class\.name"):
        settings.from_arguments(parser.parse_args(["--authorizer-class-name", "x.Y"]))
    with pytest.raises(ValueError, match="no security protocol"):
        settings.from_arguments(parser.parse_args(["--listeners", "CLIENT://:9092"]))
    assert settings.GatewayConfig().listener_list()[0].protocol == "PLAINTEXT"


def test_mtls_principal_and_refused_handshakes(tmp_path):
    pki = make_pki(tmp_path / "pki")
    alice = pki.client(ALICE)
    expired = pki.client("CN=old", expired=True)
    rogue = pki.rogue_client("CN=mallory")

    async def refused(port: int, context: ssl.SSLContext | None) -> None:
        """The handshake fails, or the server closes the connection at once."""
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", port, ssl=context), 10)
        except (ssl.SSLError, ConnectionError):
            return
        try:
            # TLS 1.3: the client finishes first; the server's refusal arrives on read.
            writer.write(b"\x00\x00\x00\x0a" + b"\x00\x12\x00\x00\x00\x00\x00\x01\xff\xff")
            assert await asyncio.wait_for(reader.read(100), 10) == b""
        except (ssl.SSLError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main():
        async with running(tmp_path, listeners="SSL://127.0.0.1:0",
                           ssl_keystore_location=str(pki.server),
                           ssl_truststore_location=str(pki.ca),
                           ssl_client_auth="required") as server:
            port = port_of(server, "SSL")
            good = await KafkaClient.connect("127.0.0.1", port,
                                             security=ClientSecurity(ssl=_tls(pki, alice)))
            assert _principals(server) == {f"User:{ALICE}"}
            metrics = server.broker.metrics
            await refused(port, _tls(pki))  # no client certificate
            await refused(port, _tls(pki, expired))
            await refused(port, _tls(pki, rogue))
            await refused(port, None)  # plaintext bytes to the TLS port
            untrusting = ssl.create_default_context()  # the client does not trust the server
            untrusting.load_cert_chain(str(alice))
            await refused(port, untrusting)
            for _ in range(100):
                if metrics.tls_handshake_failures >= 4:
                    break
                await asyncio.sleep(0.05)
            assert metrics.tls_handshake_failures >= 4
            # The good connection was not disturbed.
            assert (await good.request(_metadata())).brokers[0].port == port
            assert (await good.request(api_versions.ApiVersionsRequest(
                client_software_name="t", client_software_version="1"))).api_keys
            await good.close()

        async with running(tmp_path / "optional", listeners="SSL://127.0.0.1:0",
                           ssl_keystore_location=str(pki.server),
                           ssl_truststore_location=str(pki.ca),
                           ssl_client_auth="requested") as server:
            port = port_of(server, "SSL")
            anonymous = await KafkaClient.connect("127.0.0.1", port,
                                                  security=ClientSecurity(ssl=_tls(pki)))
            named = await KafkaClient.connect("127.0.0.1", port,
                                              security=ClientSecurity(ssl=_tls(pki, alice)))
            await anonymous.request(_metadata())
            await named.request(_metadata())
            assert _principals(server) == {"User:ANONYMOUS", f"User:{ALICE}"}
            await anonymous.close()
            await named.close()

    asyncio.run(main())


def test_admin_http_says_where_it_listens(tmp_path, caplog):
    from kafka_gateway.server import is_loopback

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")

    async def main():
        caplog.set_level("INFO", logger="kafka_gateway.server")
        async with running(tmp_path, admin_listen=":0") as server:
            assert server._admin.address.startswith("127.0.0.1:")
        assert "loopback only" in caplog.text

    asyncio.run(main())
