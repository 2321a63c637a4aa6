"""The transaction state machine (txn.state): every allowed and every forbidden
transition, and the persisted form of a transactional id's metadata."""

from __future__ import annotations

import itertools
import json
import uuid

import pytest

from tablets import keys, txn_storage
from tablets.consumer_offsets import OffsetCommit
from tablets.txn_storage import decode_partition_entry
from txn.state import TRANSITIONS, IllegalTransition, TxnMetadata, TxnState


def partition_entry(meta: TxnMetadata, tp: tuple[str, int]) -> tuple[bytes, bytes]:
    """The engine's record of one partition of ``meta``'s open transaction."""
    topic_id = meta.partitions[tp]
    assert topic_id is not None
    return txn_storage.partition_entry(meta.transactional_id, meta.instance, tp, topic_id)


def partitions_range(meta: TxnMetadata) -> tuple[bytes, bytes]:
    return txn_storage.partitions_range(meta.transactional_id, meta.instance)


E, ON, CC, CA = TxnState.EMPTY, TxnState.ONGOING, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT
DEAD = TxnState.DEAD

# Kafka's machine with the prepare states collapsed: a commit or an abort is
# one write, and InitProducerId aborts an open transaction in its own write.
ALLOWED = {
    (E, E), (E, ON), (E, DEAD),
    (ON, ON), (ON, CC), (ON, CA), (ON, E),
    (CC, E), (CC, ON), (CC, DEAD),
    (CA, E), (CA, ON), (CA, DEAD),
}


def meta(state: TxnState) -> TxnMetadata:
    return TxnMetadata("tid", 1, 0, 60_000, state)


def test_the_table_is_exactly_the_allowed_transitions():
    table = {(a, b) for a, targets in TRANSITIONS.items() for b in targets}
    assert table == ALLOWED
    assert set(TRANSITIONS) == set(TxnState)


@pytest.mark.parametrize(("before", "after"), list(itertools.product(TxnState, TxnState)),
                         ids=lambda s: s.value)
def test_move(before: TxnState, after: TxnState):
    m = meta(before)
    if (before, after) in ALLOWED:
        m.move(after)
        assert m.state is after
    else:
        with pytest.raises(IllegalTransition):
            m.move(after)
        assert m.state is before


def test_prepare_states_are_never_entered_and_dead_is_final():
    never = {TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT, TxnState.PREPARE_EPOCH_FENCE}
    assert all(not targets & never for targets in TRANSITIONS.values())
    assert all(TRANSITIONS[state] == frozenset() for state in never | {DEAD})


def test_only_ongoing_is_open():
    assert [s for s in TxnState if meta(s).is_open] == [ON]


TOPIC_A, TOPIC_B = uuid.uuid4(), uuid.uuid4()


def full(state: TxnState) -> TxnMetadata:
    return TxnMetadata(
        "tx-é/1\x00x", producer_id=4242, epoch=32766, timeout_ms=900_000, state=state,
        last_producer_id=17, last_epoch=32765, instance=99, started_ms=1_700_000_000_001,
        updated_ms=1_700_000_000_500, begin_version=12345,
        partitions={("a", 0): TOPIC_A, ("a", 1): TOPIC_A, ("b.c", 7): TOPIC_B},
        offsets={"g1": {("a", 0): OffsetCommit(10, 3, "meta"), ("b.c", 7): OffsetCommit(0)},
                 "g2": {("a", 1): OffsetCommit(2**40, -1, "ünïcode")}},
        groups={"g1", "g2"}, abort_only="conflict: version moved")


@pytest.mark.parametrize("state", list(TxnState), ids=lambda s: s.value)
def test_metadata_round_trips(state: TxnState):
    """The state record, and a key per partition (with its topic id)."""
    meta = full(state)
    decoded = TxnMetadata.decode(meta.transactional_id, meta.encode())
    assert decoded.partitions == {}  # not in the record: each has its own key
    entries = dict(partition_entry(meta, tp) for tp in meta.partitions)
    start, end = partitions_range(meta)
    assert all(start <= key < end for key in entries)
    decoded.partitions = dict(decode_partition_entry(k, v) for k, v in entries.items())
    assert decoded == meta


def test_partition_keys_of_other_ids_and_instances_fall_outside_the_range():
    meta = full(TxnState.ONGOING)
    start, end = partitions_range(meta)
    others = [keys.txn_partition_key(tid, instance, TOPIC_A, 0) for tid, instance in (
        (meta.transactional_id, 98), (meta.transactional_id, 100),
        (meta.transactional_id + "y", 99), (meta.transactional_id[:-1], 99), ("", 99))]
    assert not [key for key in others if start <= key < end]
    highest = keys.txn_partition_key(meta.transactional_id, 99, uuid.UUID(int=2**128 - 1),
                                     2**31 - 1)
    assert start <= highest < end


def test_the_earlier_format_still_decodes():
    """State written before partitions had their own keys: the partitions are
    in the record, without topic ids (the coordinator resolves them at load)."""
    meta = full(TxnState.ONGOING)
    earlier = json.loads(meta.encode())
    earlier["partitions"] = sorted(meta.partitions)
    decoded = TxnMetadata.decode(meta.transactional_id, json.dumps(earlier).encode())
    assert decoded.partitions == dict.fromkeys(meta.partitions)
    decoded.partitions = meta.partitions
    assert decoded == meta


def test_a_state_written_with_the_key_doomed_still_decodes():
    """The abort-only reason was stored as "doomed" before it was renamed
    (stores written that day have it)."""
    meta = full(TxnState.ONGOING)
    earlier = json.loads(meta.encode())
    earlier["doomed"] = earlier.pop("abort_only")
    decoded = TxnMetadata.decode(meta.transactional_id, json.dumps(earlier).encode())
    assert decoded.abort_only == "conflict: version moved"
    decoded.partitions = meta.partitions
    assert decoded == meta


def test_fresh_metadata_round_trips():
    fresh = TxnMetadata("t", 0, 0, 1)
    assert TxnMetadata.decode("t", fresh.encode()) == fresh
