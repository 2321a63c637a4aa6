"""The log cleaner: compacts the node's compacted partitions in the background,
one run at a time, as Kafka's log cleaner thread does.

Every log.cleaner.backoff.ms it looks at every partition whose topic has
cleanup.policy=compact (or compact,delete), and runs compaction on each one
that is due, filthiest first (``compacted_log``). A run reads and rewrites on
the cleaner's own thread (``compaction.run``), in bounded memory: the offset
map takes at most log.cleaner.dedupe.buffer.size, a chunk of changes a few
MB; its reads and writes together stay under
log.cleaner.io.max.bytes.per.second. Between chunks (about
log.cleaner.io.buffer.size of new batches each) it returns to the event
loop, which swaps each chunk in (``tablet.compaction.apply``), so the loop never
waits on it and produce and fetch go on meanwhile.

A run that fails (a corrupt stored batch) marks its partition uncleanable,
as Kafka does, until the node restarts; the failure is logged and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from common.clock import now_ms

from . import compaction
from .compaction import Aborted, Throttle
from .compaction_config import CleanerSettings
from .rocks_store import RocksStore
from .seam import CleanerStats, RunStats
from .stored_batches import StoredBatches

if TYPE_CHECKING:
    from .tablet import PartitionTablet

log = logging.getLogger(__name__)

SWITCH_INTERVAL_S = 0.0005
__all__ = ["Cleaner", "CleanerSettings"]


class Cleaner:
    def __init__(self, store: RocksStore, settings: CleanerSettings) -> None:
        self.store = store
        self.settings = settings
        self.stats = CleanerStats()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cleaner")
        self._stop = threading.Event()
        self._one_at_a_time: asyncio.Lock | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def max_keys(self) -> int:
        return max(1, self.settings.dedupe_buffer_bytes // compaction.ENTRY_COST)

    def start(self, loop: asyncio.AbstractEventLoop,
              tablets: Callable[[], Iterable[PartitionTablet]]) -> None:
        if self.settings.enable:
            self._task = loop.create_task(self._background(tablets))

    def close(self) -> None:
        """Stop: a run under way stops at its next batch; nothing half-swapped."""
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
        self._thread.shutdown(wait=True, cancel_futures=True)

    async def _background(self, tablets: Callable[[], Iterable[PartitionTablet]]) -> None:
        while not self._stop.is_set():
            await asyncio.sleep(self.settings.backoff_ms / 1000)
            try:
                now = now_ms()
                due = [t for t in tablets() if t.compaction.plan(now) is not None]
                for tablet in sorted(due, key=lambda t: -t.compaction.status.dirty_ratio):
                    await self.clean(tablet)
            except Exception:
                log.exception("log cleaner pass failed")

    async def clean(self, tablet: PartitionTablet, force: bool = False) -> RunStats | None:
        """One run on ``tablet`` if one is due (or ``force``); its stats, or
        None if none ran to the end."""
        if self._one_at_a_time is None:
            self._one_at_a_time = asyncio.Lock()
        async with self._one_at_a_time:
            plan = tablet.compaction.plan(now_ms(), force)
            if plan is None or self._stop.is_set():
                return None
            stats = RunStats()
            run = compaction.run(StoredBatches(self.store, tablet.prefix, tablet.read_entry),
                                 plan, os.urandom(16), self.max_keys,
                                 Throttle(self.settings.io_max_bytes_per_second, self._stop),
                                 stats, self.settings.io_buffer_bytes)
            loop = asyncio.get_running_loop()
            started = time.monotonic()
            self.stats.running = True
            # While the cleaner's thread runs Python, the event loop waits for
            # the GIL up to the switch interval each time it needs it (5 ms by
            # default: produce latency would grow by that much per step).
            switch_interval = sys.getswitchinterval()
            sys.setswitchinterval(min(switch_interval, SWITCH_INTERVAL_S))
            try:
                while (chunk := await loop.run_in_executor(self._thread, next, run, None)):
                    if not await tablet.compaction.apply(chunk, plan):
                        return None
                    self.stats.chunks += 1
                    if chunk.last:
                        break
            except Aborted:
                return None
            except Exception as exc:
                tablet.compaction.status.failure = f"{type(exc).__name__}: {exc}"
                self.stats.failures += 1
                log.exception("compaction of %s failed; it is not compacted again until "
                              "restart", tablet.name)
                return None
            finally:
                tablet.compaction.finish_run()
                sys.setswitchinterval(switch_interval)
                compaction.run_stopped(self.stats, stats, started)
                with contextlib.suppress(ValueError):  # still running on the thread
                    run.close()
            compaction.run_done(self.stats, stats, tablet.name, started, log)
            return stats

