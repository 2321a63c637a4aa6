"""SASL authentication on SASL_PLAINTEXT and SASL_SSL listeners, as Kafka's
SaslServerAuthenticator does it.

Until the client has authenticated, its connection's ``SaslGate`` sees each
frame first: ApiVersions (passed on to its handler), then SaslHandshake
(the mechanism), then the mechanism's tokens, in SaslAuthenticate requests
after a v1 handshake, or bare (size-prefixed, no request header) after a v0
one. Any other request closes the connection. PLAIN checks the password
against the user's SCRAM credentials; SCRAM-SHA-256/512 run scramp's server.
A failed authentication is answered SASL_AUTHENTICATION_FAILED (nothing,
after a v0 handshake) and the connection is closed, as Kafka does; it is
counted and logged with the user and address, a few lines a minute per
address. An unsupported mechanism gets UNSUPPORTED_SASL_MECHANISM and the
list of enabled ones, then the connection closes.

Authentication runs on the event loop, so what one login may cost is
bounded before any work is done on it. Until a client has authenticated its
frames are at most ``sasl.server.max.receive.size`` (512 KiB, Kafka's
default; the connection refuses a larger size prefix before reading on, as
Kafka does). Within that, user names of more than ``MAX_USERNAME_BYTES``,
PLAIN passwords of more than ``MAX_PASSWORD_BYTES`` and SCRAM messages of
more than ``MAX_SCRAM_MESSAGE_BYTES`` fail the authentication before they are
normalised: SASLprep (RFC 4013, in scramp) costs about 1.4 ms per KiB, so a
16 MiB password took 29 s, all other clients waiting. At those sizes it costs
a millisecond or two, as much as the rest: SCRAM a few hashes, PLAIN one key
derivation of the credential's iteration count (4096 rounds: about two
milliseconds). A failed authentication is answered, and its connection
closed, ``connection.failed.authentication.delay.ms`` after it failed.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from kio.schema.errors import ErrorCode
from scramp import ScramException, ScramMechanism

from common.logtext import client_text

from ..apis import sasl_authenticate, sasl_handshake
from ..bad_input import BadInputLog
from ..codec import (
    API_VERSIONS_KEY,
    MalformedRequest,
    RequestHeader,
    build,
    decode_request,
    encode_response,
    read_header,
    response_schema,
)
from ..metrics import Metrics
from ..thirdparty import scram_server_final_for_nonce
from .scram import MECHANISMS as SCRAM_MECHANISMS
from .scram import Credentials
from .tls import listener_setting

if TYPE_CHECKING:
    from .listeners import Listener

# Kafka keeps SCRAM users in ZooKeeper znodes / KRaft records and names them in
# ACL principals: no real name comes near this. The authorization id of PLAIN
# is a user name too.
MAX_USERNAME_BYTES = 512
# Room for generated secrets (API keys, connection strings of a few hundred bytes).
MAX_PASSWORD_BYTES = 1024
# A SCRAM message is a user name or a channel binding (base64 of the GS2 header),
# a nonce of a few dozen characters and a proof: a few hundred bytes.
MAX_SCRAM_MESSAGE_BYTES = 4096
SASL_HANDSHAKE_KEY = sasl_handshake.API_KEY
SASL_AUTHENTICATE_KEY = sasl_authenticate.API_KEY
SUPPORTED = ("PLAIN", *SCRAM_MECHANISMS)
_SIZE = struct.Struct(">i")
# An answer, as buffers for writelines().
Chunks = Sequence[bytes | bytearray]


def enabled_mechanisms(config, listener: Listener) -> tuple[str, ...]:
    value = listener_setting(config, listener, "sasl.enabled.mechanisms")
    mechanisms = tuple(m.strip().upper() for m in value.split(",") if m.strip())
    unknown = [m for m in mechanisms if m not in SUPPORTED]
    if unknown or not mechanisms:
        raise ValueError(f"sasl.enabled.mechanisms of listener {listener.name}: supported are "
                         f"{', '.join(SUPPORTED)}, got {value!r}")
    return mechanisms


class AuthenticationFailed(Exception):
    """``message`` goes to the client; ``reason`` only to the log."""

    def __init__(self, message: str, reason: str, user: str | None) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.user = user


class PlainServer:
    def __init__(self, credentials: Credentials) -> None:
        self.credentials = credentials

    def step(self, token: bytes) -> tuple[bytes, str | None]:
        parts = token.split(b"\x00")
        if len(parts) != 3:
            raise AuthenticationFailed(
                f"Invalid SASL/PLAIN response: expected 3 tokens, got {len(parts)}",
                "malformed PLAIN message", None)
        if max(len(parts[0]), len(parts[1])) > MAX_USERNAME_BYTES:
            raise AuthenticationFailed(
                "Authentication failed: Invalid username or password",
                f"user name of more than {MAX_USERNAME_BYTES} bytes", None)
        if len(parts[2]) > MAX_PASSWORD_BYTES:
            raise AuthenticationFailed(
                "Authentication failed: Invalid username or password",
                f"password of more than {MAX_PASSWORD_BYTES} bytes", None)
        try:
            authzid, user, password = (part.decode() for part in parts)
        except UnicodeDecodeError:
            raise AuthenticationFailed("Invalid SASL/PLAIN response: not UTF-8",
                                       "malformed PLAIN message", None) from None
        if not user:
            raise AuthenticationFailed("Authentication failed: username not specified",
                                       "no user name", None)
        if not password:
            raise AuthenticationFailed("Authentication failed: password not specified",
                                       "no password", user)
        if not self.credentials.check_password(user, password):
            raise AuthenticationFailed("Authentication failed: Invalid username or password",
                                       "wrong password or unknown user", user)
        if authzid and authzid != user:
            raise AuthenticationFailed(
                "Authentication failed: Client requested an authorization id that is "
                "different from username", f"authorization id {authzid!r}", user)
        return b"", f"User:{user}"


class ScramServer:
    def __init__(self, mechanism: str, credentials: Credentials) -> None:
        self.mechanism = mechanism
        self.credentials = credentials
        self.user: str | None = None
        self.server = ScramMechanism(mechanism).make_server(self._auth_info)
        self.done_first = False

    def _auth_info(self, saslname: str) -> tuple[bytes, bytes, bytes, int]:
        self.user = saslname  # scramp has undone the saslname escapes (=2C, =3D) already
        credential = self.credentials.get(self.user, self.mechanism)
        if credential is None:
            raise ScramException("unknown user")
        return credential.auth_info()

    def step(self, token: bytes) -> tuple[bytes, str | None]:
        try:
            if len(token) > MAX_SCRAM_MESSAGE_BYTES:
                raise ValueError(f"message of more than {MAX_SCRAM_MESSAGE_BYTES} bytes")
            message = token.decode()
            if not self.done_first:
                _check_username_size(message)
                self.server.set_client_first(message)
                self.done_first = True
                return self.server.get_server_first().encode(), None
            try:
                self.server.set_client_final(message)
                answer = self.server.get_server_final().encode()
            except ScramException:
                answer = self._repeated_nonce_final(message)
        except Exception as exc:  # whatever a hostile message makes scramp raise
            # As Kafka: the client is not told why (whether the user exists).
            raise AuthenticationFailed(
                "Authentication failed during authentication due to invalid credentials "
                f"with SASL mechanism {self.mechanism}", str(exc) or type(exc).__name__,
                self.user) from None
        return answer, f"User:{self.user}"


    def _repeated_nonce_final(self, message: str) -> bytes:
        """librdkafka before 2.2 (Debian's kcat) sends its client nonce again in front
        of the full nonce in client-final. Kafka's server does not compare that nonce,
        only the proof, which covers the message as sent; scramp compares it. Accepted
        when the nonce ends with the whole nonce of server-first, so the server's part
        is in it (a replay still fails), and then checked by scramp's own proof check."""
        return scram_server_final_for_nonce(self.server, message).encode()


def _check_username_size(client_first: str) -> None:
    """Refuse a user name over the cap before scramp normalises it."""
    # gs2-cbind-flag "," [authzid] "," "n=" saslname "," ... (RFC 5802)
    fields = client_first.split(",", 3)
    if len(fields) >= 3 and fields[2].startswith("n="):
        name = fields[2][2:].replace("=2C", ",").replace("=3D", "=")
        if len(name.encode()) > MAX_USERNAME_BYTES:
            raise ValueError(f"user name of more than {MAX_USERNAME_BYTES} bytes")


class GateHost(Protocol):
    """What a ``SaslGate`` needs of its connection (connection/sasl_hooks.py
    implements it): the gate is handed this, never the connection itself."""

    @property
    def address(self) -> str:
        """The client's address, which bad input is logged (and rate-limited) by."""

    @property
    def peer(self) -> str:
        """The client's address and port."""

    def reject(self, reason: str) -> None:
        """A request that has no place here: logged, counted, the connection closed."""

    def answer(self, chunks: Chunks) -> None:
        """Write an answer now (before authentication one request is served at a time)."""

    def authenticated(self, principal: str) -> None:
        """Done: from now on the connection serves ``principal``, without the gate."""

    def fail_authentication(self, chunks: Chunks | None) -> None:
        """Mute the connection now; answer ``chunks`` (if any) and close it after
        ``connection.failed.authentication.delay.ms``."""


class SaslGate:
    """One connection's authentication, until it succeeds (see the module doc)."""

    def __init__(self, host: GateHost, listener: Listener, mechanisms: tuple[str, ...],
                 max_receive_size: int, credentials: Credentials, metrics: Metrics,
                 bad_input: BadInputLog) -> None:
        self.host = host
        self.listener = listener
        self.mechanisms = mechanisms
        self.credentials = credentials
        self.metrics = metrics
        self.bad_input = bad_input
        self.mechanism = ""
        self.server: PlainServer | ScramServer | None = None
        self.raw = False  # after a v0 handshake the tokens come bare
        self.max_receive_size = max_receive_size  # sasl.server.max.receive.size

    def intercept(self, frame: memoryview) -> bool:
        """True if the gate took the frame; False: serve it as usual (ApiVersions)."""
        if self.raw:
            self._token(bytes(frame), None)
            return True
        try:
            header, pos = read_header(frame)
            expected = SASL_AUTHENTICATE_KEY if self.server else SASL_HANDSHAKE_KEY
            if header.api_key == API_VERSIONS_KEY and self.server is None:
                return False
            if header.api_key != expected:
                stage = "authentication" if self.server else "handshake"
                raise MalformedRequest(
                    f"API key {header.api_key} during SASL {stage} (expected {expected})")
            api = sasl_authenticate if self.server else sasl_handshake
            low, high = api.VERSIONS
            if not low <= header.api_version <= high:
                name = api.__name__.rsplit(".", 1)[-1]
                raise MalformedRequest(f"{name} v{header.api_version} is not supported")
            body = decode_request(frame, header, pos).body
        except MalformedRequest as exc:
            self.host.reject(str(exc))
            return True
        if header.api_key == SASL_HANDSHAKE_KEY:
            self._handshake(header, body.mechanism)
        else:
            self._token(bytes(body.auth_bytes), header)
        return True

    def _handshake(self, header: RequestHeader, mechanism: str) -> None:
        schema = response_schema(SASL_HANDSHAKE_KEY, header.api_version)
        supported = mechanism in self.mechanisms
        code = ErrorCode.none if supported else ErrorCode.unsupported_sasl_mechanism
        body = build(schema.SaslHandshakeResponse, error_code=code, mechanisms=self.mechanisms)
        chunks = encode_response(SASL_HANDSHAKE_KEY, header.correlation_id, body)
        if not supported:
            # As Kafka: the answer at once, the close after the delay.
            self.host.answer(chunks)
            self._failed(AuthenticationFailed(
                "", f"unsupported mechanism {client_text(mechanism)}", None), None)
            return
        self.mechanism = mechanism
        self.server = (PlainServer(self.credentials) if mechanism == "PLAIN"
                       else ScramServer(mechanism, self.credentials))
        self.raw = header.api_version == 0
        self.host.answer(chunks)

    def _token(self, token: bytes, header: RequestHeader | None) -> None:
        assert self.server is not None
        try:
            answer, principal = self.server.step(token)
        except AuthenticationFailed as exc:
            chunks: Chunks | None = None
            if header is not None:
                chunks = self._authenticate_response(header, ErrorCode.sasl_authentication_failed,
                                                     exc.message, b"")
            self._failed(exc, chunks)
            return
        if header is None:
            self.host.answer([_SIZE.pack(len(answer)), answer])
        else:
            self.host.answer(
                self._authenticate_response(header, ErrorCode.none, None, answer))
        if principal is not None:
            self.metrics.authentication_successes += 1
            self.host.authenticated(principal)

    @staticmethod
    def _authenticate_response(header: RequestHeader, code: ErrorCode, message: str | None,
                               auth_bytes: bytes) -> Chunks:
        schema = response_schema(SASL_AUTHENTICATE_KEY, header.api_version)
        body = build(schema.SaslAuthenticateResponse, error_code=code, error_message=message,
                     auth_bytes=auth_bytes)
        return encode_response(SASL_AUTHENTICATE_KEY, header.correlation_id, body)

    def oversized(self, size: int) -> None:
        """A frame's size prefix over ``sasl.server.max.receive.size``: Kafka fails the
        authentication ("invalid receive size") without reading on or answering."""
        self._failed(AuthenticationFailed(
            "", f"invalid receive size {size} (sasl.server.max.receive.size is "
                f"{self.max_receive_size})", None), None)

    def _failed(self, exc: AuthenticationFailed, chunks: Chunks | None) -> None:
        """Count and log it; the connection answers ``chunks`` (if any) and closes
        after the delay."""
        host = self.host
        self.metrics.authentication_failures += 1
        user = f"User:{client_text(exc.user)}" if exc.user else "an unnamed user"
        self.bad_input.log(
            host.address, logging.WARNING,
            "failed authentication of %s from %s on listener %s (%s): %s", user,
            host.peer, self.listener.name, self.mechanism or "handshake",
            client_text(exc.reason))
        host.fail_authentication(chunks)
