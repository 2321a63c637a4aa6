"""Login messages before authentication, for the fuzz run (testkit/fuzz_run.py).

A *case* is what one fresh connection to a SASL listener sends: the valid
frames its stage needs (a handshake, a SCRAM client-first of a real user),
each of which must be answered without error, then one fuzzed frame whose
outcome counts like any other fuzzed frame's. The fuzzed tokens are what a
hostile client might send: bytes changed, separators inserted, cut, grown
past the user name, password and frame caps (security/sasl.py), garbage.
Each case is a function of its random generator only.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import random
import struct
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from kafka_gateway.apis import APIS
from kafka_gateway.client import ClientSecurity, KafkaClient
from kafka_gateway.codec import API_VERSIONS_KEY, _request_class, request_schema
from kafka_gateway.security.scram import DEFAULT_ITERATIONS, MECHANISMS
from testkit.fuzz import Seed, Span, _encode, _trace, frame
from testkit.gateway import GatewayProcess

SASL_LISTENER = "SASL_PLAINTEXT"
SASL_USER, SASL_PASSWORD = "fuzz-sasl-user", "fuzz-sasl-secret"  # no seed names this user
_SIZE = struct.Struct(">i")

SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
SASL_MAX_RECEIVE = 524_288  # the gateway's sasl.server.max.receive.size (Kafka's default)
SASL_STAGES = ("first", "token", "raw-token", "scram-final")


@dataclass(frozen=True, slots=True)
class SaslCase:
    """What a fresh connection to a SASL listener sends: ``setup`` (valid frames,
    each answered), then ``frame``, the fuzzed one, whose outcome counts.

    Stages: ``first``, the fuzzed frame opens the connection (a mutated
    SaslHandshake or ApiVersions, another API, or a size prefix over the
    pre-authentication cap); ``token``, a SaslAuthenticate after a valid v1
    handshake; ``raw-token``, a bare token after a v0 handshake (its answer,
    if any, is a bare token too: ``raw``); ``scram-final``, a SCRAM client-final
    after a valid client-first of ``user``.
    """

    stage: str
    setup: tuple[bytes, ...]
    frame: bytes
    raw: bool = False


def sasl_case(all_seeds: list[Seed], rng: random.Random, correlation_id: int,
              user: str = SASL_USER) -> SaslCase:
    """One SASL case, a function of ``rng`` only (see SaslCase)."""
    stage = rng.choice(SASL_STAGES)
    mechanism = rng.choice(SASL_MECHANISMS)
    if stage == "first":
        roll = rng.random()
        if roll < 0.15:  # a size prefix over the cap, and a few bytes of it
            size = rng.choice((SASL_MAX_RECEIVE + 1, 1 << 20, 0x7FFFFFFF, -1))
            return SaslCase(stage, (), struct.pack(">i", size) + bytes(rng.randint(0, 64)))
        keys = (SASL_HANDSHAKE, SASL_HANDSHAKE, API_VERSIONS_KEY, rng.choice(list(APIS)))
        key = rng.choice(keys)
        candidates = [s for s in all_seeds if s.api_key == key]
        seed = rng.choice(candidates)
        if key == SASL_HANDSHAKE and rng.random() < 0.5:
            name = _mutated_text(mechanism.encode(), rng).decode("utf-8", "replace")
            seed = _with_body(SASL_HANDSHAKE, seed.version, mechanism=name[:8000])  # int16
            return SaslCase(stage, (), frame(seed, correlation_id))
        return SaslCase(stage, (), frame(seed, correlation_id, rng))
    if stage == "raw-token":
        token = _mutated_text(_first_token(mechanism, user, rng), rng)
        return SaslCase(stage, (_handshake(0, mechanism),),
                        struct.pack(">i", len(token)) + token, raw=True)
    setup = [_handshake(1, mechanism)]
    if stage == "scram-final":
        mechanism = rng.choice(SASL_MECHANISMS[1:])
        setup = [_handshake(1, mechanism),
                 _authenticate(2, b"n,,n=" + user.encode() + b",r=fuzznonce", 2)]
        proof = bytes(rng.randrange(256) for _ in range(64 if mechanism[-3:] == "512" else 32))
        token = (b"c=biws,r=fuzznonce" + bytes(rng.choice(b"abcdefgh") for _ in range(24))
                 + b",p=" + base64.b64encode(proof))
    else:
        token = _first_token(mechanism, user, rng)
    version = rng.randint(0, 2)
    seed = _with_body(SASL_AUTHENTICATE, version, auth_bytes=_mutated_text(token, rng))
    fuzzed = frame(seed, correlation_id, rng if rng.random() < 0.3 else None)
    return SaslCase(stage, tuple(setup), fuzzed)


def _first_token(mechanism: str, user: str, rng: random.Random) -> bytes:
    """A plausible first token: PLAIN's three fields, or SCRAM's client-first."""
    name = user.encode() if rng.random() < 0.5 else b"fz-nobody"
    if mechanism == "PLAIN":
        return b"\x00" + name + b"\x00" + b"fz-wrong-password"
    return b"n,,n=" + name + b",r=" + bytes(rng.choice(b"ABCDEFGH0123") for _ in range(24))


def _mutated_text(text: bytes, rng: random.Random) -> bytes:
    """``text`` as a hostile client might send it: bytes changed, separators
    inserted, cut, grown past the user name, password or frame caps, or left as is."""
    choice = rng.randrange(8)
    if choice == 0:
        return text
    if choice == 1:
        mutated = bytearray(text)
        for _ in range(rng.randint(1, 4)):
            if mutated:
                mutated[rng.randrange(len(mutated))] = rng.choice(b"\x00,=\xff\xc3\x80 ")
        return bytes(mutated)
    if choice == 2:
        return text[: rng.randrange(len(text) + 1)]
    if choice == 3:  # a field grown: past the caps, now and then past the frame cap
        size = rng.choice((513, 1025, 4097, 64 << 10, SASL_MAX_RECEIVE - 64,
                           SASL_MAX_RECEIVE + 64))
        at = rng.randrange(len(text) + 1)
        return text[:at] + rng.choice(("é", "a", "\u00ad", "\ufb03")).encode() * (
            size // 2) + text[at:]
    if choice == 4:
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 64)))
    if choice == 5:
        return b""
    if choice == 6:
        return text + b"," + text  # repeated attributes
    return text.replace(b"=", b"=3D=2C=", 1)


def _with_body(api_key: int, version: int, **values: Any) -> Seed:
    """A seed of ``api_key`` v``version`` with these field values."""
    cls = _request_class(api_key, version)
    assert cls is not None
    body = _encode(cls(**values))
    spans: list[Span] = []
    _trace(cls, body, 0, spans, nullable=False)
    return Seed(api_key, version, bool(cls.__flexible__), body, tuple(spans))


def _handshake(version: int, mechanism: str) -> bytes:
    return frame(_with_body(SASL_HANDSHAKE, version, mechanism=mechanism), 1)


def _authenticate(version: int, token: bytes, correlation_id: int) -> bytes:
    return frame(_with_body(SASL_AUTHENTICATE, version, auth_bytes=token), correlation_id)


# ------------------------------------------------------------------ exchange
async def create_user(host: str, port: int) -> None:
    """SASL_USER, with credentials of both SCRAM mechanisms (PLAIN checks either)."""
    client = await KafkaClient.connect(host, port)
    try:
        schema = request_schema(51, 0)  # AlterUserScramCredentials
        upsertions = []
        for digest, code in MECHANISMS.values():
            salt = os.urandom(32)
            upsertions.append(schema.ScramCredentialUpsertion(
                name=SASL_USER, mechanism=code, iterations=DEFAULT_ITERATIONS, salt=salt,
                salted_password=hashlib.pbkdf2_hmac(digest().name, SASL_PASSWORD.encode(), salt,
                                                    DEFAULT_ITERATIONS)))
        answer = await client.request(schema.AlterUserScramCredentialsRequest(
            deletions=(), upsertions=tuple(upsertions)))
        assert all(r.error_code is ErrorCode.none for r in answer.results), answer
    finally:
        await client.close()


async def login_works(gateway: GatewayProcess) -> bool:
    """Does a real SCRAM login on the SASL listener succeed, and a request after it?"""
    client = await KafkaClient.connect("127.0.0.1", gateway.listener_ports[SASL_LISTENER],
                                       security=ClientSecurity(
                                           mechanism="SCRAM-SHA-256", username=SASL_USER,
                                           password=SASL_PASSWORD))
    try:
        answer = await client.request(request_schema(18, 0).ApiVersionsRequest())
        return answer.error_code is ErrorCode.none
    finally:
        await client.close()


async def open_case(host: str, port: int, case: SaslCase,
                    wait: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    """A connection to the SASL listener with the case's setup done, or None (and
    the connection closed) if a setup frame was not answered without error."""
    reader, writer = await asyncio.open_connection(host, port)
    for data in case.setup:
        answer = await _setup_answer(reader, writer, data, wait)
        if answer is None or answer[4:6] != b"\x00\x00":  # error code NONE
            writer.close()
            return None
    return reader, writer


async def raw_exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes,
                       wait: float) -> str:
    """A bare token after a v0 handshake: a bare token back, or nothing (a failure)."""
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(wait):
            (size,) = _SIZE.unpack(await reader.readexactly(4))
            await reader.readexactly(size)
        return "answered"
    except TimeoutError:
        return "unanswered"
    except (asyncio.IncompleteReadError, ConnectionError):
        return "closed"


async def _setup_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        data: bytes, wait: float) -> bytes | None:
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(wait):
            (size,) = _SIZE.unpack(await reader.readexactly(4))
            return await reader.readexactly(size)
    except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
        return None
