"""Read a /metrics page the way Prometheus does (prometheus_client's parser)."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Sample = tuple[str, frozenset[tuple[str, str]]]


def scrape(admin: str, timeout: float = 30) -> str:
    with urllib.request.urlopen(f"http://{admin}/metrics", timeout=timeout) as response:
        return response.read().decode()


def samples(text: str) -> dict[Sample, float]:
    """{(sample name, labels): value}; the parser refuses a malformed page."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(parsed: dict[Sample, float], name: str, **labels: str) -> float:
    return parsed[(name, frozenset(labels.items()))]

