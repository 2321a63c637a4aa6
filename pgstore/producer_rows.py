"""Idempotent producers' state of one partition as rows of ``producers``: the
PostgreSQL engine's ``tablets.producer_rules.ProducerPersistence``.

The rules (Kafka's ProducerStateManager: epochs, sequences, the last five
batches for dedup, eviction) are ``tablets.producer_rules``'s, shared with
the RocksDB engine; this port stages each changed entry into the append's own
``PgChange``, so a producer's state is durable with the batch it describes
or not at all. A row holds the epoch and last write time in columns and the
cached batches as ``ProducerEntry.encode_batches`` bytes (``recent``).

The rows are read at start-up (``fetch``, async) and handed to the rules by
``load``, which the rules call synchronously.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from tablets.producer_rules import ProducerEntry

if TYPE_CHECKING:
    from .log_sql import LogSql
    from .migrate import Connection
    from .writer import PgChange


class PgProducerRows:
    def __init__(self, sql: LogSql, log_id: int,
                 loaded: Iterable[tuple[int, ProducerEntry]] = ()) -> None:
        self.sql = sql
        self.log_id = log_id
        self.loaded = list(loaded)

    @classmethod
    async def fetch(cls, conn: Connection, sql: LogSql, log_id: int) -> PgProducerRows:
        """The partition's rows, read now."""
        rows = await conn.fetch(sql.producers, log_id)
        return cls(sql, log_id, [
            (int(row["producer_id"]), ProducerEntry.from_columns(
                int(row["epoch"]), int(row["last_timestamp"]), bytes(row["recent"])))
            for row in rows])

    def load(self) -> Iterable[tuple[int, ProducerEntry]]:
        return self.loaded

    def stage_entry(self, change: PgChange, producer_id: int, entry: ProducerEntry) -> None:
        change.execute(self.sql.put_producer, self.log_id, producer_id, entry.epoch,
                       entry.last_timestamp, entry.encode_batches())

    def stage_removal(self, change: PgChange, producer_id: int) -> None:
        change.execute(self.sql.delete_producer, self.log_id, producer_id)
