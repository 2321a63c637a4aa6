"""The node's retention pass on PostgreSQL (``NodeRetention``, held by
``PgNodeStorage``): for every partition, where retention.ms and
retention.bytes put the log start (``truncation``), held back for the
topic's important consumer groups (``important``: what a named group has not
committed stays, up to ``gateway.important.consumer.max.bytes``), then the
truncation itself; idle producers expire (producer.id.expiration.ms). It
also reports the important groups' holds (``important_groups``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from tablets.important_holds import RetentionView

from .important import PgImportantConsumers

if TYPE_CHECKING:
    from tablets.seam import ImportantGroup

    from .partition_log import PgPartitionLog


class NodeRetention:
    def __init__(self, important: PgImportantConsumers | None,
                 producer_id_expiration_ms: int) -> None:
        self.important = important  # None: the node has no consumer offsets
        self.producer_id_expiration_ms = producer_id_expiration_ms

    async def run(self, logs: Iterable[PgPartitionLog], now_ms: int) -> None:
        for log in logs:
            if log.deleted or log.fenced:
                continue
            due = await log.truncation.retention_start(now_ms)
            view = self.view(log)
            if self.important is not None and view.important_groups:
                async with log.context.pool.acquire() as conn:
                    due = await self.important.hold_back(conn, view, due, now_ms)
            await log.truncation.truncate_to(due)
            await log.truncation.expire_producers(now_ms, self.producer_id_expiration_ms)

    def report(self, logs: Iterable[PgPartitionLog]) -> list[ImportantGroup]:
        if self.important is None:
            return []
        return self.important.report(self.view(log) for log in logs)

    def forget(self, topic: str) -> None:
        if self.important is not None:
            self.important.forget(topic)

    @staticmethod
    def view(log: PgPartitionLog) -> RetentionView:
        settings = log.settings()
        return RetentionView(settings.topic, log.partition, log.log_id, log.log_start_offset,
                             log.high_watermark, log.size_bytes, settings.important_groups,
                             settings.deletes, settings.important_max_bytes, log.deleted)
