"""The offsets open transactions staged (``txn.pending_offsets``): what OffsetFetch's
require_stable, DeleteGroups and offset expiry ask about. Moved here from
tests/test_consumer_offsets.py with the bookkeeping (issue 20)."""

from __future__ import annotations

from tablets.consumer_offsets import OffsetCommit
from txn.pending_offsets import PendingOffsets


def test_pending_offsets_are_counted_per_holder():
    pending = PendingOffsets()
    pending.hold("g", [("t", 0)])
    pending.hold("g", [("t", 0), ("t", 1)])
    pending.release("g", [("t", 0)])
    assert pending.is_pending("g", "t", 0) and pending.is_pending("g", "t", 1)
    assert pending.has_pending("g") and not pending.has_pending("other")
    pending.release("g", [("t", 0), ("t", 1)])
    assert not pending.is_pending("g", "t", 0) and not pending.is_pending("g", "t", 1)
    assert not pending.has_pending("g")
    pending.release("nobody", [("t", 0)])  # harmless


def test_pending_offsets_held_and_released_by_mapping():
    """The coordinator passes its staged offsets (partition -> offset) as they are."""
    pending = PendingOffsets()
    pending.hold("g", {("t", 0): OffsetCommit(5, -1, ""), ("t", 1): OffsetCommit(7)})
    assert pending.is_pending("g", "t", 0) and pending.is_pending("g", "t", 1)
    pending.release("g", {("t", 0): OffsetCommit(5, -1, "")})
    assert not pending.is_pending("g", "t", 0) and pending.is_pending("g", "t", 1)
    pending.release("g", {("t", 1): OffsetCommit(7)})
    assert not pending.is_pending("g", "t", 1)
