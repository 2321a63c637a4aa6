"""CompactionConfig: a compacted topic's configs, as compaction reads them.

Its own module, apart from the compaction run (``compaction``, which reads
the RocksDB store), so that ``tablet_settings`` and what names it (the
engine-free checks of ``validate``) do not reach the RocksDB engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CompactionConfig:
    """A compacted topic's configs, as compaction reads them."""

    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = 2**63 - 1
    delete_retention_ms: int = 86_400_000

    @staticmethod
    def of(values: Mapping[str, str]) -> CompactionConfig | None:
        """The config of a topic whose cleanup.policy has "compact", else None."""
        if "compact" not in [p.strip() for p in values["cleanup.policy"].split(",")]:
            return None
        return CompactionConfig(float(values["min.cleanable.dirty.ratio"]),
                                int(values["min.compaction.lag.ms"]),
                                int(values["max.compaction.lag.ms"]),
                                int(values["delete.retention.ms"]))
