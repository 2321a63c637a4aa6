"""What the gateway counts as it serves: plain integers and bucket counts,
cheap on the request path. ``prometheus.py`` renders them (with the store's,
the partitions' and the coordinators' state) when /metrics is scraped.
"""

from __future__ import annotations

import asyncio
import typing
from collections import Counter, defaultdict
from dataclasses import dataclass, field, fields, is_dataclass
from functools import cache
from typing import Any
from uuid import UUID

from kio.schema.errors import ErrorCode

from common.histogram import Histogram

# How late the event loop runs a timer: sampled every this many seconds.
LOOP_LAG_INTERVAL = 0.25
LOOP_LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass(slots=True)
class Metrics:
    requests: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    request_errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    latency: dict[str, Histogram] = field(default_factory=lambda: defaultdict(Histogram))
    # (api, error name) -> partitions, resources or requests answered with that error
    response_errors: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    # topic id -> bytes of record batches appended / returned by Fetch
    topic_bytes_in: dict[UUID, int] = field(default_factory=lambda: defaultdict(int))
    topic_bytes_out: dict[UUID, int] = field(default_factory=lambda: defaultdict(int))
    loop_lag: Histogram = field(default_factory=lambda: Histogram(LOOP_LAG_BUCKETS))
    bytes_in: int = 0
    bytes_out: int = 0
    produced_bytes: int = 0
    fetched_bytes: int = 0
    connections: int = 0
    connections_total: int = 0
    bad_frames: int = 0
    log_lines_suppressed: int = 0  # bad-input warnings over the per-address rate
    connections_expired: int = 0  # closed idle, or stalled in the middle of a frame
    request_memory_bytes: int = 0  # read buffers charged to queued.max.request.bytes
    authentication_successes: int = 0  # SASL
    authentication_failures: int = 0  # SASL: wrong credentials, bad mechanism or messages
    tls_handshake_failures: int = 0  # plaintext on a TLS port, untrusted certificates, ...
    tls_handshakes_in_progress: int = 0  # accepted on a TLS listener, handshake not done
    tls_handshake_timeouts: int = 0  # closed for gateway.ssl.handshake.timeout.ms
    # limit (max.connections, max.connections.per.ip) -> new connections closed for it
    connections_refused: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    authorization_failures: int = 0  # operations an ACL (or no ACL) denied
    response_write_failures: int = 0  # answers the socket refused (connection closed)
    # Record bytes of the engine's files sent without a copy through Python
    # (os.sendfile, plaintext), and read to be sent (TLS).
    sendfile_bytes: int = 0
    file_region_read_bytes: int = 0

    def count_errors(self, api: str, body: Any) -> None:
        """Count the error codes of a response body (a kio entity), as Kafka's
        ErrorsPerSec does; NONE is not counted (requests_total has those)."""
        for key, count in error_counts(api, body).items():
            self.response_errors[key] += count

    async def watch_event_loop(self) -> None:
        """Observe how late the loop wakes a timer, until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            expected = loop.time() + LOOP_LAG_INTERVAL
            await asyncio.sleep(LOOP_LAG_INTERVAL)
            self.loop_lag.observe(max(loop.time() - expected, 0.0))


def error_counts(api: str, body: Any) -> Counter[tuple[str, str]]:
    """(api, error name) -> how often a response body holds that error (not NONE);
    touches no shared state, so it may run off the loop."""
    counts: Counter[tuple[str, str]] = Counter()
    walk = _error_walker(type(body))
    if walk is not None:
        for code in walk(body):
            if code is not ErrorCode.none:
                counts[(api, code.name.upper())] += 1
    return counts


Walker = typing.Callable[[Any], typing.Iterator[ErrorCode]]


@cache
def _error_walker(cls: type) -> Walker | None:
    """A function yielding every ErrorCode field of an entity and its nested
    entities; None for a type with none (planned once per response class)."""
    if not is_dataclass(cls):
        return None
    hints = typing.get_type_hints(cls)
    codes: list[str] = []
    nested: list[tuple[str, Walker, bool]] = []
    for item in fields(cls):
        hint = hints.get(item.name)
        if hint is ErrorCode:
            codes.append(item.name)
            continue
        many = typing.get_origin(hint) is tuple
        inner = typing.get_args(hint)[0] if many else hint
        if isinstance(inner, type) and (walk := _error_walker(inner)) is not None:
            nested.append((item.name, walk, many))
    if not codes and not nested:
        return None

    def walk(entity: Any) -> typing.Iterator[ErrorCode]:
        for name in codes:
            yield getattr(entity, name)
        for name, inner_walk, many in nested:
            value = getattr(entity, name)
            if value is None:
                continue
            for item in value if many else (value,):
                yield from inner_walk(item)

    return walk
