"""Producer ids: one node-wide counter, persisted with each allocation.

An id is never handed out twice, not even after ``kill -9``: the counter is
in the same store write as whatever the id was allocated for (InitProducerId
persists the transactional id's new state with it).
"""

from __future__ import annotations

import struct

from tablets import keys
from tablets.store import Ops, RocksStore

_KEY = keys.COUNTER + b"producer.id"
_COUNTER = struct.Struct(">q")


class ProducerIds:
    def __init__(self, store: RocksStore) -> None:
        raw = store.get(_KEY)
        self._last = _COUNTER.unpack(raw)[0] if raw else -1

    def allocate(self, ops: Ops) -> int:
        """A new id; ``ops`` must be written before the id is used."""
        self._last += 1
        ops.put(_KEY, _COUNTER.pack(self._last))
        return self._last
