"""Compaction of one partition's log: the newest record of each key, as Kafka's
log cleaner keeps it.

A run, on the cleaner's thread (``run``), in two passes over the log, read
through a port each storage engine implements (``BatchesInOrder``: the
stored batches of an offset range, in order; RocksDB's is
``stored_batches.StoredBatches``), so the planner is engine-free:

1. The *offset map*: from the first dirty offset (where the last run
   stopped) to the first uncleanable one (the active segment, the high
   watermark, or a segment younger than min.compaction.lag.ms), the newest
   offset of each key, keyed by a 128-bit keyed hash of the key (the C record
   walker hashes keys as they stream past). The map is bounded
   (log.cleaner.dedupe.buffer.size): when it is full the run stops there.
2. The *rewrite*: every batch from the log start to where the map ends is
   walked again. A record stays if its offset is the newest of its key (or
   past the map), unless it is a tombstone whose batch's delete horizon has
   passed; a record without a key goes. A batch that keeps everything stays
   as it is (its bytes are not touched); one that keeps nothing goes; any
   other is re-encoded with the records it keeps, in the same codec, with
   its base offset, last offset delta, producer fields and attributes kept
   and a new CRC, so offsets keep their gaps and idempotent producers' last
   sequences stay right. Batches are read from their segment files (a
   committed transaction's with its offsets patched); re-encoded ones are
   written by the tablet to a new segment file of the run, never over the
   old bytes, whose file is deleted once nothing in it is live.

Tombstones and COMMIT markers go as in Kafka 3.4 (KIP-534): the first run
that keeps a tombstone (or a marker whose transaction has no record left)
stamps its batch with a delete horizon, now + delete.retention.ms (the batch's
base timestamp, flagged in its attributes); a later run after the horizon
drops it. A marker stays while any batch of its transaction does.

The rewrite hands its changes to the tablet in chunks (``Chunk``) of bounded
size; the tablet swaps each chunk in with one WriteBatch (old entries for
new, the time index of the range rebuilt, sizes), on the event loop, between
two reads of the next chunk. Every chunk leaves a log in which nothing live
is lost: a record only goes when a newer one of its key, at a higher offset,
is still there (chunks go in offset order). A run that is killed is simply
done again, from where the last finished run stopped.
"""

from __future__ import annotations

import logging
import struct
import sys
import threading
import time
from array import array
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from . import batch as batch_header
from .compaction_config import CompactionConfig
from .encode import encoder
from .records import RecordError, RecordWalker, decompressed
from .seam import CleanerStats, RunStats
from .segment_rules import Cleanable

ENTRY_COST = 140  # bytes one key of the offset map takes (a dict entry, measured)
CHUNK_BYTES = 512 << 10  # new bytes handed to the tablet per swap (log.cleaner.io.buffer.size)
CHUNK_BATCHES = 8192  # batches looked at per swap (bounds the index rebuilt with it)
# A record longer than this (decompressed) is not copied: its batch stays as it is.
MAX_RECORD_BYTES = 64 << 20
_EPOCH = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class Plan:
    """What one run covers, fixed when it starts (on the event loop)."""

    log_start: int
    first_dirty: int
    first_uncleanable: int
    now_ms: int
    delete_retention_ms: int


def due_plan(found: Cleanable, config: CompactionConfig, log_start: int, now_ms: int,
             next_horizon: int | None, force: bool = False) -> Plan | None:
    """The run due now on a log ``found`` cleanable (or ``force``d: due or
    not), as Kafka's cleaner picks one: the dirty ratio above
    min.cleanable.dirty.ratio, a dirty segment older than
    max.compaction.lag.ms, or a kept tombstone's or marker's delete horizon
    (``next_horizon``) passed. Both engines decide through it."""
    overdue = (0 <= found.earliest_dirty_ts < now_ms - config.max_compaction_lag_ms
               and found.cleanable_bytes > 0)
    horizon = next_horizon is not None and next_horizon <= now_ms
    if not (force or overdue or horizon or found.ratio > config.min_cleanable_dirty_ratio):
        return None
    return Plan(log_start, found.first_dirty, found.first_uncleanable, now_ms,
                config.delete_retention_ms)


def run_stopped(totals: CleanerStats, run: RunStats, started: float) -> None:
    """A run stopped (done, failed or aborted; ``started``: its
    ``time.monotonic()``): the node's totals (both engines' cleaners)."""
    totals.running = False
    totals.seconds += time.monotonic() - started
    totals.bytes_read += run.bytes_read


def run_done(totals: CleanerStats, run: RunStats, name: str, started: float,
             log: logging.Logger) -> None:
    """A run of partition ``name`` finished: counted, and logged to the
    cleaner's ``log`` (``bench/compaction.py`` reads tablets.cleaner's line)."""
    totals.runs += 1
    totals.bytes_reclaimed += run.bytes_reclaimed
    log.info("compacted %s up to offset %d: %.1f MB of log in %.2f s, %d of %d records "
             "kept, %d bytes reclaimed", name, run.map_end, run.bytes_cleaned / 1e6,
             time.monotonic() - started, run.records_kept, run.records_read,
             run.bytes_reclaimed)


@dataclass(slots=True)
class Change:
    offset: int  # the batch's base offset (its key)
    old_size: int  # the stored size of the batch it replaces (``BatchesInOrder``)
    entry: bytes  # the engine's entry of the batch it replaces (its bytes are no longer live)
    data: bytes | None  # the new batch, or None: the batch goes


@dataclass(slots=True)
class Chunk:
    """Changes to swap in at once, and the range whose time index they rebuild:
    every batch kept in [index_from, index_to), with its max timestamp."""

    changes: list[Change] = field(default_factory=list)
    index_from: int = 0
    index_to: int = 0
    bases: array[int] = field(default_factory=lambda: array("q"))
    maxima: array[int] = field(default_factory=lambda: array("q"))
    new_bytes: int = 0
    last: bool = False
    clean_end: int = 0  # with ``last``: where the next run starts
    next_horizon: int | None = None  # with ``last``: the earliest delete horizon kept


class Aborted(Exception):
    """The run stops: the node is stopping, or the log changed under it."""


class Throttle:
    """log.cleaner.io.max.bytes.per.second: the cleaner sleeps to stay under it."""

    def __init__(self, bytes_per_second: float, stop: threading.Event) -> None:
        self.rate = bytes_per_second
        self.stop = stop
        self._start = time.monotonic()
        self._bytes = 0

    def __call__(self, nbytes: int) -> None:
        if self.stop.is_set():
            raise Aborted("the cleaner is stopping")
        if self.rate >= sys.float_info.max:  # Kafka's default: no limit
            return
        self._bytes += nbytes
        ahead = self._bytes / self.rate - (time.monotonic() - self._start)
        if ahead > 0 and self.stop.wait(ahead):
            raise Aborted("the cleaner is stopping")


# (offset delta, timestamp, key digest or None, tombstone, offset delta position, end position)
KeyedRecord = tuple[int, int, bytes | None, bool, int, int]
Keep = Callable[[int, bytes | None, bool], bool]


class BatchesInOrder(Protocol):
    """One partition's stored batches, as a run reads them: an engine's port."""

    def batches(self, start: int, end: int) -> Iterator[tuple[bytes, int, bytes]]:
        """(entry, stored size, batch) for each batch from the one holding
        ``start`` to the last one below ``end``, in offset order, read on the
        caller's thread. ``entry`` is the engine's own bytes for the stored
        batch (handed back to it in a ``Change``), the size what the
        partition's size counts for it. Raises ``Aborted`` when the log
        changed under the run (a batch's bytes went)."""
        ...


def run(log: BatchesInOrder, plan: Plan, seed: bytes, max_keys: int, throttle: Throttle,
        stats: RunStats, chunk_bytes: int = CHUNK_BYTES) -> Generator[Chunk, None, None]:
    """One run, as a generator: each ``next`` reads on until the next chunk
    (about ``chunk_bytes`` of new batches)."""
    latest, map_end = _offset_map(log, plan, seed, max_keys, throttle, stats)
    stats.keys, stats.map_end = len(latest), map_end
    yield from _rewrite(log, plan, seed, latest, map_end, throttle, stats, chunk_bytes)


def _walk(batch: bytes, header: batch_header.BatchHeader, seed: bytes
          ) -> Iterator[tuple[memoryview | bytes, int, list[KeyedRecord]]]:
    """Each decompressed piece of a batch's records, where it starts in the
    stream, and the records that end in it."""
    walker = RecordWalker(header.record_count, header.base_timestamp, contiguous=False,
                          key_seed=seed, release_gil=True)
    view = memoryview(batch)[batch_header.HEADER_SIZE:header.size]
    position = 0
    try:
        for piece in decompressed(header.compression, view):
            yield piece, position, walker.feed(piece)
            position += len(piece)
        walker.finish()
    except RecordError as exc:
        raise batch_header.InvalidRecordBatch(
            f"stored batch at offset {header.base_offset} is corrupt: {exc}") from None


def _offset_map(log: BatchesInOrder, plan: Plan, seed: bytes, max_keys: int,
                throttle: Throttle, stats: RunStats) -> tuple[dict[bytes, int], int]:
    """The newest offset of each key in [first dirty, first uncleanable), and
    where the map ends (before the first record that did not fit)."""
    latest: dict[bytes, int] = {}
    start, end = plan.first_dirty, plan.first_uncleanable
    if start >= end:
        return latest, start
    for _entry, _size, batch in log.batches(start, end):
        header = batch_header.parse_batches(batch, verify_crc=False)[0]
        throttle(header.size)
        stats.bytes_read += header.size
        if header.is_control:
            continue
        base = header.base_offset
        for _piece, _at, records in _walk(batch, header, seed):
            for delta, _ts, digest, _tomb, _body, _end in records:
                offset = base + delta
                if digest is None or offset < start:
                    continue
                if len(latest) >= max_keys and digest not in latest:
                    return latest, offset
                latest[digest] = offset
    return latest, end


def _rewrite(log: BatchesInOrder, plan: Plan, seed: bytes, latest: dict[bytes, int],
             map_end: int, throttle: Throttle, stats: RunStats, chunk_bytes: int
             ) -> Iterator[Chunk]:
    now, new_horizon = plan.now_ms, plan.now_ms + plan.delete_retention_ms
    chunk = Chunk()
    horizons: list[int] = []
    open_txns: set[int] = set()  # producers with a kept batch not yet followed by a marker
    for entry, size, batch in log.batches(0, map_end):
        header = batch_header.parse_batches(batch, verify_crc=False)[0]
        throttle(header.size)
        stats.bytes_read += header.size
        stats.bytes_cleaned += header.size
        horizon = (header.base_timestamp
                   if header.attributes & batch_header.ATTR_DELETE_HORIZON else None)
        passed = horizon is not None and now >= horizon
        data: bytes | None = batch
        if header.is_control:
            if header.producer_id in open_txns:
                open_txns.discard(header.producer_id)  # it still marks something
            elif passed:
                data = None
            elif horizon is None:
                data = _reencode(batch, header, seed, lambda *_: True, new_horizon)
                horizons.append(new_horizon)
            else:
                horizons.append(horizon)  # not passed: later than now
        else:
            keep = _keeper(header.base_offset, map_end, latest, passed)
            kept, dropped, tombstones = _survey(batch, header, seed, keep, stats)
            stamp = tombstones and horizon is None
            if not kept:
                data = None
            elif dropped or stamp:
                data = _reencode(batch, header, seed, keep, new_horizon if stamp else None)
            kept_horizon = new_horizon if stamp else horizon
            # A horizon already passed here kept its tombstones (they are past
            # the map, or their batch was left as it is): no run is due for it.
            if tombstones and data is not None and kept_horizon is not None and \
                    kept_horizon >= now:
                horizons.append(kept_horizon)
            if header.is_transactional and data is not None:
                open_txns.add(header.producer_id)
        if data is not batch:
            chunk.changes.append(Change(header.base_offset, size, entry, data))
            new_size = 0 if data is None else len(data)
            chunk.new_bytes += new_size
            stats.bytes_reclaimed += size - new_size
            stats.batches_dropped += data is None
            stats.batches_rewritten += data is not None
            throttle(new_size)
        if data is not None:
            chunk.bases.append(header.base_offset)
            chunk.maxima.append(batch_header.max_timestamp_of(data))
        chunk.index_to = header.base_offset + header.last_offset_delta + 1
        if chunk.new_bytes >= chunk_bytes or len(chunk.bases) + len(chunk.changes) >= \
                CHUNK_BATCHES:
            yield chunk
            chunk = Chunk(index_from=chunk.index_to, index_to=chunk.index_to)
    chunk.last, chunk.clean_end = True, map_end
    chunk.next_horizon = min(horizons, default=None)
    yield chunk


def _keeper(base: int, map_end: int, latest: dict[bytes, int], horizon_passed: bool) -> Keep:
    """Whether a record of the batch at ``base`` stays (Kafka's shouldRetainRecord)."""
    def keep(delta: int, digest: bytes | None, tombstone: bool) -> bool:
        offset = base + delta
        if offset >= map_end:
            return True
        if digest is None:
            return False  # no key: Kafka's cleaner drops it too
        if latest.get(digest, -1) > offset:
            return False
        return not (tombstone and horizon_passed)
    return keep


def _survey(batch: bytes, header: batch_header.BatchHeader, seed: bytes, keep: Keep,
            stats: RunStats) -> tuple[int, bool, bool]:
    """(records kept, any dropped, any tombstone kept)."""
    kept = 0
    dropped = tombstones = False
    for _piece, _at, records in _walk(batch, header, seed):
        for delta, _ts, digest, tombstone, _body, _end in records:
            if keep(delta, digest, tombstone):
                kept += 1
                tombstones = tombstones or tombstone
            else:
                dropped = True
    stats.records_read += header.record_count
    stats.records_kept += kept
    return kept, dropped, tombstones


def _reencode(batch: bytes, header: batch_header.BatchHeader, seed: bytes, keep: Keep,
              horizon: int | None) -> bytes:
    """The batch with only the records ``keep`` keeps; with ``horizon``, stamped
    with it (their timestamps are then relative to it). The batch itself when
    a record too long to copy is kept."""
    view = memoryview(batch)
    out = encoder(header.compression, view[batch_header.HEADER_SIZE:header.size])
    kept = 0
    max_ts = -1
    pending = bytearray()  # the stream from ``start`` on: a record not yet ended
    start = 0  # stream position where the next record begins
    for piece, at, records in _walk(batch, header, seed):
        if not records:  # inside a long record: nothing to write yet
            pending += piece
            if len(pending) > MAX_RECORD_BYTES:
                return batch
            continue
        if pending:
            pending += piece
            data: bytes | memoryview = bytes(pending)
            origin = start
        else:
            data, origin = piece, at
        run_from: int | None = None  # a run of kept records not yet written
        for delta, ts, digest, tombstone, body, end in records:
            if keep(delta, digest, tombstone):
                kept += 1
                max_ts = max(max_ts, ts)
                if horizon is None:
                    run_from = start if run_from is None else run_from
                else:
                    moved = batch_header.zigzag_varint(ts - horizon)
                    rest = data[body - origin:end - origin]
                    out.write(batch_header.zigzag_varint(1 + len(moved) + len(rest)) + b"\x00"
                              + moved)
                    out.write(rest)
            elif run_from is not None:
                out.write(data[run_from - origin:start - origin])
                run_from = None
            start = end
        if run_from is not None:
            out.write(data[run_from - origin:start - origin])
        pending = bytearray(data[start - origin:])
        if len(pending) > MAX_RECORD_BYTES:
            return batch
    if header.attributes & batch_header.ATTR_TIMESTAMP_TYPE:
        max_ts = header.max_timestamp  # LogAppendTime: the batch's time stands for all
    return batch_header.build_batch(
        out.finish(), record_count=kept, base_offset=header.base_offset,
        base_timestamp=header.base_timestamp if horizon is None else horizon,
        max_timestamp=max_ts, producer_id=header.producer_id,
        producer_epoch=header.producer_epoch, base_sequence=header.base_sequence,
        attributes=header.attributes
        | (batch_header.ATTR_DELETE_HORIZON if horizon is not None else 0),
        leader_epoch=_EPOCH.unpack_from(view, 12)[0], last_offset_delta=header.last_offset_delta,
    )
