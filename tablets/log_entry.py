"""Log entries: what a partition's ``L`` key (and a pending ``B`` key) holds.

Format 2 (``segment_files``): an entry is a *file entry*, the batch's 61-byte
header (base offset patched) with ``FILE_MAGIC`` where a batch has magic 2,
then where the batch's bytes lie: segment file number, position, and whether
the bytes in the file carry another base offset (``SHIFTED``: a transactional
batch, written when produced with base offset 0, before its commit gave it
offsets). A commit writes these small entries only (YDB publishes by renaming
keys, not by copying data).

Format 1 (today's data directories before migration, ``format``): a record
batch stored inline, or a *reference* (``REFERENCE_MAGIC``) to a
transactional blob (``keys.TXN_BLOB``) holding the batch. Only the migration
reads them (``resolve``).

Every kind begins with the batch's header, so the base offset, last offset,
max timestamp and size read the same way for all (``tablets.batch``'s
accessors work on either). The base offset and leader epoch, both outside the
CRC, are patched on the way out.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from .batch import HEADER_SIZE, LOG_OVERHEAD

LEADER_EPOCH = 0  # one copy, one leader, forever: the epoch never changes
REFERENCE_MAGIC = 0x7E
FILE_MAGIC = 0x7D
SHIFTED = 1  # the file's copy has base offset 0: patch the first 16 bytes when read
_LOCATOR = struct.Struct(">qqB")  # file number, position, flags
# Base offset, length, last offset delta (at 23), then the locator (at 61).
_SPAN = struct.Struct(">qi11xi34xqqB")
PREFIX_SIZE = 16  # base offset, length, leader epoch: what a patch rewrites
CRC_AT = 17
_MAGIC_AT = 16
_LENGTH = struct.Struct(">i")
_OFFSET_AND_LENGTH = struct.Struct(">qi")
_EPOCH = struct.Struct(">i")
# A whole file entry in one pack: base offset, length, leader epoch, FILE_MAGIC,
# the rest of the header (from the CRC), then the locator.
_FILE_ENTRY = struct.Struct(">qiiB44sqqB")


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


# ------------------------------------------------------------ file entries
def file_entry(header: bytes | memoryview, base_offset: int, file_no: int, position: int,
               shifted: bool) -> bytes:
    """The entry of a batch (``header``: its first 61 bytes) lying in a segment file."""
    return _FILE_ENTRY.pack(base_offset, _LENGTH.unpack_from(header, 8)[0], LEADER_EPOCH,
                            FILE_MAGIC, bytes(header[_MAGIC_AT + 1 : HEADER_SIZE]), file_no,
                            position, SHIFTED if shifted else 0)


def is_file(entry: bytes | memoryview) -> bool:
    return entry[_MAGIC_AT] == FILE_MAGIC


def locate(entry: bytes | memoryview) -> tuple[int, int, int, bool]:
    """(file number, position, size, shifted) of a file entry."""
    file_no, position, flags = _LOCATOR.unpack_from(entry, HEADER_SIZE)
    return file_no, position, size(entry), bool(flags & SHIFTED)


def span(entry: bytes | memoryview) -> tuple[int, int, int, int, int, bool]:
    """(base offset, last offset, size, file number, position, shifted) of a
    file entry, in one unpack (the read path walks many)."""
    base, length, delta, file_no, position, flags = _SPAN.unpack_from(entry)
    return base, base + delta, length + LOG_OVERHEAD, file_no, position, bool(flags & SHIFTED)


def rebase(entry: bytes, base_offset: int) -> bytes:
    """A pending batch's file entry as committed at ``base_offset``."""
    file_no, position, _size, _shifted = locate(entry)
    return file_entry(entry, base_offset, file_no, position, True)


def base_offset(entry: bytes | memoryview) -> int:
    offset: int = struct.unpack_from(">q", entry)[0]
    return offset
