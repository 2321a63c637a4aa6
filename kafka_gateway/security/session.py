"""Who is on the other end of one connection, as the handlers see it."""

from __future__ import annotations

from dataclasses import dataclass

from .listeners import Listener

ANONYMOUS = "User:ANONYMOUS"


@dataclass(slots=True)
class Session:
    listener: Listener
    address: str  # the client's IP address, as ACL hosts name it ("127.0.0.1")
    principal: str = ANONYMOUS  # "User:<name>": from SASL, a client certificate, or anonymous
