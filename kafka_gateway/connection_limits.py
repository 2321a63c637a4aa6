"""What all connections of a listener share to stay bounded: the node's request
memory (request_memory.py), the bad-input log (bad_input.py) and the idle and
partial-request timeouts."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from .bad_input import BadInputLog
from .metrics import Metrics
from .request_memory import RequestMemory
from .settings import GatewayConfig


@dataclass(slots=True)
class ConnectionLimits:
    """What every connection of a listener shares."""

    memory: RequestMemory
    bad_input: BadInputLog
    idle_seconds: float | None  # connections.max.idle.ms, None: never
    partial_request_seconds: float | None  # gateway.partial.request.timeout.ms, None: never

    @classmethod
    def from_config(cls, config: GatewayConfig, metrics: Metrics,
                    logger: logging.Logger) -> ConnectionLimits:
        def seconds(ms: int) -> float | None:
            return ms / 1000 if ms > 0 else None

        return cls(
            memory=RequestMemory(config.queued_max_request_bytes, metrics),
            bad_input=BadInputLog(logger, metrics),
            idle_seconds=seconds(config.connections_max_idle_ms),
            partial_request_seconds=seconds(config.partial_request_timeout_ms),
        )
