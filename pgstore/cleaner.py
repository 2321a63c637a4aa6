"""The log cleaner on PostgreSQL (``PgCleaner``, held by ``PgNodeStorage``):
compacts the compacted partitions this gateway leads, one run at a time.

The policy is the embedded engine's (``tablets.cleaner``, whose class reads
the RocksDB store, so this store has its own small one): every
log.cleaner.backoff.ms, every partition led here (not fenced, not deleted)
whose topic has cleanup.policy=compact (or compact,delete) and is due
(``pgstore.compaction.PgCompactedLog.plan``: min.cleanable.dirty.ratio,
max.compaction.lag.ms, a passed delete horizon; min.compaction.lag.ms keeps
young batches out of a run) runs, filthiest first. A run is
``tablets.compaction.run`` on the cleaner's thread, reading through
``PgBatches``, in bounded memory (log.cleaner.dedupe.buffer.size), throttled
(log.cleaner.io.max.bytes.per.second); each chunk (about
log.cleaner.io.buffer.size of new batches) is swapped in on the event loop,
one PostgreSQL transaction each (``PgCompactedLog.apply``).

Only the leader compacts: a partition led by another gateway is not in this
gateway's runs, and one that moved during a run stops at its next swap (the
leader epoch fences it: nothing written). A run that fails otherwise (a
corrupt stored batch) marks its partition uncleanable until restart, as
Kafka does; one that lost PostgreSQL only stops (a swap whose outcome is
unknown makes the partition reread its row), and the next pass runs again.

The dead rows a run leaves (the old index rows and bytes) are counted as
deleted for retention's VACUUM (``NodeRetention.deleted_since_vacuum``): the
next retention pass vacuums once they reach a quarter of the data retained,
as it does for its own deletions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import asyncpg

from common.clock import now_ms
from tablets import compaction
from tablets.compaction import Aborted, Throttle
from tablets.compaction_config import CleanerSettings
from tablets.errors import NotLeader, StorageError
from tablets.seam import CleanerStats, PartitionCompaction, RunStats

from .compaction import CompactionSql, PgBatches, PgCompactedLog, Stopped
from .migrate import quoted

if TYPE_CHECKING:
    from .partition_log import PgPartitionLog

log = logging.getLogger(__name__)

# What stops a run without marking its partition uncleanable (a failure of
# the data itself does): PostgreSQL unreachable or the connection lost.
_UNAVAILABLE: tuple[type[BaseException], ...] = (
    StorageError, OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError)


class PgCleaner:
    def __init__(self, settings: CleanerSettings, schema: str,
                 deleted: Callable[[int], None] = lambda _n: None) -> None:
        self.settings = settings
        self.sql = CompactionSql(quoted(schema))
        self.deleted = deleted  # bytes a run left as dead rows (retention's VACUUM counts them)
        self.stats = CleanerStats()
        self._logs: dict[int, PgCompactedLog] = {}
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pg-cleaner")
        self._stop = threading.Event()
        self._one_at_a_time = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    @property
    def max_keys(self) -> int:
        return max(1, self.settings.dedupe_buffer_bytes // compaction.ENTRY_COST)

    def compacted(self, partition: PgPartitionLog) -> PgCompactedLog:
        found = self._logs.get(partition.log_id)
        if found is None or found.log is not partition:
            found = self._logs[partition.log_id] = PgCompactedLog(partition, self.sql)
        return found

    def statuses(self, logs: Iterable[PgPartitionLog]) -> list[PartitionCompaction]:
        """The compacted partitions led here, as of their last check."""
        return [PartitionCompaction(partition.settings().topic, partition.partition,
                                    (found := self.compacted(partition)).status, found.clean_end)
                for partition in logs if not (partition.deleted or partition.fenced)
                and partition.settings().compaction is not None]

    def start(self, logs: Callable[[], Iterable[PgPartitionLog]]) -> None:
        if self.settings.enable:
            self._task = asyncio.get_running_loop().create_task(self._background(logs))

    async def close(self) -> None:
        """Stop: a run under way stops at its next batch; nothing half-swapped."""
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        # Off the event loop: a read of the run's thread waits on it.
        await asyncio.to_thread(self._thread.shutdown, wait=True, cancel_futures=True)

    async def _background(self, logs: Callable[[], Iterable[PgPartitionLog]]) -> None:
        while not self._stop.is_set():
            await asyncio.sleep(self.settings.backoff_ms / 1000)
            try:
                await self.pass_once(logs())
            except Exception:
                log.exception("log cleaner pass failed")

    async def pass_once(self, logs: Iterable[PgPartitionLog]) -> int:
        """One pass: every due partition led here, filthiest first; the runs made."""
        now = now_ms()
        due = []
        for partition in logs:
            if partition.deleted or partition.fenced or partition.settings().compaction is None:
                continue
            compacted = self.compacted(partition)
            if await compacted.plan(now) is not None:
                due.append(compacted)
        runs = 0
        for compacted in sorted(due, key=lambda c: -c.status.dirty_ratio):
            try:
                runs += await self.clean(compacted) is not None
            except NotLeader as exc:  # it moved to another gateway: not ours to compact
                log.info("compaction stopped: %s", exc)
        return runs

    async def clean(self, compacted: PgCompactedLog, force: bool = False) -> RunStats | None:
        """One run if one is due (or ``force``); its stats, or None if none
        ran to the end. ``NotLeader`` when the partition moved to another
        gateway during the run (nothing of the chunk was written)."""
        async with self._one_at_a_time:
            plan = await compacted.plan(now_ms(), force)
            if plan is None or self._stop.is_set():
                return None
            partition = compacted.log
            stats = RunStats()
            loop = asyncio.get_running_loop()
            reader = PgBatches(partition.context.pool, self.sql, partition.log_id, loop,
                               self._stop)
            run = compaction.run(reader, plan, os.urandom(16), self.max_keys,
                                 Throttle(self.settings.io_max_bytes_per_second, self._stop),
                                 stats, self.settings.io_buffer_bytes)
            started = time.monotonic()
            self.stats.running = True
            try:
                while (chunk := await loop.run_in_executor(self._thread, next, run, None)):
                    if not await compacted.apply(chunk, plan):
                        return None
                    self.stats.chunks += 1
                    self.deleted(sum(c.old_size for c in chunk.changes))
                    if chunk.last:
                        break
            except (Aborted, Stopped) as exc:
                log.info("compaction of %s stopped: %s", partition.name, exc)
                return None
            except NotLeader:
                raise
            except _UNAVAILABLE as exc:  # PostgreSQL away: the next pass runs again
                log.warning("compaction of %s stopped, the store is unavailable: %r",
                            partition.name, exc)
                return None
            except Exception as exc:
                compacted.status.failure = f"{type(exc).__name__}: {exc}"
                self.stats.failures += 1
                log.exception("compaction of %s failed; it is not compacted again until "
                              "restart", partition.name)
                return None
            finally:
                compaction.run_stopped(self.stats, stats, started)
                with contextlib.suppress(ValueError):  # still running on the thread
                    run.close()
            compaction.run_done(self.stats, stats, partition.name, started, log)
            return stats
