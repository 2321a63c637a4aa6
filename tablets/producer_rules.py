"""Kafka's idempotent-producer rules over one partition's in-memory state.

Engine-free: the rules of Kafka 3.4's ProducerStateManager, and the encoding
of a producer's entry, with the persistence behind a port
(``ProducerPersistence``) each storage engine implements -- the RocksDB
engine with its keys and ``Ops`` (``tablets/producers.py``), the PostgreSQL
engine with rows of its ``producers`` table.

Per producer id, the partition keeps the producer's epoch and the sequence
ranges and offsets of its last ``CACHED_BATCHES`` batches, persisted in the
same atomic change as the data they describe (YDB keeps its source-id table
with the data; so do we). A retried batch is therefore recognised after a
restart of the gateway too, not only within one producer session as in Kafka.

The checks, as Kafka 3.4's ProducerStateManager makes them, except where noted:

- a batch whose sequence range equals a cached one is a duplicate: it is not
  stored again, and the produce answers with the original offset;
- an older epoch is fenced (INVALID_PRODUCER_EPOCH);
- a newer epoch must start at sequence 0;
- otherwise the batch must continue the last sequence (wrapping at 2^31-1);
- an unknown producer id must start at sequence 0, else UNKNOWN_PRODUCER_ID:
  its state expired (``producer.id.expiration.ms``) or was evicted, and the
  client recovers by bumping its epoch (KIP-360). Kafka 3.4 accepts any
  sequence here instead, and so cannot tell a retry from a gap.

State is bounded: idle producers expire, and past ``max_producers`` the least
recently used one is evicted.

The state changes in memory at once (a batch pipelined behind another is
checked against it); each change is also staged through the port into the
caller's atomic change (an engine's own type, ``ChangeT``), so it is durable
with the data it describes or not at all.
"""

from __future__ import annotations

import struct
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from .errors import InvalidProducerEpoch, OutOfOrderSequence, UnknownProducerId

CACHED_BATCHES = 5
INT32_MAX = 0x7FFFFFFF

_HEAD = struct.Struct(">hqB")  # epoch, last write timestamp, batch count
_BATCH = struct.Struct(">iiq")  # first sequence, last sequence, base offset


@dataclass(frozen=True, slots=True)
class CachedBatch:
    first_seq: int
    last_seq: int
    # A transactional batch has no offset until its commit: this is a lower
    # bound of it (the partition's end plus the transaction's records before
    # it there), or -1 if stored by a gateway that did not keep the bound.
    base_offset: int


# The base offset kept for a transactional batch its transaction refused (a
# limit): nothing of it is stored. Producers disagree on whether it used its
# sequence numbers: librdkafka numbers its next batch after it, kafkajs sends
# the same numbers again. Either is taken, so both go on.
REFUSED = -2


@dataclass(slots=True)
class ProducerEntry:
    """One producer's state in a partition. Its encodings are engine-neutral
    bytes: ``encode`` the whole entry (the RocksDB engine's value), or
    ``encode_batches`` the cached batches alone, for an engine that keeps the
    epoch and timestamp in columns of their own (``from_columns``)."""

    epoch: int
    last_timestamp: int  # ms of its last write, for expiry
    batches: deque[CachedBatch] = field(default_factory=lambda: deque(maxlen=CACHED_BATCHES))

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1

    def encode_batches(self) -> bytes:
        """The cached batches, oldest first: (first seq, last seq, base offset),
        big-endian int32, int32, int64 each."""
        return b"".join(_BATCH.pack(b.first_seq, b.last_seq, b.base_offset)
                        for b in self.batches)

    def encode(self) -> bytes:
        """Epoch (int16), last write (int64 ms), batch count (uint8), then
        ``encode_batches``."""
        return _HEAD.pack(self.epoch, self.last_timestamp, len(self.batches)) + \
            self.encode_batches()

    @classmethod
    def decode(cls, value: bytes) -> ProducerEntry:
        epoch, timestamp, count = _HEAD.unpack_from(value)
        entry = cls(epoch, timestamp)
        for at in range(_HEAD.size, _HEAD.size + count * _BATCH.size, _BATCH.size):
            entry.batches.append(CachedBatch(*_BATCH.unpack_from(value, at)))
        return entry

    @classmethod
    def from_columns(cls, epoch: int, last_timestamp: int, batches: bytes) -> ProducerEntry:
        """The entry whose ``encode_batches`` gave ``batches``."""
        entry = cls(epoch, last_timestamp)
        for at in range(0, len(batches), _BATCH.size):
            entry.batches.append(CachedBatch(*_BATCH.unpack_from(batches, at)))
        return entry


def next_seq(seq: int, count: int = 1) -> int:
    """The sequence ``count`` after ``seq``: sequences wrap at 2^31-1 to 0."""
    return (seq + count) % (INT32_MAX + 1)


ChangeT = TypeVar("ChangeT")
ChangeT_contra = TypeVar("ChangeT_contra", contravariant=True)


class ProducerPersistence(Protocol[ChangeT_contra]):
    """Where one partition's producer entries are kept: an engine's port.

    ``ChangeT_contra`` is the engine's atomic change (RocksDB: ``Ops``): the
    staged entries are written with the rest of it, or not at all.
    """

    def load(self) -> Iterable[tuple[int, ProducerEntry]]:
        """The partition's persisted entries (producer id, entry), any order:
        read once, at start-up."""
        ...

    def stage_entry(self, change: ChangeT_contra, producer_id: int,
                    entry: ProducerEntry) -> None:
        """Stage ``entry`` (new or changed) as the producer's, into ``change``."""
        ...

    def stage_removal(self, change: ChangeT_contra, producer_id: int) -> None:
        """Stage the removal of the producer's entry into ``change``."""
        ...


class ProducerStates(Generic[ChangeT]):
    """The producers of one partition, kept through ``persistence``."""

    def __init__(self, persistence: ProducerPersistence[ChangeT], max_producers: int) -> None:
        self.persistence = persistence
        self.max_producers = max_producers
        self.evictions = 0
        # Least recently written first: eviction takes from the front.
        self._entries: OrderedDict[int, ProducerEntry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def load(self) -> None:
        """Replace the state by the persisted one (start-up)."""
        self.restore(self.persistence.load())

    def restore(self, entries: Iterable[tuple[int, ProducerEntry]]) -> None:
        """Replace the state by ``entries``, put in their order of last write."""
        loaded = sorted(entries, key=lambda item: item[1].last_timestamp)
        self._entries = OrderedDict(loaded)

    def get(self, producer_id: int) -> ProducerEntry | None:
        return self._entries.get(producer_id)

    def items(self) -> list[tuple[int, ProducerEntry]]:
        return list(self._entries.items())

    # ------------------------------------------------------------ checking
    def check(self, producer_id: int, epoch: int, first_seq: int,
              last_seq: int) -> CachedBatch | None:
        """The cached batch a retry duplicates, or None for a new batch.

        Raises InvalidProducerEpoch, OutOfOrderSequence or UnknownProducerId.
        """
        entry = self._entries.get(producer_id)
        if entry is None:
            if first_seq != 0:
                raise UnknownProducerId(
                    f"producer {producer_id} is unknown here (expired or evicted) and its "
                    f"batch starts at sequence {first_seq}, not 0")
            return None
        if epoch < entry.epoch:
            raise InvalidProducerEpoch(
                f"producer {producer_id} epoch {epoch} is older than the current {entry.epoch}")
        if epoch > entry.epoch:
            if first_seq != 0:
                raise OutOfOrderSequence(
                    f"producer {producer_id}: a new epoch {epoch} must start at sequence 0, "
                    f"not {first_seq}")
            return None
        newest = entry.batches[-1] if entry.batches else None
        if newest is not None and newest.base_offset == REFUSED and \
                first_seq == newest.first_seq:
            return None  # sent again after its refusal: a new batch (``stage`` replaces it)
        for cached in entry.batches:
            if cached.first_seq == first_seq and cached.last_seq == last_seq:
                return cached
        if first_seq != next_seq(entry.last_seq):
            raise OutOfOrderSequence(
                f"producer {producer_id} epoch {epoch}: expected sequence "
                f"{next_seq(entry.last_seq)}, got {first_seq}")
        return None

    # ------------------------------------------------------------ writing
    def stage(self, producer_id: int, epoch: int, batch: CachedBatch, now_ms: int,
              change: ChangeT) -> None:
        """Record a new batch (already checked) and stage its state into ``change``.

        Applied in memory at once, so a batch pipelined behind this one is
        checked against it; the state is durable with the data it describes.
        """
        entry = self._entries.pop(producer_id, None)
        if entry is None or entry.epoch != epoch:
            entry = ProducerEntry(epoch, now_ms)
        entry.last_timestamp = now_ms
        if entry.batches and entry.batches[-1].base_offset == REFUSED and \
                entry.batches[-1].first_seq == batch.first_seq:
            entry.batches.pop()  # a refused batch's numbers, sent again
        entry.batches.append(batch)
        self._entries[producer_id] = entry
        self.persistence.stage_entry(change, producer_id, entry)
        while len(self._entries) > self.max_producers:
            evicted, _ = self._entries.popitem(last=False)
            self.persistence.stage_removal(change, evicted)
            self.evictions += 1

    def expire(self, now_ms: int, expiration_ms: int, change: ChangeT) -> int:
        """Forget producers idle for ``expiration_ms``; returns how many."""
        doomed = [pid for pid, entry in self._entries.items()
                  if now_ms - entry.last_timestamp >= expiration_ms]
        for pid in doomed:
            del self._entries[pid]
            self.persistence.stage_removal(change, pid)
        return len(doomed)

    def forget_from(self, offset: int, change: ChangeT) -> int:
        """Forget producers whose cached batches reach ``offset`` (recovery cut
        the log there, so their sequences name batches that are gone)."""
        doomed = [pid for pid, entry in self._entries.items()
                  if any(b.base_offset >= offset for b in entry.batches)]
        for pid in doomed:
            del self._entries[pid]
            self.persistence.stage_removal(change, pid)
        return len(doomed)

    def clear(self) -> None:
        self._entries.clear()
