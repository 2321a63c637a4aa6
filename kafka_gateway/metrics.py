"""Counters and latency histograms, exposed in Prometheus text format."""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from dataclasses import dataclass, field


def label(value: object) -> str:
    """A label value as the Prometheus text format writes it: backslash, double
    quote and newline escaped, so no value (a client's group id) can end its
    label and forge a line."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


# Seconds; an operator alarms when simple requests land in the top buckets.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


@dataclass(slots=True)
class Histogram:
    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    total: float = 0.0
    n: int = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.total += seconds
        self.n += 1


@dataclass(slots=True)
class Metrics:
    requests: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    request_errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    latency: dict[str, Histogram] = field(default_factory=lambda: defaultdict(Histogram))
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
    authorization_failures: int = 0  # operations an ACL (or no ACL) denied

    def render(self, extra: dict[str, float]) -> str:
        lines = [
            "# TYPE kafka_gateway_requests_total counter",
            *(f'kafka_gateway_requests_total{{api="{label(a)}"}} {n}'
              for a, n in self.requests.items()),
            "# TYPE kafka_gateway_request_errors_total counter",
            *(
                f'kafka_gateway_request_errors_total{{api="{label(a)}"}} {n}'
                for a, n in self.request_errors.items()
            ),
            "# TYPE kafka_gateway_request_seconds histogram",
        ]
        for name, hist in self.latency.items():
            api = label(name)
            running = 0
            for bound, count in zip((*LATENCY_BUCKETS, "+Inf"), hist.counts, strict=True):
                running += count
                lines.append(f'kafka_gateway_request_seconds_bucket{{api="{api}",le="{bound}"}} '
                             f"{running}")
            lines.append(f'kafka_gateway_request_seconds_sum{{api="{api}"}} {hist.total}')
            lines.append(f'kafka_gateway_request_seconds_count{{api="{api}"}} {hist.n}')
        scalars = {
            "bytes_in_total": self.bytes_in,
            "bytes_out_total": self.bytes_out,
            "produced_bytes_total": self.produced_bytes,
            "fetched_bytes_total": self.fetched_bytes,
            "connections": self.connections,
            "connections_total": self.connections_total,
            "bad_frames_total": self.bad_frames,
            "log_lines_suppressed_total": self.log_lines_suppressed,
            "connections_expired_total": self.connections_expired,
            "request_memory_bytes": self.request_memory_bytes,
            "authentication_successes_total": self.authentication_successes,
            "authentication_failures_total": self.authentication_failures,
            "tls_handshake_failures_total": self.tls_handshake_failures,
            "authorization_failures_total": self.authorization_failures,
            **extra,
        }
        lines.extend(f"kafka_gateway_{name} {value}" for name, value in scalars.items())
        return "\n".join(lines) + "\n"
