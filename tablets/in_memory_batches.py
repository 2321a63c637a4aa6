"""A run of consecutive batches held in memory, oldest first.

A tablet keeps its tail in one: the newest batches as bytes, so consumers
at the head of the log never touch RocksDB or the segment files.
Batches leave from the front in O(1) (a head index, compacted now and then),
so a tail of many small batches costs nothing per append to trim.

Offsets and sizes are ``array``s, not lists of ints: the garbage collector
does not walk an array, and a full collection walked every element of these
(with 100 partitions of 1 KiB batches, hundreds of thousands, some 18 ms a
collection, twice a second, on the event loop). Only the batches' list is
left for it to walk.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .seam import FileRegion

_COMPACT_AT = 1024  # dropped entries before the lists are shortened


class InMemoryBatches:
    __slots__ = ("_batches", "_head", "_offsets", "_sizes", "nbytes")

    def __init__(self, offsets: list[int] | None = None,
                 batches: list[bytes] | None = None) -> None:
        self._offsets = array("q", offsets or ())
        self._batches: list[bytes] = batches or []
        self._sizes = array("q", [len(b) for b in self._batches])
        self._head = 0
        self.nbytes = sum(self._sizes)

    def __len__(self) -> int:
        return len(self._offsets) - self._head

    def first_offset(self, default: int) -> int:
        """Base offset of the oldest batch held, or ``default`` when empty."""
        return self._offsets[self._head] if len(self) else default

    def append(self, offset: int, batch: bytes) -> None:
        self._offsets.append(offset)
        self._batches.append(batch)
        self._sizes.append(len(batch))
        self.nbytes += len(batch)

    def trim(self, budget: int) -> None:
        """Drop the oldest batches while over ``budget``, keeping the newest one."""
        while self.nbytes > budget and len(self) > 1:
            self._drop_first()
        self._compact()

    def drop_below(self, offset: int) -> None:
        """Drop batches that end before ``offset`` (the next one starts at or before it)."""
        while len(self) > 1 and self._offsets[self._head + 1] <= offset:
            self._drop_first()
        self._compact()

    def drop_before(self, offset: int) -> None:
        """Drop every batch that starts before ``offset`` (compaction rewrote them)."""
        while len(self) and self._offsets[self._head] < offset:
            self._drop_first()
        self._compact()

    def slice(self, offset: int, end: int, max_bytes: int,
              min_one: bool) -> list[bytes | FileRegion]:
        """The batch containing ``offset`` and those after it that start below
        ``end``, within ``max_bytes`` (the first one whole if ``min_one``)."""
        offsets, batches, sizes = self._offsets, self._batches, self._sizes
        index = max(bisect_right(offsets, offset, lo=self._head) - 1, self._head)
        out: list[bytes | FileRegion] = []
        total = 0
        while index < len(offsets) and offsets[index] < end:
            data = batches[index]
            size = sizes[index]
            if total + size > max_bytes and (out or not min_one):
                break
            out.append(data)
            total += size
            index += 1
        return out

    def _drop_first(self) -> None:
        self.nbytes -= self._sizes[self._head]
        self._batches[self._head] = b""  # free the bytes now, shorten the lists later
        self._head += 1

    def _compact(self) -> None:
        if self._head >= _COMPACT_AT and self._head * 2 >= len(self._offsets):
            del self._offsets[: self._head]
            del self._batches[: self._head]
            del self._sizes[: self._head]
            self._head = 0
