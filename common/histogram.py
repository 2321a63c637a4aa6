"""A histogram as cheap to observe as a counter: fixed bucket bounds, one list
slot incremented per observation. The storage layer's write latencies and
group-commit sizes and the gateway's request latencies use it; /metrics turns
the counts into Prometheus histograms when scraped."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

# Seconds; an operator alarms when simple requests land in the top buckets.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                   5.0, 10.0)


class Histogram:
    __slots__ = ("bounds", "counts", "n", "total")

    def __init__(self, bounds: Sequence[float] = LATENCY_BUCKETS) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.total = 0.0
        self.n = 0

    def observe(self, value: float) -> None:
        # bisect_left: a value equal to a bound counts in that bound's bucket (le).
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value
        self.n += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations at or below it), +Inf last."""
        out, running = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out
