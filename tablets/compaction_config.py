"""CompactionConfig: a compacted topic's configs, as compaction reads them;
CleanerSettings: the node's log.cleaner.* settings.

Their own module, apart from the compaction run and the RocksDB engine's
cleaner, so that ``tablet_settings`` and what names it (the engine-free
checks of ``validate``), and the PostgreSQL store's cleaner, do not reach
the RocksDB engine.
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


@dataclass(frozen=True, slots=True)
class CleanerSettings:
    """The node's log cleaner settings (both engines' cleaners read them)."""

    enable: bool = True  # log.cleaner.enable
    backoff_ms: int = 15_000  # log.cleaner.backoff.ms
    dedupe_buffer_bytes: int = 128 << 20  # log.cleaner.dedupe.buffer.size
    io_max_bytes_per_second: float = float("inf")  # log.cleaner.io.max.bytes.per.second
    # log.cleaner.io.buffer.size: new bytes per swap (compaction.CHUNK_BYTES)
    io_buffer_bytes: int = 512 << 10
