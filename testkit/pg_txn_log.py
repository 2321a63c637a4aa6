"""A small partition log for ``pgstore.txn_storage``'s tests: what the
PostgreSQL engine's ``PartitionLog`` must provide to the transaction storage
(``pgstore.txn_publication.TxnPartition``), over the real tables.

    log = await TxnLog.open(pool, schema, log_id, leads=True)
    storage.stage_commit(change, log, blobs, marker)   # (via ``txn_partition=lambda l: l``)
    await log.read(0)                                  # the batches, as a Fetch reads them

It keeps what a leader keeps in memory (its epoch, its log end and high
watermark) and reads the partition row when opened and after a change it
took part in failed (``in_doubt``, then ``reload``). With ``leads=False`` it
is a partition this gateway does not lead: it reserves nothing, its epoch
is not checked (this gateway's view of it may be stale) and the commit takes
offsets from the row. Reads go through ``pgstore.batch_log``,
which patches the base offsets of batches stored before they had offsets.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import asyncpg

from pgstore.batch_log import BatchLog
from pgstore.migrate import quoted


@dataclass(slots=True)
class TxnLog:
    pool: asyncpg.Pool
    schema: str
    log_id: int
    leader_epoch: int
    log_end_offset: int
    high_watermark: int
    leads: bool = True
    doubts: int = 0  # in_doubt calls
    publications: list[tuple[int, int]] = field(default_factory=list)

    @classmethod
    async def open(cls, pool: asyncpg.Pool, schema: str, log_id: int,
                   leads: bool = True) -> TxnLog:
        async with pool.acquire() as conn:
            row = await conn.fetchrow(
                f"SELECT leader_epoch, log_end_offset FROM {quoted(schema)}.partitions "
                "WHERE log_id = $1", log_id)
        assert row is not None, f"no partition row {log_id}"
        end = int(row["log_end_offset"])
        return cls(pool, schema, log_id, int(row["leader_epoch"]), end, end, leads)

    # ----------------------------------------------- pgstore.txn_publication.TxnPartition
    @property
    def batch_epoch(self) -> int:
        return self.leader_epoch

    @property
    def publish_epoch(self) -> int | None:
        return self.leader_epoch if self.leads else None

    def reserve(self, count: int) -> int | None:
        if not self.leads:
            return None
        base = self.log_end_offset
        self.log_end_offset += count
        return base

    def published(self, base: int, end: int, nbytes: int, max_timestamp: int) -> None:
        self.publications.append((base, end))
        self.log_end_offset = max(self.log_end_offset, end)
        self.high_watermark = max(self.high_watermark, end)

    def in_doubt(self) -> None:
        self.doubts += 1

    # ------------------------------------------------------------ the rest
    async def reload(self) -> None:
        """Read the log end again (after ``in_doubt``); the epoch stays this log's."""
        async with self.pool.acquire() as conn:
            end = await conn.fetchval(
                f"SELECT log_end_offset FROM {quoted(self.schema)}.partitions "
                "WHERE log_id = $1", self.log_id)
        self.log_end_offset = self.high_watermark = int(end)

    async def read(self, offset: int = 0, max_bytes: int = 1 << 30) -> list[bytes]:
        """The batches from ``offset`` up to the high watermark, as stored and patched."""
        log = await BatchLog.open(self.pool, self.schema, self.log_id)
        return await log.read(offset, max_bytes, until=self.high_watermark)
