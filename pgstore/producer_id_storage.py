"""What the transaction coordinator may ask of the PostgreSQL store, today:
producer ids, and nothing transactional yet.

Transactions on PostgreSQL have their storage at library level
(``txn_storage.PgTransactionStorage``), not yet plugged into the engine's
partition logs (their pending batches, their publication); that is the next
piece of work. Until then the coordinator
still starts over this store and hands out producer ids, so idempotent
producers work (their InitProducerId allocates an id: the ``counters`` row,
written in the change that allocates it). Everything a transactional id
needs raises ``TransactionsUnavailable``, which the protocol answers with
INVALID_TXN_STATE, an error no client retries: InitProducerId with a
transactional id fails, and nothing of a transaction is ever stored.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, NoReturn
from uuid import UUID

from tablets.errors import StorageError, TransactionsUnavailable
from tablets.seam import (
    AtomicChange,
    CommittedOffset,
    ConsumerOffsetStore,
    OffsetCommit,
    PartitionLog,
    PendingBlob,
    RecoveredBlob,
    TopicPartition,
)

from .migrate import quoted
from .writer import PgChange

if TYPE_CHECKING:
    from .migrate import Connection
    from .writer import PgWriter


def _unavailable() -> NoReturn:
    raise TransactionsUnavailable("transactions are not yet available on the PostgreSQL store")


class PgProducerIdStorage:
    def __init__(self, writer: PgWriter, schema: str,
                 offsets: Callable[[], ConsumerOffsetStore],
                 partition: Callable[[str, int], PartitionLog],
                 has_partition: Callable[[str, int], bool]) -> None:
        self._writer = writer
        self._offsets = offsets
        self.partition = partition
        self.has_partition = has_partition
        self._counters: dict[str, int] = {}
        s = quoted(schema)
        self._select_counters = f"SELECT name, value FROM {s}.counters"
        # Only ever forward: several gateways hand out ids from one row, each
        # from the value it last saw, so a value another gateway already
        # took is refused (its change fails, retriably) and never given twice.
        self._put_counter = (f"INSERT INTO {s}.counters AS c (name, value) VALUES ($1, $2) "
                             "ON CONFLICT (name) DO UPDATE SET value = excluded.value "
                             "WHERE c.value < excluded.value RETURNING c.value")

    async def load(self, conn: Connection) -> None:
        self._counters = {row["name"]: int(row["value"])
                          for row in await conn.fetch(self._select_counters)}

    # the seam's ChangeWriter
    def begin(self) -> PgChange:
        return self._writer.begin()

    def commit(self, change: AtomicChange) -> asyncio.Future[None]:
        return self._writer.commit(change)

    @property
    def consumer_offsets(self) -> ConsumerOffsetStore:
        return self._offsets()

    # counters (producer ids)
    def counter(self, name: str) -> int | None:
        return self._counters.get(name)

    def set_counter(self, change: AtomicChange, name: str, value: int) -> None:
        assert isinstance(change, PgChange), "a change made by another engine"
        change.fence(self._put_counter, name, value, refused=lambda: StorageError(
            f"counter {name}: {value} was already taken through another gateway; retry"))

        def durable() -> None:
            self._counters[name] = max(value, self._counters.get(name, value))

        change.on_durable(durable)

    # transactional state: none is ever stored here
    def txn_states(self) -> Iterable[tuple[str, bytes]]:
        return ()

    def txn_partitions(self, transactional_id: str,
                       instance: int) -> Iterable[tuple[TopicPartition, UUID]]:
        return ()

    def put_txn_state(self, change: AtomicChange, transactional_id: str, value: bytes) -> None:
        _unavailable()

    def delete_txn_state(self, change: AtomicChange, transactional_id: str) -> None:
        _unavailable()

    def put_txn_partition(self, change: AtomicChange, transactional_id: str, instance: int,
                          tp: TopicPartition, topic_id: UUID) -> None:
        _unavailable()

    def delete_txn_partition(self, change: AtomicChange, transactional_id: str,
                             instance: int, tp: TopicPartition, topic_id: UUID) -> None:
        _unavailable()

    def log_ref(self, log: PartitionLog) -> bytes:
        _unavailable()

    def pending_ref(self, log_ref: bytes, instance: int, ordinal: int) -> bytes:
        _unavailable()

    def pending_log_ref(self, ref: bytes) -> bytes:
        _unavailable()

    def stage_commit(self, change: AtomicChange, log: PartitionLog,
                     blobs: list[PendingBlob], marker: bytes) -> Callable[[], None]:
        _unavailable()

    def stage_offsets(self, change: AtomicChange, group: str,
                      commits: Mapping[TopicPartition, OffsetCommit], now_ms: int,
                      committer: str, members: Mapping[TopicPartition, str] | None,
                      ) -> dict[TopicPartition, CommittedOffset]:
        _unavailable()

    def abort_pending(self, change: AtomicChange, log_ref: bytes, instance: int) -> None:
        _unavailable()

    def recover_pending(self, log_ref: bytes, instance: int) -> list[RecoveredBlob]:
        _unavailable()
