"""Bad input logged per client address, rate-limited.

``BadInputLog`` rate-limits the warnings about bad input per client address:
a client that keeps sending garbage (or reconnects to do it again) gets a few
lines a minute, and the rest are counted in ``/metrics``. What a client
chose (a user name, client id, group, transactional id, topic) is logged
through ``common.logtext.client_text``: one bounded line, whatever it holds.
"""

from __future__ import annotations

import logging
import time

from .metrics import Metrics

BAD_INPUT_LINES_PER_WINDOW = 10
BAD_INPUT_WINDOW_SECONDS = 60.0
_MAX_TRACKED_PEERS = 4096


class BadInputLog:
    """At most ``BAD_INPUT_LINES_PER_WINDOW`` lines per client address and window."""

    def __init__(self, logger: logging.Logger, metrics: Metrics) -> None:
        self.logger = logger
        self.metrics = metrics
        # address -> [window start, lines logged in it, lines suppressed since the last one]
        self._peers: dict[str, list[float]] = {}

    def log(self, address: str, level: int, message: str, *args: object,
            exc_info: BaseException | None = None) -> None:
        now = time.monotonic()
        state = self._peers.get(address)
        if state is None or now - state[0] >= BAD_INPUT_WINDOW_SECONDS:
            suppressed = int(state[2]) if state else 0
            state = self._peers[address] = [now, 0, suppressed]
            self._prune(now)
        if state[1] >= BAD_INPUT_LINES_PER_WINDOW:
            state[2] += 1
            self.metrics.log_lines_suppressed += 1
            return
        state[1] += 1
        if state[2]:
            message += " (%d similar lines from this address suppressed)"
            args = (*args, int(state[2]))
            state[2] = 0
        self.logger.log(level, message, *args, exc_info=exc_info)

    def _prune(self, now: float) -> None:
        if len(self._peers) <= _MAX_TRACKED_PEERS:
            return
        for address, state in list(self._peers.items()):
            if now - state[0] >= BAD_INPUT_WINDOW_SECONDS:
                del self._peers[address]
        while len(self._peers) > _MAX_TRACKED_PEERS:  # all recent: forget the oldest
            del self._peers[next(iter(self._peers))]
