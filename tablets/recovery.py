"""A partition's start-up checks of its segment files (called by ``Recovering.load``).

1. ``PartitionFiles.load``: bytes past a file's indexed size are cut (they
   were written before a crash and never acknowledged), files no index names
   are deleted.
2. A data directory of format 1 is migrated (``format.migrate_partition``).
3. The newest entries of the log (``CHECK_BYTES``, 4 MiB of batches, counted from
   the log end: bounded work) and every pending transactional batch are read
   back and their batch CRC checked. With ``gateway.fsync=never`` a power
   loss may lose bytes the index (in RocksDB's WAL) still names; the log is
   then cut at the first such entry, with everything after it, and the cut
   is logged (a pending batch whose bytes are bad is dropped from its
   transaction, logged likewise). Nothing torn is ever served.
"""

from __future__ import annotations

import logging
import struct
from bisect import bisect_left
from typing import TYPE_CHECKING, Protocol

from . import keys, log_entry
from .format import migrate_partition
from .rocks_store import Ops

if TYPE_CHECKING:
    from array import array

    from .producer_rules import ProducerStates
    from .rocks_store import RocksStore
    from .segment_files import PartitionFiles
    from .segment_rules import Segments


class Recovering(Protocol):
    """What start-up reads and repairs of a tablet (``PartitionTablet``)."""

    store: RocksStore
    files: PartitionFiles
    prefix: bytes
    meta_key: bytes
    pending: dict[bytes, bytes]
    log_start_offset: int
    log_end_offset: int
    high_watermark: int
    size_bytes: int
    clean_end: int
    segments: Segments[Ops]
    producers: ProducerStates[Ops]
    _ts_offsets: array[int]
    _ts_values: array[int]

    @property
    def name(self) -> str: ...

    def meta(self) -> bytes: ...

log = logging.getLogger(__name__)

CHECK_BYTES = 4 << 20  # of the newest batches, read back at start-up


_TIMESTAMP = struct.Struct(">q")


def load_state(tablet: Recovering, migrate: bool = False) -> None:
    """The time index and producers from the store; then the files' checks."""
    store = tablet.store
    start, end = keys.TIME_INDEX + tablet.prefix, keys.TIME_INDEX + tablet.prefix + b"\xff" * 8
    for key, value in store.scan(start, end):
        tablet._ts_offsets.append(keys.offset_of_key(key))
        tablet._ts_values.append(_TIMESTAMP.unpack(value)[0])
    tablet.producers.load()
    recover(tablet, migrate)


def recover(tablet: Recovering, migrate: bool = False) -> None:
    tablet.files.load(tablet.store)
    if migrate:
        migrate_partition(tablet)
    start = keys.TXN_BLOB + tablet.prefix
    for key, value in tablet.store.scan(start, start + b"\xff" * 12):
        tablet.pending[key] = value
    _check_pending(tablet)
    _check_tail(tablet)


def _check_pending(tablet: Recovering) -> None:
    ops = Ops()
    for key, entry in list(tablet.pending.items()):
        why = tablet.files.check(entry)
        if why is not None:
            log.error("%s: dropping a pending transactional batch (blob %s): %s",
                      tablet.name, key.hex(), why)
            del tablet.pending[key]
            ops.delete(key)
            tablet.files.release(entry, ops)
    if ops.deletes:
        tablet.store.write_now(ops)


def _check_tail(tablet: Recovering) -> None:
    floor = keys.LOG + tablet.prefix
    checked = 0
    bad: tuple[int, str] | None = None
    for _key, entry in tablet.store.scan_reverse(floor, floor + b"\xff" * 8):
        why = tablet.files.check(entry)
        if why is not None:
            bad = (log_entry.base_offset(entry), why)  # keep going: the lowest bad one
        checked += log_entry.size(entry)
        if checked >= CHECK_BYTES:
            break
    if bad is not None:
        cut_log(tablet, *bad)


def cut_log(tablet: Recovering, cut: int, why: str) -> None:
    """Remove the batches from offset ``cut`` on (their bytes are lost)."""
    floor = keys.LOG + tablet.prefix
    ops = Ops()
    freed = removed = 0
    for _key, entry in tablet.store.scan(keys.offset_key(keys.LOG, tablet.prefix, cut),
                                         floor + b"\xff" * 8):
        freed += log_entry.size(entry)
        removed += 1
        if log_entry.is_file(entry):
            tablet.files.release(entry, ops)
    ops.delete_range(keys.offset_key(keys.LOG, tablet.prefix, cut), floor + b"\xff" * 8)
    ops.delete_range(keys.offset_key(keys.TIME_INDEX, tablet.prefix, cut),
                     keys.TIME_INDEX + tablet.prefix + b"\xff" * 8)
    index = bisect_left(tablet._ts_offsets, cut)
    del tablet._ts_offsets[index:]
    del tablet._ts_values[index:]
    lost = tablet.log_end_offset - cut
    tablet.log_end_offset = tablet.high_watermark = cut
    tablet.log_start_offset = min(tablet.log_start_offset, cut)
    tablet.clean_end = min(tablet.clean_end, cut)
    tablet.size_bytes = max(0, tablet.size_bytes - freed)
    tablet.segments.cut(cut, tablet.size_bytes, ops)
    forgotten = tablet.producers.forget_from(cut, ops)
    ops.put(tablet.meta_key, tablet.meta())
    tablet.store.write_now(ops)
    log.error("%s: cut the log at offset %d (%d records in %d batches removed, %d producers' "
              "states forgotten): %s", tablet.name, cut, lost, removed, forgotten, why)

