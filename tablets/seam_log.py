"""The storage seam (``tablets.seam``), its partition log: what a handler
calls on one partition and on the topic that holds it.

``PartitionLog`` -- one partition (Kafka's ``UnifiedLog``): append one batch
  (idempotence and sequence checks included; acknowledged only once
  durable), read from an offset (Fetch; ``waiter`` is the long-poll), offsets
  (log start, high watermark, last stable offset, log end), list by time
  (ListOffsets), DeleteRecords, the producer state (DescribeProducers:
  ``ProducerStates``).

``TopicView`` -- a topic: name, id, config overrides, its partitions' logs.

The values an append and a read hand back (``AppendResult``, ``ReadResult``
with batches as bytes or ``FileRegion``s of the engine's files), and
``BlobSink``: the open transaction a transactional batch is staged into
instead of the log (``TransactionStorage`` publishes it). Callers import
them from ``tablets.seam``, the seam's one public entry.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Protocol
from uuid import UUID


class OpenFile(Protocol):
    """An open file of the engine's (a segment file): only its descriptor is used."""

    def fileno(self) -> int: ...


@dataclass(frozen=True, slots=True)
class FileRegion:
    """Bytes of the log lying in a file the engine owns, handed out without reading them.

    The contract, for engines that keep record bytes in files:
    - the bytes a region names never change: an engine deletes or replaces a
      file (retention, compaction) but never writes over bytes it handed out;
    - the region holds its ``file`` object, which keeps the descriptor open
      (and a deleted file's bytes readable) for as long as the region lives,
      so a reader may send it after the engine moved on.
    The protocol layer sends a region with ``os.sendfile`` on plaintext
    listeners and through ``read()`` otherwise.
    """

    file: OpenFile
    offset: int
    length: int

    def __len__(self) -> int:
        return self.length

    def read(self) -> bytes:
        data = os.pread(self.file.fileno(), self.length, self.offset)
        if len(data) != self.length:
            raise OSError(f"short read of a file region: {len(data)} of {self.length} bytes")
        return data


@dataclass(slots=True)
class ReadResult:
    # Record batches in order: bytes, or regions of the engine's files (a
    # batch whose header is patched on the way out is its first bytes, then
    # a region of the rest).
    batches: list[bytes | FileRegion]
    high_watermark: int
    log_start_offset: int

    @property
    def nbytes(self) -> int:
        return sum(len(b) for b in self.batches)


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int
    log_append_time: int  # -1 unless the topic uses LogAppendTime
    log_start_offset: int


class BlobSink(Protocol):
    """An open transaction, receiving one partition's transactional batches.

    ``append`` announces each batch it accepts with ``expect`` (which raises
    if the transaction takes no more batches) and settles it exactly once,
    with ``settled``, after its blob is registered (``added``) or it failed:
    the transaction's commit waits for what it expects. ``next_key`` raises
    if the transaction ended in between; nothing of the batch is then stored.
    """

    def expect(self) -> None: ...

    def admit(self, nbytes: int) -> None:
        """Raise a TabletError to refuse a batch (nothing of it is stored)."""

    def next_key(self, partition_prefix: bytes) -> bytes: ...

    def pending_records(self, partition_prefix: bytes) -> int:
        """Records of the transaction's batches already added to this partition."""
        ...

    def added(self, key: bytes, batch: bytes) -> None: ...

    def settled(self) -> None: ...


class ProducerState(Protocol):
    """One idempotent producer of a partition (DescribeProducers)."""

    @property
    def epoch(self) -> int: ...
    @property
    def last_seq(self) -> int: ...
    @property
    def last_timestamp(self) -> int: ...


class ProducerStates(Protocol):
    def items(self) -> Sequence[tuple[int, ProducerState]]: ...


class PartitionLog(Protocol):
    """One partition's log (Kafka's UnifiedLog on a single replica)."""

    @property
    def topic_id(self) -> UUID: ...
    @property
    def partition(self) -> int: ...
    @property
    def name(self) -> str: ...  # topic-partition, for messages
    @property
    def deleted(self) -> bool: ...  # its topic was deleted: every call refuses
    @property
    def log_start_offset(self) -> int: ...
    @property
    def log_end_offset(self) -> int: ...
    @property
    def high_watermark(self) -> int: ...
    @property
    def last_stable_offset(self) -> int: ...
    @property
    def size_bytes(self) -> int: ...
    @property
    def producers(self) -> ProducerStates: ...

    def append(self, records: bytes | memoryview, now_ms: int,
               sink: BlobSink | None = None) -> Awaitable[AppendResult]:
        """Append one record batch (v2), checked; resolves once durable. With
        ``sink``, a transactional batch is staged as a pending blob instead."""
        ...

    async def read(self, offset: int, max_bytes: int, min_one: bool = True) -> ReadResult:
        """Whole batches from the one holding ``offset``; as bytes, or as
        ``FileRegion``s of the engine's files (a batch whose first bytes are
        patched on the way out: those bytes, then a region of the rest)."""
        ...

    def waiter(self) -> asyncio.Future[None]:
        """Resolves at the next append or truncation (Fetch's long-poll)."""
        ...

    def forget_waiter(self, future: asyncio.Future[None]) -> None: ...
    def wake_waiters(self) -> None: ...

    async def offset_for_timestamp(self, target: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first batch at or after ``target``."""
        ...

    async def max_timestamp(self) -> tuple[int, int] | None: ...

    async def delete_records(self, before: int) -> int:
        """DeleteRecords: the new log start offset."""
        ...


class TopicView(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def topic_id(self) -> UUID: ...
    @property
    def configs(self) -> dict[str, str]: ...  # overrides only
    @property
    def partitions(self) -> Sequence[PartitionLog]: ...
