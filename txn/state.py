"""A transactional id's state, its transitions, and how it is stored.

Kafka's transaction states, collapsed the way a single node allows. Kafka
writes markers to every partition after it logged PrepareCommit/PrepareAbort,
so a coordinator failover can finish the job; here a commit or an abort is
ONE atomic store write, so the prepare states and PrepareEpochFence never
exist: a transaction goes from Ongoing straight to CompleteCommit or
CompleteAbort. They are still named, because DescribeTransactions and
ListTransactions speak Kafka's names.

The transition table is data, asserted by tests/test_txn_state.py.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from uuid import UUID

from tablets.seam import OffsetCommit, TopicPartition


class TxnState(enum.Enum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"  # never entered: the commit is one write
    PREPARE_ABORT = "PrepareAbort"  # never entered: the abort is one write
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"
    DEAD = "Dead"  # expired (transactional.id.expiration.ms): forgotten
    PREPARE_EPOCH_FENCE = "PrepareEpochFence"  # never entered


# state -> the states it may move to. InitProducerId moves any live state to
# Empty (aborting an open transaction in the same write); the first request
# of a transaction moves Empty or Complete* to Ongoing.
TRANSITIONS: dict[TxnState, frozenset[TxnState]] = {
    TxnState.EMPTY: frozenset({TxnState.EMPTY, TxnState.ONGOING, TxnState.DEAD}),
    TxnState.ONGOING: frozenset({TxnState.ONGOING, TxnState.COMPLETE_COMMIT,
                                 TxnState.COMPLETE_ABORT, TxnState.EMPTY}),
    TxnState.COMPLETE_COMMIT: frozenset({TxnState.EMPTY, TxnState.ONGOING, TxnState.DEAD}),
    TxnState.COMPLETE_ABORT: frozenset({TxnState.EMPTY, TxnState.ONGOING, TxnState.DEAD}),
    TxnState.DEAD: frozenset(),
    TxnState.PREPARE_COMMIT: frozenset(),
    TxnState.PREPARE_ABORT: frozenset(),
    TxnState.PREPARE_EPOCH_FENCE: frozenset(),
}


class IllegalTransition(RuntimeError):
    """A bug: the coordinator tried a transition the table does not allow."""


@dataclass(slots=True)
class TxnMetadata:
    """One transactional id, as persisted (``TransactionStorage.put_txn_state``);
    the open transaction's partitions are persisted each as its own record
    (``TransactionStorage.put_txn_partition``), so adding one writes one record
    whatever the transaction holds already.

    ``partitions`` maps each partition to the id of the topic it was added
    as: a topic deleted and recreated under the same name has another id,
    and the transaction must not touch it. (None: state written before the
    ids were kept, resolved when the coordinator loads it.)

    ``instance`` numbers the current (or last) transaction node-wide: its
    blobs are stored under it, so nothing of an earlier transaction of the
    same producer can be mistaken for this one's. ``begin_version`` is the
    consumer-offsets version when the transaction began: an offset of a
    partition it commits that changed after that conflicts with it.
    """

    transactional_id: str
    producer_id: int
    epoch: int
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    last_producer_id: int = -1  # before the last epoch overflow (KIP-360 retries)
    last_epoch: int = -1  # the epoch before the last bump (KIP-360 retries)
    instance: int = 0
    started_ms: int = -1  # when the current transaction began
    updated_ms: int = -1
    begin_version: int = 0
    partitions: dict[TopicPartition, UUID | None] = field(default_factory=dict)
    # group -> partition -> offset, staged by TxnOffsetCommit, written at commit
    offsets: dict[str, dict[TopicPartition, OffsetCommit]] = field(default_factory=dict)
    groups: set[str] = field(default_factory=set)  # AddOffsetsToTxn
    abort_only: str | None = None  # why the open transaction can only abort
    # group -> partition -> the member (kafka_gateway.groups.fences.member_tag) whose
    # TxnOffsetCommit staged it, for staged offsets that were member-fenced
    # (KIP-447): EndTxn's re-check applies the same rule (txn.conflicts).
    members: dict[str, dict[TopicPartition, str]] = field(default_factory=dict)

    def move(self, state: TxnState) -> None:
        if state not in TRANSITIONS[self.state]:
            raise IllegalTransition(f"{self.transactional_id}: {self.state.value} -> "
                                    f"{state.value}")
        self.state = state

    @property
    def is_open(self) -> bool:
        return self.state is TxnState.ONGOING

    def encode(self) -> bytes:
        return json.dumps({
            "pid": self.producer_id, "epoch": self.epoch, "timeout": self.timeout_ms,
            "state": self.state.value, "last_pid": self.last_producer_id,
            "last_epoch": self.last_epoch, "instance": self.instance,
            "started": self.started_ms, "updated": self.updated_ms,
            "begin_version": self.begin_version,
            "groups": sorted(self.groups),
            "offsets": {g: [[t, p, c.offset, c.leader_epoch, c.metadata]
                            for (t, p), c in sorted(o.items())]
                        for g, o in self.offsets.items()},
            "abort_only": self.abort_only,
            "members": {g: [[t, p, m] for (t, p), m in sorted(o.items())]
                        for g, o in self.members.items() if o},
        }, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, transactional_id: str, value: bytes) -> TxnMetadata:
        """The state without its partitions (each its own record), or, in
        the earlier format, with them but without their topic ids (None)."""
        d = json.loads(value)
        return cls(
            transactional_id, d["pid"], d["epoch"], d["timeout"], TxnState(d["state"]),
            d["last_pid"], d["last_epoch"], d["instance"], d["started"], d["updated"],
            d["begin_version"], {(t, p): None for t, p in d.get("partitions", ())},
            {g: {(t, p): OffsetCommit(o, e, m) for t, p, o, e, m in rows}
             for g, rows in d["offsets"].items()},
            # "doomed": the key's name in states written before 2026-11-27.
            set(d["groups"]), d["abort_only"] if "abort_only" in d else d["doomed"],
            # Absent in states written before member-fenced offsets were kept.
            {g: {(t, p): m for t, p, m in rows} for g, rows in d.get("members", {}).items()},
        )
