"""Partition tablets: the storage layer. Knows nothing of the wire protocol."""

from .cleaner import CleanerSettings
from .engine import EngineSettings, StorageEngine, Topic
from .log_reads import ReadResult
from .tablet import AppendResult, PartitionTablet

__all__ = [
    "AppendResult",
    "CleanerSettings",
    "EngineSettings",
    "PartitionTablet",
    "ReadResult",
    "StorageEngine",
    "Topic",
]
