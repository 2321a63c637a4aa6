"""A transactional Produce to a partition's leader that does not coordinate
the transactional id (a cluster over PostgreSQL: docs/cluster-design.md, "A
transactional Produce to a leader that does not coordinate its id").

The leader reads the id's stored state (``RemoteTxnStore.read_txn``) and
checks it as the coordinator checks a batch of its own (``coordinator.
sink_for``, Kafka 3.6+'s verification), with the same answers:

- no such id, or another producer id: INVALID_PRODUCER_ID_MAPPING;
- another epoch: PRODUCER_FENCED (Produce answers INVALID_PRODUCER_EPOCH);
- no open transaction, or the partition not added to it (or added as a
  topic since deleted and recreated): INVALID_TXN_STATE;
- the transaction can only abort: TxnDoomed (abortable, as at the coordinator).

The batch then goes to the store's sink for that transaction, which checks
the same row again, locked, in the PostgreSQL transaction that stores the
batch; the coordinator's end locks it first (``lock_txn``) and publishes
what the leaders stored with its own, in the producer's order (``stage_remote_commit``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol
from uuid import UUID

from tablets.seam import AtomicChange, BlobSink, PartitionLog, TopicPartition

from .errors import InvalidProducerIdMapping, InvalidTxnState, ProducerFenced, TxnDoomed
from .state import TxnMetadata


class RemoteTxnStore(Protocol):
    """What the store offers (``pgstore.remote_txn.PgRemoteTxns``)."""

    async def read_txn(self, transactional_id: str,
                       ) -> tuple[bytes, dict[TopicPartition, UUID]] | None: ...

    def pending_sink(self, transactional_id: str, producer_id: int, epoch: int, instance: int,
                     tp: TopicPartition, topic_id: UUID) -> BlobSink: ...

    def lock_txn(self, change: AtomicChange, transactional_id: str) -> None: ...

    def stage_remote_commit(self, change: AtomicChange, log: PartitionLog, instance: int,
                            transactional_id: str, own: bool = False) -> bool: ...


class RemoteTransactions:
    """The transactions this gateway does not coordinate, as a partition's
    leader sees them; and the coordinator's part of their end."""

    def __init__(self, store: RemoteTxnStore, coordinates: Callable[[str], bool]) -> None:
        self.store = store
        self.coordinates = coordinates

    async def read(self, transactional_id: str) -> TxnMetadata | None:
        """The id's stored state, with the partitions of its open transaction."""
        found = await self.store.read_txn(transactional_id)
        if found is None:
            return None
        value, partitions = found
        meta = TxnMetadata.decode(transactional_id, value)
        meta.partitions = dict(partitions)
        return meta

    def sink(self, meta: TxnMetadata | None, transactional_id: str, producer_id: int,
             epoch: int, topic: str, partition: int, topic_id: UUID) -> BlobSink:
        """Where the batch goes, or the error refusing it (see the module's docstring)."""
        if meta is None or meta.producer_id != producer_id:
            raise InvalidProducerIdMapping(
                f"transactional id {transactional_id!r} is not mapped to producer {producer_id}")
        if epoch != meta.epoch:
            raise ProducerFenced(f"{transactional_id}: epoch {epoch} is not the current "
                                 f"{meta.epoch}: a newer producer session fenced this one")
        tp = (topic, partition)
        if not meta.is_open or tp not in meta.partitions:
            raise InvalidTxnState(f"{topic}-{partition} is not part of an open transaction of "
                                  f"{transactional_id} (AddPartitionsToTxn first)")
        if meta.partitions[tp] != topic_id:
            raise InvalidTxnState(f"topic {topic} was deleted and recreated after "
                                  f"{transactional_id} added {topic}-{partition}")
        if meta.abort_only is not None:
            raise TxnDoomed(f"{topic}-{partition}: the transaction can only abort: "
                            f"{meta.abort_only}")
        return self.store.pending_sink(transactional_id, producer_id, epoch, meta.instance, tp,
                                       topic_id)
