"""SCRAM credentials (RFC 5802/7677): salted, in the store, never the password.

A user may have one credential per mechanism (SCRAM-SHA-256, SCRAM-SHA-512),
each a salt, an iteration count (4096 to 16384, as Kafka allows), and the
stored and server keys derived from the salted password. The SCRAM exchange
itself is the ``scramp`` library's. SASL/PLAIN checks a password against the
same credentials (the salted password is derived again and compared), so
PLAIN needs no password kept anywhere either.

Stored as ``keys.SCRAM_CREDENTIAL`` records: user, NUL, mechanism -> JSON.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
from collections.abc import Callable
from dataclasses import dataclass

from scramp import ScramException, ScramMechanism

from tablets.seam import NodeRecordStore

# Mechanism name -> (hash, code in Describe/AlterUserScramCredentials).
MECHANISMS: dict[str, tuple[Callable[..., hashlib._Hash], int]] = {
    "SCRAM-SHA-256": (hashlib.sha256, 1),
    "SCRAM-SHA-512": (hashlib.sha512, 2),
}
BY_CODE = {code: name for name, (_hash, code) in MECHANISMS.items()}
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384
DEFAULT_ITERATIONS = 4096


class CredentialError(ValueError):
    """A credential that cannot be kept (mechanism, iterations, empty user)."""


@dataclass(frozen=True, slots=True)
class ScramCredential:
    mechanism: str
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def encode(self) -> bytes:
        b64 = base64.b64encode
        return json.dumps({"salt": b64(self.salt).decode(), "stored": b64(self.stored_key).decode(),
                           "server": b64(self.server_key).decode(),
                           "iterations": self.iterations}).encode()

    @classmethod
    def decode(cls, mechanism: str, value: bytes) -> ScramCredential:
        raw = json.loads(value)
        b64 = base64.b64decode
        return cls(mechanism, b64(raw["salt"]), b64(raw["stored"]), b64(raw["server"]),
                   int(raw["iterations"]))

    def auth_info(self) -> tuple[bytes, bytes, bytes, int]:
        """What scramp's server asks for a user."""
        return self.salt, self.stored_key, self.server_key, self.iterations


def check(mechanism: str, iterations: int) -> None:
    if mechanism not in MECHANISMS:
        raise CredentialError(f"unknown SCRAM mechanism {mechanism!r}")
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise CredentialError(f"iterations must be {MIN_ITERATIONS} to {MAX_ITERATIONS}, "
                              f"got {iterations}")


def from_password(mechanism: str, password: str,
                  iterations: int = DEFAULT_ITERATIONS) -> ScramCredential:
    """A new credential with a fresh random salt."""
    check(mechanism, iterations)
    salt, stored, server, count = ScramMechanism(mechanism).make_auth_info(
        password, iteration_count=iterations)
    return ScramCredential(mechanism, salt, stored, server, count)


def from_salted_password(mechanism: str, salt: bytes, salted_password: bytes,
                         iterations: int) -> ScramCredential:
    """A credential from what AlterUserScramCredentials carries (the client salted it)."""
    check(mechanism, iterations)
    digest = MECHANISMS[mechanism][0]
    client_key = hmac.digest(salted_password, b"Client Key", digest)
    server_key = hmac.digest(salted_password, b"Server Key", digest)
    return ScramCredential(mechanism, salt, digest(client_key).digest(), server_key, iterations)


def _name(user: str, mechanism: str) -> bytes:
    return user.encode() + b"\x00" + mechanism.encode()


class Credentials:
    """Every user's SCRAM credentials, in memory, written through to the store."""

    def __init__(self, records: NodeRecordStore) -> None:
        self.records = records

    def get(self, user: str, mechanism: str) -> ScramCredential | None:
        value = self.records.get(_name(user, mechanism))
        return None if value is None else ScramCredential.decode(mechanism, value)

    def users(self) -> dict[str, list[ScramCredential]]:
        out: dict[str, list[ScramCredential]] = {}
        for name, value in sorted(self.records.records.items()):
            user, _, mechanism = name.decode().partition("\x00")
            out.setdefault(user, []).append(ScramCredential.decode(mechanism, value))
        return out

    @staticmethod
    def _puts(upserts: list[tuple[str, ScramCredential]]) -> dict[bytes, bytes]:
        for user, _credential in upserts:
            if not user:
                raise CredentialError("the user name is empty")
        return {_name(user, c.mechanism): c.encode() for user, c in upserts}

    async def change(self, upserts: list[tuple[str, ScramCredential]],
                     deletions: list[tuple[str, str]]) -> None:
        """Set and delete credentials, all in one atomic write."""
        await self.records.change(self._puts(upserts), [_name(u, m) for u, m in deletions])

    def change_now(self, upserts: list[tuple[str, ScramCredential]],
                   deletions: list[tuple[str, str]]) -> None:
        """The same offline (the CLI, with the gateway stopped)."""
        self.records.change_now(self._puts(upserts), [_name(u, m) for u, m in deletions])

    def check_password(self, user: str, password: str) -> bool:
        """SASL/PLAIN: does ``password`` derive the user's stored key (any mechanism)?

        An unknown user costs the same derivation, so timing does not tell
        which users exist."""
        credential = self.get(user, "SCRAM-SHA-512") or self.get(user, "SCRAM-SHA-256")
        probe = credential or _DECOY
        try:
            _salt, stored, _server, _count = ScramMechanism(probe.mechanism).make_auth_info(
                password, iteration_count=probe.iterations, salt=probe.salt)
        except ScramException:
            return False  # a password saslprep refuses
        return credential is not None and hmac.compare_digest(stored, credential.stored_key)


_DECOY = ScramCredential("SCRAM-SHA-512", os.urandom(32), b"", b"", DEFAULT_ITERATIONS)
