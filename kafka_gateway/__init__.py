"""Kafka-wire-compatible gateway over RocksDB partition tablets."""

__version__ = "0.1.0"
