"""A small Kafka protocol client on kio, for the CLI and the tests.

It sends one kio request entity at a time and reads the typed response; the
request's API key and version come from the entity's schema. It speaks TLS
and SASL (PLAIN, SCRAM-SHA-256/512) when given a ``ClientSecurity``, built
from the properties a Kafka tool's ``--command-config`` file holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
import struct
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode
from kio.schema.sasl_authenticate.v2 import request as sasl_authenticate
from kio.schema.sasl_handshake.v1 import request as sasl_handshake
from scramp import ScramClient

from .codec import (
    API_VERSIONS_KEY,
    ChunkWriter,
    entity_reader_for,
    entity_writer_for,
    response_schema,
    skip_tagged_fields,
)

_SIZE = struct.Struct(">i")
_JAAS_OPTION = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')


class AuthenticationError(RuntimeError):
    """The server refused the credentials (or the mechanism)."""


@dataclass(frozen=True, slots=True)
class ClientSecurity:
    """How to reach a listener: TLS context and/or SASL mechanism and credentials."""

    ssl: ssl.SSLContext | None = None
    mechanism: str | None = None  # SASL mechanism; None: no SASL
    username: str = ""
    password: str = ""

    @classmethod
    def from_properties(cls, props: dict[str, str]) -> ClientSecurity:
        """From Kafka client properties: ``security.protocol``, ``sasl.mechanism``,
        ``sasl.jaas.config`` (or librdkafka's ``sasl.username``/``sasl.password``),
        ``ssl.truststore.location``/``ssl.ca.location`` (PEM), and for a client
        certificate ``ssl.keystore.location`` (PEM, key and chain) or
        ``ssl.certificate.location`` with ``ssl.key.location``."""
        protocol = props.get("security.protocol", "PLAINTEXT").upper()
        context = None
        if protocol in ("SSL", "SASL_SSL"):
            cafile = props.get("ssl.truststore.location") or props.get("ssl.ca.location")
            context = ssl.create_default_context(cafile=cafile or None)
            if props.get("ssl.endpoint.identification.algorithm", "https") == "":
                context.check_hostname = False
            certificate = (props.get("ssl.keystore.location")
                           or props.get("ssl.certificate.location"))
            if certificate:
                context.load_cert_chain(certificate, props.get("ssl.key.location") or None,
                                        props.get("ssl.key.password") or None)
        mechanism = username = password = None
        if protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
            mechanism = props.get("sasl.mechanism", props.get("sasl.mechanisms", "PLAIN"))
            options = dict(_JAAS_OPTION.findall(props.get("sasl.jaas.config", "")))
            username = props.get("sasl.username", options.get("username", ""))
            password = props.get("sasl.password", options.get("password", ""))
        return cls(context, mechanism, username or "", password or "")


class KafkaClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 client_id: str = "kafka-gateway-cli") -> None:
        self._reader = reader
        self._writer = writer
        self._client_id = client_id.encode()
        self._correlation = 0

    @classmethod
    async def connect(cls, host: str, port: int, timeout: float = 10.0,
                      client_id: str = "kafka-gateway-cli",
                      security: ClientSecurity | None = None) -> KafkaClient:
        context = security.ssl if security else None
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=context,
                                    server_hostname=host if context else None), timeout)
        client = cls(reader, writer, client_id)
        if security is not None and security.mechanism:
            try:
                await asyncio.wait_for(client.authenticate(security), timeout)
            except BaseException:
                await client.close()
                raise
        return client

    async def authenticate(self, security: ClientSecurity) -> None:
        """SaslHandshake v1, then SaslAuthenticate with the mechanism's tokens."""
        mechanism = security.mechanism or "PLAIN"
        answer = await self.request(sasl_handshake.SaslHandshakeRequest(mechanism=mechanism))
        if answer.error_code is not ErrorCode.none:
            raise AuthenticationError(f"{mechanism}: {answer.error_code.name.upper()} "
                                      f"(enabled: {', '.join(answer.mechanisms)})")
        if mechanism == "PLAIN":
            await self._sasl_token(f"\0{security.username}\0{security.password}".encode())
            return
        scram = ScramClient([mechanism], security.username, security.password)
        first = await self._sasl_token(scram.get_client_first().encode())
        scram.set_server_first(first.decode())
        final = await self._sasl_token(scram.get_client_final().encode())
        scram.set_server_final(final.decode())

    async def _sasl_token(self, token: bytes) -> bytes:
        answer = await self.request(sasl_authenticate.SaslAuthenticateRequest(auth_bytes=token))
        if answer.error_code is not ErrorCode.none:
            raise AuthenticationError(f"{answer.error_code.name.upper()}: {answer.error_message}")
        return answer.auth_bytes

    async def request(self, body: Any) -> Any:
        api_key = int(type(body).__api_key__)
        frame = await self.request_frame(body)
        schema = response_schema(api_key, int(type(body).__version__))
        response_cls = next(
            obj for name, obj in vars(schema).items()
            if name.endswith("Response") and isinstance(obj, type)
            and getattr(obj, "__api_key__", None) == api_key
            and obj.__name__ == type(body).__name__.replace("Request", "Response")
        )
        pos = 4
        if response_cls.__flexible__ and api_key != API_VERSIONS_KEY:
            pos = skip_tagged_fields(frame, pos)
        value, _ = entity_reader_for(response_cls)(frame, pos)
        return value

    async def request_frame(self, body: Any) -> bytes:
        """Send a request; the response frame, unread (correlation id first).

        For the few answers kio's reader refuses although Kafka sends them
        (a -1 timestamp in DescribeTransactions)."""
        cls = type(body)
        api_key, version = int(cls.__api_key__), int(cls.__version__)
        self._correlation += 1
        out = ChunkWriter()
        out.write(struct.pack(">hhih", api_key, version, self._correlation, len(self._client_id)))
        out.write(self._client_id)
        if cls.__flexible__:
            out.write(b"\x00")
        entity_writer_for(cls)(out, body)
        self._writer.write(_SIZE.pack(out.size) + b"".join(out.chunks))
        await self._writer.drain()
        (size,) = _SIZE.unpack(await self._reader.readexactly(4))
        frame = await self._reader.readexactly(size)
        (correlation,) = struct.unpack_from(">i", frame, 0)
        if correlation != self._correlation:
            raise RuntimeError(f"correlation id {correlation} != {self._correlation}")
        return frame

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()
