"""Log entries: what a partition's ``L`` key holds, and the one decoder for them.

An entry is either a record batch stored inline (a plain produce), or a
*reference* to a transactional blob (``keys.TXN_BLOB``), written when its
transaction commits: the batch's bytes were stored once, when they were
produced, and a commit only writes these small references (YDB publishes by
renaming keys, not by copying data).

Both kinds begin with the batch's 61-byte header, base offset patched, so the
base offset, last offset, max timestamp and size read the same way for both
(``tablets.batch``'s accessors work on either). A reference has
``REFERENCE_MAGIC`` where a batch has magic 2, and the blob's key after the
header. Every reader of log entries (fetch, size retention, truncation,
timestamp lookup) goes through ``resolve``; the base offset and leader epoch
are patched on the way out, both outside the CRC.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from .batch import HEADER_SIZE, LOG_OVERHEAD

LEADER_EPOCH = 0  # one copy, one leader, forever: the epoch never changes
REFERENCE_MAGIC = 0x7E
_MAGIC_AT = 16
_LENGTH = struct.Struct(">i")
_OFFSET_AND_LENGTH = struct.Struct(">qi")
_EPOCH = struct.Struct(">i")


class MissingBlob(RuntimeError):
    """A log entry names a blob the store does not hold: the log is corrupt."""


def reference(blob: bytes | memoryview, base_offset: int, leader_epoch: int,
              blob_key: bytes) -> bytes:
    """The log entry of a committed transactional batch stored at ``blob_key``."""
    return b"".join((
        _OFFSET_AND_LENGTH.pack(base_offset, _LENGTH.unpack_from(blob, 8)[0]),
        _EPOCH.pack(leader_epoch),
        bytes((REFERENCE_MAGIC,)),
        bytes(blob[_MAGIC_AT + 1 : HEADER_SIZE]),
        blob_key,
    ))


def is_reference(entry: bytes | memoryview) -> bool:
    return entry[_MAGIC_AT] == REFERENCE_MAGIC


def size(entry: bytes | memoryview) -> int:
    """The size of the batch an entry stands for (not of the entry itself)."""
    length: int = _LENGTH.unpack_from(entry, 8)[0]
    return length + LOG_OVERHEAD


def blob_key(entry: bytes | memoryview) -> bytes:
    return bytes(entry[HEADER_SIZE:])


def patch(blob: bytes | memoryview, base_offset: int, leader_epoch: int) -> bytes:
    """A stored blob with the offset and leader epoch it has in the log (one copy)."""
    view = memoryview(blob)
    return b"".join((_OFFSET_AND_LENGTH.pack(base_offset, _LENGTH.unpack_from(view, 8)[0]),
                     _EPOCH.pack(leader_epoch), view[_MAGIC_AT:]))


def resolve(entry: bytes, get: Callable[[bytes], bytes | None]) -> bytes:
    """The record batch an entry stands for; ``get`` reads a blob from the store."""
    if not is_reference(entry):
        return entry
    key = blob_key(entry)
    blob = get(key)
    if blob is None:
        raise MissingBlob(f"log entry at offset {struct.unpack_from('>q', entry)[0]} names "
                          f"blob {key.hex()}, which the store does not hold")
    return patch(blob, *_offset_and_epoch(entry))


def _offset_and_epoch(entry: bytes) -> tuple[int, int]:
    return struct.unpack_from(">q", entry)[0], _EPOCH.unpack_from(entry, 12)[0]
