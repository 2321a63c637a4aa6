"""The wall clock in Kafka's unit: milliseconds since the epoch."""

from __future__ import annotations

import time


def now_ms() -> int:
    """Now, in milliseconds since the epoch (Kafka's timestamps)."""
    return time.time_ns() // 1_000_000
