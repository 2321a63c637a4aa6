"""What a partition log's collaborators (``appends``, ``truncation``) see of
it: ``LogState``, the narrow view of ``PgPartitionLog`` they are built
with, and ``LogContext``, what every partition of a node shares."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import asyncpg

    from tablets.in_memory_batches import InMemoryBatches
    from tablets.producer_rules import ProducerStates
    from tablets.tablet_settings import TabletSettings

    from .log_sql import LogRow, LogSql
    from .producer_rows import PgProducerRows
    from .txn_publication import TxnPartition
    from .writer import PgChange, PgWriter


class PendingStore(Protocol):
    """Where a transactional append stages its batch (``PgTransactionStorage``)."""

    def stage_pending(self, change: PgChange, log: TxnPartition, ref: bytes,
                      batch: bytes | memoryview, transactional_id: str | None = None,
                      ) -> bytes: ...


@dataclass(frozen=True, slots=True)
class LogContext:
    """What every partition of a node shares."""

    writer: PgWriter
    pool: asyncpg.Pool  # reads
    sql: LogSql
    validators: Executor  # checks compressed and large batches off the event loop
    # Transactional batches' storage (None: transactional appends are refused).
    pending: PendingStore | None = None
    # Batches carry the partition's leader epoch (in a cluster, where
    # Metadata answers it: the server always runs one); else 0, the one
    # epoch Metadata answers, as on the embedded engine.
    batch_epochs: bool = False


class LogState(Protocol):
    context: LogContext
    writer: PgWriter
    sql: LogSql
    validators: Executor
    settings: Callable[[], TabletSettings]
    log_id: int
    leader_epoch: int
    log_start_offset: int
    log_end_offset: int
    high_watermark: int
    size_bytes: int
    running_max_timestamp: int
    mean_batch_bytes: float
    deleted: bool
    fenced: bool
    tail: InMemoryBatches
    tail_end: int
    producer_rows: PgProducerRows
    producer_states: ProducerStates[PgChange]

    @property
    def name(self) -> str: ...

    @property
    def batch_epoch(self) -> int: ...

    def check_writable(self) -> None: ...
    def fence_epoch(self, change: PgChange, stopped: str = "") -> None: ...
    def append_durable(self, base_offset: int, end: int, data: bytes,
                       in_order: bool) -> None: ...
    def reset_from(self, row: LogRow) -> None: ...
    def release(self) -> None: ...
    def wake_waiters(self) -> None: ...
    def catch_up(self) -> None: ...
