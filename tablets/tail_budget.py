"""The node's budget for the partitions' in-memory tails, and who gets it.

A partition's tail (``InMemoryBatches``) holds its newest batches as bytes, so
a Fetch at the head is answered from memory. The node has one budget
(``gateway.tail.cache.bytes``), shared evenly over the partitions that are
*read*: read at least once in the last ``READ_WINDOW_S`` seconds. A
partition nobody reads keeps only its newest batch (the floor of
``InMemoryBatches.trim``), so memory goes to the bytes consumers ask for,
and a partition that is read gets a longer tail than an even share over all
partitions would give it.

Why: a gateway whose producers write and whose consumers come later held the
whole budget in bytes nobody fetched from memory (the consumer that comes
later starts below the tail and reads the store; the tail serves consumers
at the head). That was most of the gateway's peak memory over PostgreSQL
(docs/performance.md, "The gateway over PostgreSQL").

A reshare is one pass over every partition, so first reads do not each pay
for one: they ask for one (``_reshare_soon``), which runs on the next pass of
the event loop and then at most once per ``RESHARE_INTERVAL_S``. A Fetch
that reads 10 000 partitions for the first time costs one pass, not 10 000
(an O(partitions²) stall of every client), and a client reading one new
partition per request cannot make the loop reshare more than once a second.
A timer, armed while any partition is read, takes back the share of those
no longer read. A partition's topic deleted or its partitions added: the
catalog calls ``reshare`` at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Protocol

READ_WINDOW_S = 60.0  # a partition read within this long keeps its share
RESHARE_INTERVAL_S = 1.0  # first reads reshare at most this often


class TailHolder(Protocol):
    """A partition log with an in-memory tail (the RocksDB engine's tablet,
    the PostgreSQL engine's partition log)."""

    def set_tail_budget(self, nbytes: int) -> None: ...


class TailBudget:
    """Shares ``total`` bytes over the read partitions among ``holders()``."""

    __slots__ = ("_clock", "_holders", "_last_read_reshare", "_pending", "_read_at", "_timer",
                 "reshare_interval", "reshares", "total", "window")

    def __init__(self, total: int, holders: Callable[[], Iterable[TailHolder]],
                 window: float = READ_WINDOW_S,
                 clock: Callable[[], float] = time.monotonic,
                 reshare_interval: float = RESHARE_INTERVAL_S) -> None:
        self.total = total
        self.window = window
        self.reshare_interval = reshare_interval
        self.reshares = 0  # passes over the holders so far (statistics, tests)
        self._holders = holders
        self._clock = clock
        self._read_at: dict[TailHolder, float] = {}
        self._timer: asyncio.TimerHandle | None = None  # the sweep
        self._pending: asyncio.TimerHandle | None = None  # a reshare first reads asked for
        self._last_read_reshare = -float("inf")

    def share(self, holder: TailHolder) -> int:
        """What ``holder`` may keep now (0: its newest batch only)."""
        if holder not in self._read_at:
            return 0
        return self.total // len(self._read_at)

    def read(self, holder: TailHolder) -> None:
        """``holder`` was read: it keeps a share for the next window."""
        known = holder in self._read_at
        self._read_at[holder] = self._clock()
        if not known:
            self._reshare_soon()
            if self._timer is None:
                self._arm()

    def _reshare_soon(self) -> None:
        if self._pending is not None:
            return  # one is due: it will see this holder too
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # read outside a loop (a synchronous test): at once
            self._reshare_for_reads()
            return
        delay = max(0.0, self._last_read_reshare + self.reshare_interval - self._clock())
        self._pending = loop.call_later(delay, self._reshare_for_reads)

    def _reshare_for_reads(self) -> None:
        self._pending = None
        self._last_read_reshare = self._clock()
        self.reshare()

    def reshare(self) -> None:
        """Share the budget again (the holders changed, or who reads them)."""
        self.reshares += 1
        holders = list(self._holders())
        live = set(holders)
        for gone in [h for h in self._read_at if h not in live]:
            del self._read_at[gone]
        share = self.total // max(len(self._read_at), 1)
        for holder in holders:
            holder.set_tail_budget(share if holder in self._read_at else 0)

    def sweep(self) -> None:
        """Take back the share of partitions not read within the window."""
        self._timer = None
        cutoff = self._clock() - self.window
        stale = [h for h, at in self._read_at.items() if at < cutoff]
        for holder in stale:
            del self._read_at[holder]
        if stale:
            self.reshare()
        if self._read_at:
            self._arm()

    def close(self) -> None:
        for handle in (self._timer, self._pending):
            if handle is not None:
                handle.cancel()
        self._timer = self._pending = None

    def _arm(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # read outside a loop (a synchronous test): no timer
            return
        self._timer = loop.call_later(self.window / 2, self.sweep)
