"""Partition tablets: the storage layer. Knows nothing of the wire protocol."""

from .cleaner import CleanerSettings
from .engine import EngineSettings, StorageEngine, Topic
from .tablet import AppendResult, PartitionTablet, ReadResult

__all__ = [
    "AppendResult",
    "CleanerSettings",
    "EngineSettings",
    "PartitionTablet",
    "ReadResult",
    "StorageEngine",
    "Topic",
]
