"""What a SASL listener's connection does for its ``SaslGate`` (security/sasl.py),
which sees every frame until the client has authenticated: ApiVersions,
SaslHandshake, SaslAuthenticate only, one request at a time, as Kafka serves
them; frames no larger than ``sasl.server.max.receive.size`` (framing.py). A
failed authentication mutes the connection and ends it
``connection.failed.authentication.delay.ms`` later, by a timer. Once
authenticated the gate steps aside: the frame path is the same as without
security. ``SaslHooks`` is the gate's ``GateHost``: the gate is handed it,
never the connection."""

from __future__ import annotations

from collections.abc import Callable

from .answers import Answers, Chunks
from .state import MAX_IN_FLIGHT, ConnectionState
from .timers import ConnectionTimers


class SaslHooks:
    def __init__(self, state: ConnectionState, answers: Answers, timers: ConnectionTimers,
                 failed_authentication_delay_ms: int,
                 update_reading: Callable[[], None]) -> None:
        self.state = state
        self.answers = answers
        self.timers = timers
        self.delay = failed_authentication_delay_ms / 1000
        self.update_reading = update_reading

    @property
    def address(self) -> str:
        return self.state.address

    @property
    def peer(self) -> str:
        return self.state.peer

    def reject(self, reason: str) -> None:
        self.state.reject(reason)

    def answer(self, chunks: Chunks, close: bool = False) -> None:
        """An answer of the gate, written at once: before authentication one
        request is served at a time, so no other answer is due before it.
        ``close``: the last one (a failed authentication); the socket closes once
        it is written."""
        state = self.state
        assert not self.answers.pending
        if state.transport is not None and not state.closing:
            state.transport.writelines(chunks)
            state.metrics.bytes_out += sum(map(len, chunks))
            state.active()
        if close:
            state.close()

    def authenticated(self, principal: str) -> None:
        """The gate is done: from now on frames take the ordinary path."""
        state = self.state
        assert state.session is not None
        state.session.principal = principal
        state.gate = None
        state.max_in_flight = MAX_IN_FLIGHT

    def fail_authentication(self, chunks: Chunks | None) -> None:
        """End a failed SASL authentication as Kafka does: the connection is muted at
        once (nothing more read or served), and ``connection.failed.authentication.delay.ms``
        later its answer, if any, is written and it is closed. A timer: the delay holds
        up nothing but this connection, and slows down guessing passwords."""
        self.state.max_in_flight = 0  # saturated: no frame is taken, reading pauses
        self.update_reading()
        if self.delay <= 0:
            self.answer(chunks or (), close=True)
        else:
            self.timers.after(self.delay, lambda: self.answer(chunks or (), close=True))
