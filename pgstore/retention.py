"""The node's retention pass on PostgreSQL (``NodeRetention``, held by
``PgNodeStorage``): for every partition, where retention.ms and
retention.bytes put the log start (``truncation``), held back for the
topic's important consumer groups (``important``: what a named group has not
committed stays, up to ``gateway.important.consumer.max.bytes``), then the
truncation itself; idle producers expire (producer.id.expiration.ms). It
also reports the important groups' holds (``important_groups``).

The deleted batches are dead rows until vacuum passes, and autovacuum visits
a database once per ``autovacuum_naptime`` (1 min by default, a server
setting). So once the passes have deleted a quarter (``VACUUM_SHARE``) of
the data the partitions still hold since the last vacuum, the pass runs
``VACUUM`` on the two tables itself (``retention_sql.vacuum``): measured,
that kept the tables at 1.4 times the data retained, against 9 times with
autovacuum alone (docs/cluster-design.md, "Retention, compaction and
bloat"). A vacuum that fails is logged, and the next pass tries again.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING

from tablets.important_holds import RetentionView

from .important import PgImportantConsumers

log = logging.getLogger(__name__)

VACUUM_SHARE = 0.25  # of the data retained, deleted since the last vacuum

if TYPE_CHECKING:
    from tablets.seam import ImportantGroup

    from .partition_log import PgPartitionLog


class NodeRetention:
    def __init__(self, important: PgImportantConsumers | None,
                 producer_id_expiration_ms: int,
                 vacuum: Callable[[], Awaitable[None]] | None = None) -> None:
        self.important = important  # None: the node has no consumer offsets
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self.vacuum = vacuum  # VACUUM of the batches' tables (None: leave it to autovacuum)
        self.deleted_since_vacuum = 0  # bytes
        self.vacuums = 0

    async def run(self, logs: Iterable[PgPartitionLog], now_ms: int) -> None:
        retained = 0
        for partition in logs:
            if partition.deleted or partition.fenced:
                continue
            due = await partition.truncation.retention_start(now_ms)
            view = self.view(partition)
            if self.important is not None and view.important_groups:
                async with partition.context.pool.acquire() as conn:
                    due = await self.important.hold_back(conn, view, due, now_ms)
            before = partition.size_bytes
            try:
                await partition.truncation.truncate_to(due)
            finally:  # a step that failed may follow steps that deleted
                self.deleted_since_vacuum += max(0, before - partition.size_bytes)
            retained += partition.size_bytes
            await partition.truncation.expire_producers(now_ms, self.producer_id_expiration_ms)
        if self.vacuum is not None and self.deleted_since_vacuum > 0 and (
                self.deleted_since_vacuum >= VACUUM_SHARE * retained):
            try:
                await self.vacuum()
            except Exception as exc:
                log.warning("retention's VACUUM failed (autovacuum remains; the next pass "
                            "tries again): %r", exc)
                return
            self.deleted_since_vacuum = 0
            self.vacuums += 1

    def report(self, logs: Iterable[PgPartitionLog]) -> list[ImportantGroup]:
        if self.important is None:
            return []
        return self.important.report(self.view(partition) for partition in logs)

    def forget(self, topic: str) -> None:
        if self.important is not None:
            self.important.forget(topic)

    @staticmethod
    def view(log: PgPartitionLog) -> RetentionView:
        settings = log.settings()
        return RetentionView(settings.topic, log.partition, log.log_id, log.log_start_offset,
                             log.high_watermark, log.size_bytes, settings.important_groups,
                             settings.deletes, settings.important_max_bytes, log.deleted)
