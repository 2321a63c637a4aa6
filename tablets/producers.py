"""The RocksDB engine's keeping of idempotent producers' state.

The rules (Kafka's ProducerStateManager checks, the cached batches, expiry,
eviction) are engine-free in ``producer_rules``; this module is their
persistence port on RocksDB: one partition's entries live under
``keys.PRODUCER`` + the partition prefix + the producer id (int64), each
value ``ProducerEntry.encode()``, put and deleted in the same ``Ops`` (one
WriteBatch) as the data they describe.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from . import keys
from .producer_rules import ProducerEntry, ProducerStates
from .rocks_store import Ops, RocksStore

_PID = struct.Struct(">q")


def producer_key(prefix: bytes, producer_id: int) -> bytes:
    """The key of a producer's entry in the partition ``prefix`` names."""
    return keys.PRODUCER + prefix + _PID.pack(producer_id)


class StoredProducers:
    """``ProducerPersistence`` over RocksDB keys, with ``Ops`` as the change."""

    def __init__(self, store: RocksStore, prefix: bytes) -> None:
        self.store = store
        self.prefix = prefix

    def key(self, producer_id: int) -> bytes:
        return producer_key(self.prefix, producer_id)

    def load(self) -> Iterator[tuple[int, ProducerEntry]]:
        start = keys.PRODUCER + self.prefix
        for key, value in self.store.scan(start, start + b"\xff" * 8):
            yield _PID.unpack_from(key, len(start))[0], ProducerEntry.decode(value)

    def stage_entry(self, change: Ops, producer_id: int, entry: ProducerEntry) -> None:
        change.put(self.key(producer_id), entry.encode())

    def stage_removal(self, change: Ops, producer_id: int) -> None:
        change.delete(self.key(producer_id))


def producer_states(store: RocksStore, prefix: bytes, max_producers: int) -> ProducerStates[Ops]:
    """The producers of the partition ``prefix`` names, kept in ``store``."""
    return ProducerStates(StoredProducers(store, prefix), max_producers)
