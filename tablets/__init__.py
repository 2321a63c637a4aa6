"""Partition tablets: the storage layer. Knows nothing of the wire protocol."""

from .cleaner import CleanerSettings
from .engine import EngineSettings, StorageEngine, Topic, check_topic_name
from .node_records import open_node_records
from .seam import AppendResult, ReadResult
from .tablet import PartitionTablet

__all__ = [
    "AppendResult",
    "CleanerSettings",
    "EngineSettings",
    "PartitionTablet",
    "ReadResult",
    "StorageEngine",
    "Topic",
    "check_topic_name",
    "open_node_records",
]
