"""TLS and SASL with the Python clients and kcat: confluent-kafka, kafka-python,
aiokafka and kcat produce and consume through every listener (PLAIN,
SCRAM-SHA-256 and SCRAM-SHA-512, each with and without TLS; server TLS; mTLS),
and every bad way in is refused while a good connection carries on: a wrong
password, an unknown user, no credentials on a SASL listener, plaintext to a
TLS port, an expired, an untrusted or no client certificate."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import time
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from compat_helpers import KCAT
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from kafka import KafkaConsumer, KafkaProducer
from security_helpers import (
    COMBINATIONS,
    PASSWORDS,
    librdkafka_config,
    start_secure_gateway,
)

VALUES = [b"one", b"two", b"three"]
IDS = [f"{listener}-{mechanism or 'cert'}" for listener, mechanism in COMBINATIONS]


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    secure = start_secure_gateway(tmp_path_factory.mktemp("secure"))
    try:
        yield secure
    finally:
        secure.gateway.stop()


def _topic() -> str:
    return f"sec-{uuid.uuid4().hex[:10]}"


def _confluent_roundtrip(config: dict[str, str], topic: str) -> list[bytes]:
    producer = Producer(config)
    for value in VALUES:
        producer.produce(topic, value)
    assert producer.flush(30) == 0
    consumer = Consumer({**config, "group.id": f"g-{topic}", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(got) < len(VALUES) and time.monotonic() < deadline:
        message = consumer.poll(1)
        if message is not None and message.error() is None:
            got.append(message.value())
    consumer.commit(asynchronous=False)
    consumer.close()
    return got


@pytest.mark.parametrize(("listener", "mechanism"), COMBINATIONS, ids=IDS)
def test_confluent_kafka(secure, listener, mechanism):
    topic = _topic()
    assert _confluent_roundtrip(librdkafka_config(secure, listener, mechanism), topic) == VALUES


def _kafka_python_config(secure, listener: str, mechanism: str | None) -> dict:
    protocol = "SSL" if listener == "MTLS" else listener
    config: dict = {"bootstrap_servers": secure.bootstrap(listener),
                    "security_protocol": protocol}
    if mechanism:
        config.update(sasl_mechanism=mechanism, sasl_plain_username="alice",
                      sasl_plain_password=PASSWORDS["alice"])
    if "SSL" in protocol:
        config["ssl_cafile"] = str(secure.pki.ca)
    if listener == "MTLS":
        config.update(ssl_certfile=str(secure.client_pem), ssl_keyfile=str(secure.client_pem))
    return config


@pytest.mark.parametrize(("listener", "mechanism"), COMBINATIONS, ids=IDS)
def test_kafka_python(secure, listener, mechanism):
    topic = _topic()
    config = _kafka_python_config(secure, listener, mechanism)
    producer = KafkaProducer(**config)
    for value in VALUES:
        producer.send(topic, value).get(timeout=30)
    producer.close()
    consumer = KafkaConsumer(topic, group_id=f"g-{topic}", auto_offset_reset="earliest",
                             consumer_timeout_ms=20000, **config)
    got = []
    for message in consumer:
        got.append(message.value)
        if len(got) == len(VALUES):
            break
    consumer.close()
    assert got == VALUES


@pytest.mark.parametrize(("listener", "mechanism"), COMBINATIONS, ids=IDS)
def test_aiokafka(secure, listener, mechanism):
    topic = _topic()
    protocol = "SSL" if listener == "MTLS" else listener
    config: dict = {"bootstrap_servers": secure.bootstrap(listener),
                    "security_protocol": protocol}
    if mechanism:
        config.update(sasl_mechanism=mechanism, sasl_plain_username="alice",
                      sasl_plain_password=PASSWORDS["alice"])
    if "SSL" in protocol:
        context = ssl.create_default_context(cafile=str(secure.pki.ca))
        if listener == "MTLS":
            context.load_cert_chain(str(secure.client_pem))
        config["ssl_context"] = context

    async def main() -> list[bytes]:
        producer = AIOKafkaProducer(**config)
        await producer.start()
        try:
            for value in VALUES:
                await producer.send_and_wait(topic, value)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(topic, group_id=f"g-{topic}",
                                    auto_offset_reset="earliest", **config)
        await consumer.start()
        got = []
        try:
            while len(got) < len(VALUES):
                message = await asyncio.wait_for(consumer.getone(), 30)
                got.append(message.value)
        finally:
            await consumer.stop()
        return got

    assert asyncio.run(main()) == VALUES


def _kcat(config: dict[str, str], *args: str, input: bytes | None = None,
          check: bool = True) -> subprocess.CompletedProcess[bytes]:
    assert KCAT, "kcat is not installed: run `apt-get install -y kcat` (Debian's package)"
    settings = [item for key, value in config.items() if key != "bootstrap.servers"
                for item in ("-X", f"{key.replace('sasl.mechanism', 'sasl.mechanisms')}="
                                   f"{value}")]
    done = subprocess.run([KCAT, "-b", config["bootstrap.servers"], *settings, *args],
                          input=input, capture_output=True, timeout=60)
    if check:
        assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done


@pytest.mark.parametrize(("listener", "mechanism"), COMBINATIONS, ids=IDS)
def test_kcat(secure, listener, mechanism):
    topic = _topic()
    config = librdkafka_config(secure, listener, mechanism)
    _kcat(config, "-P", "-t", topic, input=b"\n".join(VALUES) + b"\n")
    out = _kcat(config, "-C", "-t", topic, "-o", "beginning", "-c", str(len(VALUES)), "-e")
    assert out.stdout.split() == VALUES
    metadata = _kcat(config, "-L", "-t", topic).stdout.decode()
    assert secure.bootstrap(listener) in metadata  # advertised: this listener


def _refused_confluent(config: dict[str, str]) -> list[KafkaError]:
    """A client with ``config`` cannot get metadata; the errors it was told."""
    errors: list[KafkaError] = []
    producer = Producer({**config, "error_cb": errors.append, "socket.timeout.ms": 5000,
                         "reconnect.backoff.max.ms": 1000})
    with pytest.raises(KafkaException):
        producer.list_topics(timeout=5)
    producer.poll(0.5)  # serves the error callbacks
    return errors


def test_refused_and_others_unaffected(secure):
    topic = _topic()
    good = Producer(librdkafka_config(secure, "SASL_SSL", "SCRAM-SHA-512"))
    good.produce(topic, b"before")
    assert good.flush(30) == 0
    before = secure.metrics()

    for mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
        errors = _refused_confluent(librdkafka_config(secure, "SASL_PLAINTEXT", mechanism,
                                                      password="wrong"))
        assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors
        errors = _refused_confluent(librdkafka_config(secure, "SASL_SSL", mechanism,
                                                      user="nobody"))
        assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors
    # No credentials on a SASL listener: the gateway closes the connection.
    _refused_confluent({"bootstrap.servers": secure.bootstrap("SASL_PLAINTEXT")})
    # Plaintext bytes to TLS ports.
    _refused_confluent({"bootstrap.servers": secure.bootstrap("SSL")})
    _refused_confluent({"bootstrap.servers": secure.bootstrap("SASL_SSL")})
    # Client certificates: none, expired, signed by an unknown CA.
    mtls = librdkafka_config(secure, "MTLS", None)
    _refused_confluent({**mtls, "ssl.certificate.location": "", "ssl.key.location": ""})
    for pem in (secure.expired_pem, secure.rogue_pem):
        _refused_confluent({**mtls, "ssl.certificate.location": str(pem),
                            "ssl.key.location": str(pem)})
    # The client does not trust the server's certificate.
    _refused_confluent({**librdkafka_config(secure, "SSL", None),
                        "ssl.ca.location": str(secure.rogue_pem)})

    after = secure.metrics()
    assert after["authentication_failures_total"] - before["authentication_failures_total"] >= 6
    assert after["tls_handshake_failures_total"] - before["tls_handshake_failures_total"] >= 5
    log = secure.gateway.output()
    assert "failed authentication of User:alice from 127.0.0.1" in log
    # Clients retry fast: the log keeps to a few lines a minute per address.
    assert log.count("failed authentication of") <= 10 + log.count("similar lines")
    assert after["log_lines_suppressed_total"] > before["log_lines_suppressed_total"]
    # The connection made before all that still works.
    good.produce(topic, b"after")
    assert good.flush(30) == 0
    consumer = Consumer({**librdkafka_config(secure, "SASL_SSL", "SCRAM-SHA-256"),
                         "group.id": f"g-{topic}", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got = []
    deadline = time.monotonic() + 60
    while len(got) < 2 and time.monotonic() < deadline:
        message = consumer.poll(1)
        if message is not None and message.error() is None:
            got.append(message.value())
    consumer.close()
    assert got == [b"before", b"after"]


def test_refused_python_clients(secure):
    from kafka.errors import KafkaError as KafkaPythonError

    config = _kafka_python_config(secure, "SASL_SSL", "SCRAM-SHA-256")
    with pytest.raises(KafkaPythonError):
        KafkaProducer(**{**config, "sasl_plain_password": "wrong"}, max_block_ms=5000)
    with pytest.raises(KafkaPythonError):
        KafkaProducer(**{**config, "sasl_plain_username": "nobody"}, max_block_ms=5000)

    async def aiokafka_wrong_password() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=secure.bootstrap("SASL_PLAINTEXT"),
            security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
            sasl_plain_username="alice", sasl_plain_password="wrong", request_timeout_ms=10000)
        try:
            await producer.start()
        finally:
            await producer.stop()

    before = secure.metrics()["authentication_failures_total"]
    # aiokafka reports it as "Unable to bootstrap"; the gateway counted why.
    with pytest.raises(Exception, match=r"(?i)bootstrap|authentication"):
        asyncio.run(aiokafka_wrong_password())
    assert secure.metrics()["authentication_failures_total"] > before


def test_kcat_refused(secure):
    """Debian's kcat (librdkafka 2.0.2, whose SCRAM repeats its nonce): a wrong
    password or user is still refused; a connection without TLS to a TLS port too."""
    for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"):
        for user, password in (("alice", "wrong"), ("nobody", "x")):
            done = _kcat(librdkafka_config(secure, "SASL_PLAINTEXT", mechanism, user=user,
                                           password=password), "-L", "-m", "5", check=False)
            assert done.returncode != 0
            assert b"Authentication failed" in done.stderr, done.stderr
    done = _kcat({"bootstrap.servers": secure.bootstrap("SASL_SSL")}, "-L", "-m", "5",
                 check=False)
    assert done.returncode != 0
