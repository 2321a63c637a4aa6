"""The RocksDB engine's keeping of a partition's closed virtual segments.

Kafka's roll rules and the segment arithmetic are engine-free in
``segment_rules``; this module is their persistence port on RocksDB: a
closed segment is the key ``keys.SEGMENT`` + the partition prefix + its base
offset, its value ``Segment.encode()``, put and deleted in the same ``Ops``
(one WriteBatch) as the change that closed, resized, merged or dropped it.
The active segment is in the partition's meta record (``tablet.meta``).
"""

from __future__ import annotations

from collections.abc import Iterator

from . import keys
from .rocks_store import Ops, RocksStore
from .segment_rules import Segment, Segments


class StoredSegments:
    """``SegmentPersistence`` over RocksDB keys, with ``Ops`` as the change."""

    def __init__(self, store: RocksStore, prefix: bytes) -> None:
        self.store = store
        self.prefix = prefix

    def key(self, base: int) -> bytes:
        return keys.offset_key(keys.SEGMENT, self.prefix, base)

    def load(self) -> Iterator[Segment]:
        start = keys.SEGMENT + self.prefix
        for key, value in self.store.scan(start, start + b"\xff" * 8):
            yield Segment.decode(keys.offset_of_key(key), value)

    def stage_segment(self, change: Ops, segment: Segment) -> None:
        change.put(self.key(segment.base), segment.encode())

    def stage_removal(self, change: Ops, base: int) -> None:
        change.delete(self.key(base))

    def stage_removal_below(self, change: Ops, base: int) -> None:
        change.delete_range(self.key(0), self.key(base))


def stored_segments(store: RocksStore, prefix: bytes) -> Segments[Ops]:
    """The segments of the partition ``prefix`` names, closed ones kept in ``store``."""
    return Segments(StoredSegments(store, prefix))
