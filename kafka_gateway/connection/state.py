"""What the parts of one connection share: its transport and peer, whether it
is closing or cannot write, when it was last active, and how many requests it
may have in flight."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Protocol

from ..bad_input import BadInputLog
from ..metrics import Metrics

if TYPE_CHECKING:
    from ..security.sasl import SaslGate
    from ..security.session import Session

MAX_IN_FLIGHT = 64


class SocketLike(Protocol):
    """A transport's socket (uvloop's pseudo-socket, the stdlib's TransportSocket):
    what sending file regions on it uses (regions.py)."""

    def fileno(self) -> int: ...

    def setsockopt(self, level: int, option: int, value: int, /) -> None: ...


class ConnectionState:
    def __init__(self, loop: asyncio.AbstractEventLoop, metrics: Metrics,
                 bad_input: BadInputLog) -> None:
        self.loop = loop
        self.metrics = metrics
        self.bad_input = bad_input
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.address = "?"
        self.client_host = ""
        # Listener and principal, handed to every request; set once the transport is up.
        self.session: Session | None = None
        self.closing = False
        self.reading_paused = False
        self.writing_paused = False  # the transport's buffer is full (pause_writing)
        # A file region of an answer waits for the socket (regions.py): as above.
        self.sendfile_waiting = False
        # The transport's socket, on plaintext listeners: answers' file regions
        # are sent on it with os.sendfile (regions.py). None on TLS listeners.
        self.sendfile_socket: SocketLike | None = None
        self.last_active = self.last_read = loop.time()
        self.max_in_flight = MAX_IN_FLIGHT
        # Until a SASL client has authenticated: what sees its frames first.
        self.gate: SaslGate | None = None

    @property
    def cannot_write(self) -> bool:
        """The socket takes nothing now: the transport's buffer is full, or a
        file region waits to be sent."""
        return self.writing_paused or self.sendfile_waiting

    def active(self) -> None:
        """Bytes went either way: the connection is not idle."""
        self.last_active = self.loop.time()

    def reject(self, reason: str) -> None:
        """Bad input (a malformed or oversized frame, an API not served): logged,
        counted, and this connection closed."""
        self.bad_input.log(self.address, logging.WARNING,
                           "closing connection from %s: %s", self.peer, reason)
        self.metrics.bad_frames += 1
        self.close()

    def close(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.close()
