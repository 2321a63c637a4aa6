"""Partition tablets: the storage layer. Knows nothing of the wire protocol."""

from .cleaner import CleanerSettings
from .engine import EngineSettings, StorageEngine
from .node_records import open_node_records
from .seam import AppendResult, ReadResult
from .tablet import PartitionTablet
from .topic_catalog import Topic
from .topic_names import check_topic_name

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
