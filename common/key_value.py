"""``KEY=VALUE`` command-line arguments into a dict: the one parser of the
``kafka-gateway`` commands (``--config``, ``--set``, ``--property``,
``--producer-property``, ``--consumer-property``) and of ``python -m spark_jobs``
(``--conf``).

In ``common``, importing nothing, because its two users must not import each
other: the Spark image holds ``spark_jobs`` without the gateway (spark.Dockerfile
copies ``common/`` beside it), and the gateway's wheel does not ship
``spark_jobs``.
"""

from __future__ import annotations

from collections.abc import Iterable


def parse_pairs(items: Iterable[str], what: str) -> dict[str, str]:
    """Each item split at its first ``=`` (a value may hold more); the last of a
    repeated key wins. An item without ``=`` ends the command with a message
    naming ``what`` (the program and option)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"{what}: expected KEY=VALUE, got {item!r}")
        out[key] = value
    return out
