"""An open transaction's partitions: each with the topic id it was added as,
each persisted under its own key.

``TxnMetadata.partitions`` maps a partition to the id of the topic it was
added as. A topic deleted and recreated under the same name while the
transaction is open has another id: the commit and the abort skip it (no
COMMIT marker lands in the new topic, no blob of it is deleted) and a
Produce of the transaction cannot write to it.

Each partition is one record (``TransactionStorage.put_txn_partition``:
transactional id, transaction instance, topic id, partition -> topic name),
written by the
AddPartitionsToTxn that adds it and deleted in the write that ends the
transaction, so adding a partition costs the same whatever the transaction
holds already, and after ``kill -9`` the open transaction has every
partition it added. State written before (the partitions listed in the
state record, without topic ids) is still read: at load the partitions take
the ids of the topics that exist then, and their keys are written with the
transaction's next change (``TxnPartitions.put_unsaved``).
"""

from __future__ import annotations

from collections.abc import Iterable
from uuid import UUID

from tablets.seam import AtomicChange, PartitionLog, TopicPartition, TransactionStorage

from .state import TxnMetadata


class TxnPartitions:
    def __init__(self, storage: TransactionStorage) -> None:
        self.storage = storage
        # Open transactions loaded from the earlier format: their partition
        # keys are written with the next change.
        self._unsaved: set[str] = set()

    def load(self, meta: TxnMetadata) -> None:
        """Read the open transaction's partitions and their topic ids (start-up)."""
        if not meta.is_open:
            meta.partitions.clear()  # kept by the earlier format only
            return
        if meta.partitions:  # the earlier format: the topics that exist now
            self._unsaved.add(meta.transactional_id)
            for tp in list(meta.partitions):
                tablet = self.tablet(tp)
                if tablet is None:
                    del meta.partitions[tp]
                else:
                    meta.partitions[tp] = tablet.topic_id
        for tp, topic_id in self.storage.txn_partitions(meta.transactional_id, meta.instance):
            meta.partitions[tp] = topic_id

    def tablet(self, tp: TopicPartition, topic_id: UUID | None = None) -> PartitionLog | None:
        """The partition if it exists (and, given ``topic_id``, belongs to that
        topic, not to one of the same name created after it)."""
        if not self.storage.has_partition(*tp):
            return None
        tablet = self.storage.partition(*tp)
        return tablet if topic_id is None or tablet.topic_id == topic_id else None

    def current(self, meta: TxnMetadata) -> dict[TopicPartition, PartitionLog]:
        """The transaction's partitions that still exist as the topics they were added as."""
        return {tp: tablet for tp, topic_id in meta.partitions.items()
                if topic_id is not None and (tablet := self.tablet(tp, topic_id)) is not None}

    def prefixes(self, meta: TxnMetadata) -> dict[TopicPartition, bytes]:
        """The log references (``TransactionStorage.log_ref``) of the
        transaction's partitions that still exist (as the topics they were added as)."""
        return {tp: self.storage.log_ref(tablet) for tp, tablet in self.current(meta).items()}

    def is_current(self, meta: TxnMetadata, tp: TopicPartition) -> bool:
        """Whether ``tp`` is in the transaction as the topic it is now."""
        topic_id = meta.partitions.get(tp)
        return topic_id is not None and self.tablet(tp, topic_id) is not None

    def add(self, meta: TxnMetadata, partitions: Iterable[TopicPartition],
            ops: AtomicChange) -> bool:
        """Add existing partitions to the open transaction: a key each for the
        new ones (or for one re-added after its topic was recreated). Returns
        whether anything was added."""
        added = False
        for tp in set(partitions):
            tablet = self.tablet(tp)
            assert tablet is not None, f"{tp} does not exist"
            known = meta.partitions.get(tp)
            if known == tablet.topic_id:
                continue
            if known is not None:  # the record of the earlier topic
                self.storage.delete_txn_partition(ops, meta.transactional_id, meta.instance, tp,
                                                  known)
            meta.partitions[tp] = tablet.topic_id
            self._put(meta, tp, ops)
            added = True
        return added

    def _put(self, meta: TxnMetadata, tp: TopicPartition, ops: AtomicChange) -> None:
        topic_id = meta.partitions[tp]
        assert topic_id is not None, f"{tp} has no topic id"
        self.storage.put_txn_partition(ops, meta.transactional_id, meta.instance, tp, topic_id)

    def put_unsaved(self, meta: TxnMetadata, ops: AtomicChange) -> None:
        """With a state record written for an open transaction loaded from the
        earlier format (that record no longer lists the partitions): their keys."""
        if meta.transactional_id in self._unsaved and meta.is_open:
            self._unsaved.discard(meta.transactional_id)
            for tp in meta.partitions:
                self._put(meta, tp, ops)

    def forget(self, transactional_id: str) -> None:
        """The id is no longer coordinated here (its slot moved away)."""
        self._unsaved.discard(transactional_id)

    def is_unsaved(self, meta: TxnMetadata) -> bool:
        return meta.transactional_id in self._unsaved

    def drop(self, meta: TxnMetadata, ops: AtomicChange) -> None:
        """The transaction ends: its partition keys go in the same write, and
        it holds no partition any more (as in Kafka, and after a restart)."""
        self._unsaved.discard(meta.transactional_id)
        for tp, topic_id in meta.partitions.items():
            if topic_id is not None:
                self.storage.delete_txn_partition(ops, meta.transactional_id, meta.instance, tp,
                                                  topic_id)
        meta.partitions.clear()
