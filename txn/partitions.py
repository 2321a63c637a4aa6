"""An open transaction's partitions: each with the topic id it was added as,
each persisted under its own key.

``TxnMetadata.partitions`` maps a partition to the id of the topic it was
added as. A topic deleted and recreated under the same name while the
transaction is open has another id: the commit and the abort skip it (no
COMMIT marker lands in the new topic, no blob of it is deleted) and a
Produce of the transaction cannot write to it.

Each partition is one key (``keys.TXN_PARTITION``: transactional id,
transaction instance, topic id, partition -> topic name), written by the
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

from tablets.consumer_offsets import TopicPartition
from tablets.engine import StorageEngine
from tablets.store import Ops
from tablets.tablet import PartitionTablet

from .state import TxnMetadata, decode_partition_entry, partition_entry, partitions_range


class TxnPartitions:
    def __init__(self, engine: StorageEngine) -> None:
        self.engine = engine
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
        for key, value in self.engine.store.scan(*partitions_range(meta)):
            tp, topic_id = decode_partition_entry(key, value)
            meta.partitions[tp] = topic_id

    def tablet(self, tp: TopicPartition, topic_id: UUID | None = None) -> PartitionTablet | None:
        """The partition if it exists (and, given ``topic_id``, belongs to that
        topic, not to one of the same name created after it)."""
        if not self.engine.has_partition(*tp):
            return None
        tablet = self.engine.partition(*tp)
        return tablet if topic_id is None or tablet.topic_id == topic_id else None

    def current(self, meta: TxnMetadata) -> dict[TopicPartition, PartitionTablet]:
        """The transaction's partitions that still exist as the topics they were added as."""
        return {tp: tablet for tp, topic_id in meta.partitions.items()
                if topic_id is not None and (tablet := self.tablet(tp, topic_id)) is not None}

    def prefixes(self, meta: TxnMetadata) -> dict[TopicPartition, bytes]:
        """The key prefixes of the transaction's partitions that still exist (as
        the topics they were added as)."""
        return {tp: tablet.prefix for tp, tablet in self.current(meta).items()}

    def is_current(self, meta: TxnMetadata, tp: TopicPartition) -> bool:
        """Whether ``tp`` is in the transaction as the topic it is now."""
        topic_id = meta.partitions.get(tp)
        return topic_id is not None and self.tablet(tp, topic_id) is not None

    def add(self, meta: TxnMetadata, partitions: Iterable[TopicPartition], ops: Ops) -> bool:
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
            if known is not None:  # the key of the earlier topic
                ops.delete(partition_entry(meta, tp)[0])
            meta.partitions[tp] = tablet.topic_id
            ops.put(*partition_entry(meta, tp))
            added = True
        return added

    def put_unsaved(self, meta: TxnMetadata, ops: Ops) -> None:
        """With a state record written for an open transaction loaded from the
        earlier format (that record no longer lists the partitions): their keys."""
        if meta.transactional_id in self._unsaved and meta.is_open:
            self._unsaved.discard(meta.transactional_id)
            for tp in meta.partitions:
                ops.put(*partition_entry(meta, tp))

    def is_unsaved(self, meta: TxnMetadata) -> bool:
        return meta.transactional_id in self._unsaved

    def drop(self, meta: TxnMetadata, ops: Ops) -> None:
        """The transaction ends: its partition keys go in the same write, and
        it holds no partition any more (as in Kafka, and after a restart)."""
        self._unsaved.discard(meta.transactional_id)
        for tp, topic_id in meta.partitions.items():
            if topic_id is not None:
                ops.delete(partition_entry(meta, tp)[0])
        meta.partitions.clear()
