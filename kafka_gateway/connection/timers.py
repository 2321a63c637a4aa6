"""A connection's timeouts.

A connection with no request or response activity for ``connections.max.idle.ms``
is closed (one with a request being served, e.g. a parked long-poll, is not
idle; one whose client stopped reading its answers is), and so is one whose
half-received frame gets no new byte for ``gateway.partial.request.timeout.ms``
while we are reading. One timer checks both, re-armed for the nearer deadline.

A failed SASL authentication ends its connection by a second timer,
``connection.failed.authentication.delay.ms`` later (sasl_hooks.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from .answers import Answers
from .read_buffer import ConnectionBuffer
from .state import ConnectionState

log = logging.getLogger(__package__)


class ConnectionTimers:
    def __init__(self, state: ConnectionState, buffer: ConnectionBuffer, answers: Answers,
                 idle_seconds: float | None, partial_request_seconds: float | None) -> None:
        self.state = state
        self.buffer = buffer
        self.answers = answers
        self.idle = idle_seconds
        self.partial = partial_request_seconds
        self._timer: asyncio.TimerHandle | None = None
        self._failed_authentication: asyncio.TimerHandle | None = None

    def check(self) -> None:
        """Close the connection if idle or stalled mid-frame; else check again later."""
        self._timer = None
        state, idle, partial = self.state, self.idle, self.partial
        if state.closing or (idle is None and partial is None):
            return
        now = state.loop.time()
        # A timeout that starts later is caught one period after it starts at worst.
        deadline = now + min(t for t in (idle, partial) if t is not None)
        if partial is not None and self.buffer.unread > 0 and not state.reading_paused:
            if now - state.last_read >= partial:
                self._expire(f"no byte of a partial request for {partial:g} s", bad=True)
                return
            deadline = min(deadline, state.last_read + partial)
        # Busy means serving a request (a parked long-poll) or waiting for our
        # memory; not a client that stopped reading its answers, whatever it
        # has sent or is owed.
        busy = (self.answers.pending and not state.cannot_write) or self.buffer.awaiting_memory
        if idle is not None and not busy:
            if now - state.last_active >= idle:
                self._expire(f"idle for {idle:g} s", bad=False)
                return
            deadline = min(deadline, state.last_active + idle)
        self._timer = state.loop.call_at(deadline, self.check)

    def _expire(self, reason: str, bad: bool) -> None:
        state = self.state
        state.metrics.connections_expired += 1
        if bad:
            state.bad_input.log(state.address, logging.WARNING,
                                "closing connection from %s: %s", state.peer, reason)
        else:
            log.debug("closing connection from %s: %s", state.peer, reason)
        state.closing = True
        if state.transport is not None:
            state.transport.abort()  # whatever it has not read in all that time is dropped

    def after(self, delay: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` in ``delay`` seconds unless the connection closes first
        (the end of a failed authentication)."""
        self._failed_authentication = self.state.loop.call_later(delay, callback)

    def cancel(self) -> None:
        for timer in (self._timer, self._failed_authentication):
            if timer is not None:
                timer.cancel()
