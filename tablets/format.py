"""The data directory's format, and the migration from format 1.

Format 1 (before segment files): record batches inline in the ``L`` keys,
transactional batches in ``B`` keys (pending, then referenced by the log).
Format 2: record bytes in segment files (``segment_files``), the ``L`` and
``B`` keys hold where they lie. The version is the ``keys.FORMAT`` key.

At start-up (``StorageEngine.start``): a directory without the key that holds
topics is of format 1 and is migrated, partition by partition, before it is
used: each batch is appended to a segment file and its entry rewritten, in
chunks of ``MIGRATION_CHUNK_BYTES``, each synced (files, then one RocksDB
write) whatever ``gateway.fsync`` says. A migration stopped half-way (a crash)
goes on where it stopped at the next start: entries already moved are file
entries and are left alone. A directory of a newer format is refused.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from . import keys, log_entry
from .rocks_store import Ops

if TYPE_CHECKING:
    from .rocks_store import RocksStore
    from .segment_files import PartitionFiles


class Migrating(Protocol):
    """What the migration reads and writes of a tablet (``PartitionTablet``)."""

    store: RocksStore
    files: PartitionFiles
    prefix: bytes

    @property
    def name(self) -> str: ...

log = logging.getLogger(__name__)

FORMAT_VERSION = 2
MIGRATION_CHUNK_BYTES = 16 << 20
_BIG = 1 << 62  # no time-based roll while migrating


class UnsupportedFormat(RuntimeError):
    """The data directory was written by a newer gateway."""


def needs_migration(store: RocksStore) -> bool:
    """Whether the directory is of format 1 (raises for an unknown format)."""
    raw = store.get(keys.FORMAT)
    if raw is None:
        # A new directory holds no topic yet; one of format 1 does (or holds
        # nothing of a log, and the migration has nothing to do).
        return any(True for _ in store.scan(keys.TOPIC, keys.TOPIC + b"\xff"))
    version = int(raw)
    if version > FORMAT_VERSION:
        raise UnsupportedFormat(
            f"the data directory {store.path} is of storage format {version}, written by a "
            f"newer gateway; this one reads format {FORMAT_VERSION} and older. Start the "
            "newer gateway on it, or point gateway.data.dir at another directory")
    return version < FORMAT_VERSION


def mark_current(store: RocksStore) -> None:
    ops = Ops()
    ops.put(keys.FORMAT, str(FORMAT_VERSION).encode())
    store.write_now(ops, durable=True)


def migrate_partition(tablet: Migrating) -> None:
    """Move one partition's batches (log and pending) into segment files."""
    store, files = tablet.store, tablet.files
    ops = Ops()
    pending = moved = 0

    def flush() -> None:
        nonlocal ops, pending
        if ops.puts:
            store.write_now(ops, durable=True)
        ops, pending = Ops(), 0

    floor = keys.LOG + tablet.prefix
    for key, entry in store.scan(floor, floor + b"\xff" * 8):
        if log_entry.is_file(entry):
            continue
        base = log_entry.base_offset(entry)
        if log_entry.is_reference(entry):
            blob_key = log_entry.blob_key(entry)
            data = store.get(blob_key)
            if data is None:
                raise log_entry.MissingBlob(
                    f"{tablet.name}: the log entry at offset {base} names blob "
                    f"{blob_key.hex()}, which the store does not hold; the data directory "
                    "is corrupt and can not be migrated")
            no, position = files.append(data, ops, _BIG, _BIG, 0)
            ops.put(key, log_entry.file_entry(entry, base, no, position, True))
            ops.delete(blob_key)
        else:
            data = entry
            no, position = files.append(data, ops, _BIG, _BIG, 0)
            ops.put(key, log_entry.file_entry(entry, base, no, position, False))
        pending += len(data)
        moved += 1
        if pending >= MIGRATION_CHUNK_BYTES:
            flush()
    flush()  # the blobs of committed batches are deleted before the pending ones are read
    start = keys.TXN_BLOB + tablet.prefix
    for key, value in store.scan(start, start + b"\xff" * 12):
        if log_entry.is_file(value):
            continue
        no, position = files.append(value, ops, _BIG, _BIG, 0)
        ops.put(key, log_entry.file_entry(value, 0, no, position, False))
        pending += len(value)
        moved += 1
        if pending >= MIGRATION_CHUNK_BYTES:
            flush()
    flush()
    if moved:
        log.warning("%s: migrated %d batches from RocksDB into segment files (format 1 -> %d)",
                    tablet.name, moved, FORMAT_VERSION)
