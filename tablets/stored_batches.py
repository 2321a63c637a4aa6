"""The RocksDB engine's batches in offset order, as a compaction run reads
them (``compaction.BatchesInOrder``): the partition's ``L`` entries scanned
from the one holding the start, each batch read from its segment file on the
cleaner's thread."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from . import batch as batch_header
from . import keys, log_entry
from .compaction import Aborted
from .rocks_store import RocksStore

Read = Callable[[bytes], bytes]  # a log entry -> its batch (``PartitionTablet.read_entry``)


class StoredBatches:
    def __init__(self, store: RocksStore, prefix: bytes, read: Read) -> None:
        self.store = store
        self.prefix = prefix
        self.read = read

    def batches(self, start: int, end: int) -> Iterator[tuple[bytes, int, bytes]]:
        prefix = self.prefix
        floor = keys.LOG + prefix
        for _key, entry in self.store.scan_from_containing(
                keys.offset_key(keys.LOG, prefix, start), floor,
                keys.offset_key(keys.LOG, prefix, end)):
            if batch_header.last_offset_of(entry) < start:
                continue
            try:
                batch = self.read(entry)
            except log_entry.MissingBlob:  # retention deleted it: this run is stale
                raise Aborted("a segment file went while compacting") from None
            yield entry, log_entry.size(entry), batch
