"""Small node-wide records of one key kind, kept whole in memory.

For what the security layer keeps in the store (SCRAM credentials, ACLs):
a few records, read on every authentication or authorization, changed
rarely. Each is one key (``kind`` + name) and an opaque value; a change of
several records is one atomic write, visible once it is in the WAL. The
storage layer does not know what the bytes mean.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from . import keys
from .rocks_store import Ops, RocksStore
from .seam import NodeRecordKind
from .store import GroupCommitWriter

# The kinds of node record, by the name the seam gives them.
NODE_RECORD_KINDS = {"acl": keys.ACL, "scram": keys.SCRAM_CREDENTIAL}


class NodeRecords:
    def __init__(self, store: RocksStore, kind: bytes,
                 writer: GroupCommitWriter | None = None) -> None:
        self.store = store
        self.kind = kind
        self.writer = writer  # None: changed offline, with the gateway stopped
        self.records: dict[bytes, bytes] = {
            key[len(kind):]: value for key, value in store.scan(kind, kind + b"\xff")
        }

    def get(self, name: bytes) -> bytes | None:
        return self.records.get(name)

    def _ops(self, puts: dict[bytes, bytes], deletes: Iterable[bytes]) -> Ops:
        ops = Ops()
        for name in deletes:
            ops.delete(self.kind + name)
        for name, value in puts.items():
            ops.put(self.kind + name, value)
        return ops

    def _applied(self, puts: dict[bytes, bytes], deletes: Iterable[bytes]) -> None:
        for name in deletes:
            self.records.pop(name, None)
        self.records.update(puts)

    async def change(self, puts: dict[bytes, bytes], deletes: Iterable[bytes] = ()) -> None:
        """Write ``puts`` and delete ``deletes`` atomically; visible once in the WAL."""
        assert self.writer is not None, "records opened offline"
        deletes = list(deletes)
        await self.writer.submit(self._ops(puts, deletes))
        self._applied(puts, deletes)

    def change_now(self, puts: dict[bytes, bytes], deletes: Iterable[bytes] = ()) -> None:
        """The same, synchronously: for the CLI with the gateway stopped."""
        deletes = list(deletes)
        self.store.write_now(self._ops(puts, deletes))
        self._applied(puts, deletes)


class OfflineNodeRecords(NodeRecords):
    """One kind of node record of a stopped gateway's data directory (the
    security CLI): opens the store itself, and closes it."""

    def __init__(self, data_dir: str, kind: NodeRecordKind) -> None:
        super().__init__(RocksStore(os.path.join(data_dir, "rocksdb")), NODE_RECORD_KINDS[kind])

    def close(self) -> None:
        self.store.close()


def open_node_records(data_dir: str, kind: NodeRecordKind) -> OfflineNodeRecords:
    """One kind of node record ("acl", "scram") of a stopped gateway's data
    directory; close it when done."""
    return OfflineNodeRecords(data_dir, kind)
