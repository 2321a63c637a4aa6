"""Producer ids: one node-wide counter, persisted with each allocation.

An id is never handed out twice, not even after ``kill -9``: the counter is
in the same store write as whatever the id was allocated for (InitProducerId
persists the transactional id's new state with it).
"""

from __future__ import annotations

from tablets.seam import AtomicChange, TransactionStorage

_COUNTER = "producer.id"


class ProducerIds:
    def __init__(self, storage: TransactionStorage) -> None:
        self.storage = storage
        last = storage.counter(_COUNTER)
        self._last = -1 if last is None else last

    def allocate(self, ops: AtomicChange) -> int:
        """A new id; ``ops`` must be written before the id is used. It follows
        the last one this node handed out, or the storage's counter if that
        is ahead (several gateways share one counter: one that lost a race
        learns the newer value from its storage)."""
        self._last = max(self._last, _or(self.storage.counter(_COUNTER), -1)) + 1
        self.storage.set_counter(ops, _COUNTER, self._last)
        return self._last


def _or(value: int | None, default: int) -> int:
    return default if value is None else value
