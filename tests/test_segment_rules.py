"""Kafka's segment roll rules (tablets.segment_rules) alone, over a
persistence port that records what they stage, and the RocksDB engine's port
(tablets.segments): the keys and values it stages, read back."""

from __future__ import annotations

import struct

from tablets import keys
from tablets.rocks_store import Ops, RocksStore
from tablets.segment_rules import NO_TIMESTAMP, Segment, Segments
from tablets.segments import StoredSegments, stored_segments

Staged = list[tuple[str, int, bytes]]  # ("put" | "delete" | "delete below", base, value)


class Recorded:
    """A persistence port whose atomic change is a list of what was staged."""

    def __init__(self, closed: list[Segment] | None = None) -> None:
        self.closed = closed or []

    def load(self) -> list[Segment]:
        return list(self.closed)

    def stage_segment(self, change: Staged, segment: Segment) -> None:
        change.append(("put", segment.base, segment.encode()))

    def stage_removal(self, change: Staged, base: int) -> None:
        change.append(("delete", base, b""))

    def stage_removal_below(self, change: Staged, base: int) -> None:
        change.append(("delete below", base, b""))


def test_a_segment_rolls_past_segment_bytes_or_segment_ms():
    s = Segments(Recorded())
    change: Staged = []
    s.add(0, 60, 1_000, 100, 10_000, True, change)
    s.add(1, 30, 1_500, 100, 10_000, True, change)
    assert change == [] and s.active == Segment(0, 90, 1_000, 1_500)
    s.add(2, 20, 1_600, 100, 10_000, True, change)  # 110 bytes > segment.bytes: roll first
    assert change == [("put", 0, Segment(0, 90, 1_000, 1_500).encode())]
    assert s.active == Segment(2, 20, 1_600, 1_600)
    change.clear()
    s.add(3, 1, 11_601, 100, 10_000, True, change)  # more than segment.ms after 1_600
    assert [base for _, base, _ in change] == [2] and s.active.base == 3
    assert [seg.base for seg in s.closed] == [0, 2]


def test_a_topic_not_compacted_keeps_its_closed_segments_as_one():
    s = Segments(Recorded())
    change: Staged = []
    for offset in range(4):
        s.add(offset, 60, 1_000 + offset, 100, 10_000, False, change)
    assert [(seg.base, seg.size) for seg in s.closed] == [(0, 180)]
    assert [base for _, base, _ in change] == [0, 0, 0]
    assert s.active == Segment(3, 60, 1_003, 1_003)


def test_truncation_drops_the_segments_below_the_new_start():
    s = Segments(Recorded())
    s.load(Segment(30, 10, 5, 5))
    s.closed = [Segment(0, 10, 1, 1), Segment(10, 10, 2, 2), Segment(20, 10, 3, 3)]
    change: Staged = []
    s.truncate(15, 14, change)  # the first segment whole, 4 bytes of the second
    assert change == [("delete below", 10, b""), ("put", 10, Segment(10, 6, 2, 2).encode())]
    assert [seg.base for seg in s.closed] == [10, 20]


def test_a_cut_drops_the_segments_past_it_and_shrinks_from_the_newest():
    s = Segments(Recorded([Segment(0, 10, 1, 1), Segment(10, 10, 2, 2), Segment(20, 10, 3, 3)]))
    s.load(Segment(30, 10, 4, 4))
    change: Staged = []
    s.cut(20, 15, change)  # the log now ends at 20 with 15 bytes in it
    assert s.active == Segment(20, 0, NO_TIMESTAMP, NO_TIMESTAMP)
    assert [(seg.base, seg.size) for seg in s.closed] == [(0, 10), (10, 5)]
    assert change == [("delete", 20, b""), ("put", 10, Segment(10, 5, 2, 2).encode())]


def test_compaction_merges_clean_neighbours_and_flushes_once_per_segment():
    s = Segments(Recorded([Segment(0, 40, 1, 1), Segment(10, 40, 2, 2), Segment(20, 40, 3, 3)]))
    s.load(Segment(30, 10, 4, 4))
    s.resize([(5, -30), (15, -30), (25, -5)])
    s.merge_clean(30, 50)  # 10 + 10 fit segment.bytes, 20 + 35 do not
    assert [(seg.base, seg.size) for seg in s.closed] == [(0, 20), (20, 35)]
    change: Staged = []
    s.flush(change)
    assert sorted(change) == sorted([("delete", 10, b""), ("put", 0, Segment(0, 20, 1, 2).encode()),
                                     ("put", 20, Segment(20, 35, 3, 3).encode())])
    again: Staged = []
    s.flush(again)
    assert again == []


def test_the_rocksdb_port_keeps_s_keys_read_back_in_order(tmp_path):
    store = RocksStore(str(tmp_path / "db"))
    try:
        prefix = b"s" * 20
        s = stored_segments(store, prefix)
        ops = Ops()
        for offset, size in ((0, 60), (1, 60), (2, 60), (3, 60)):
            s.add(offset, size, 1_000 + offset, 100, 10_000, True, ops)
        # As the store has always kept them: S + prefix + base, size and timestamps.
        assert ops.puts == [(keys.offset_key(keys.SEGMENT, prefix, base),
                             struct.pack(">qqq", 60, 1_000 + base, 1_000 + base))
                            for base in (0, 1, 2)]
        store.write_now(ops)
        loaded = Segments(StoredSegments(store, prefix))
        loaded.load(s.active)
        assert loaded.closed == s.closed
        change = Ops()
        loaded.truncate(2, 120, change)
        assert change.delete_ranges == [(keys.offset_key(keys.SEGMENT, prefix, 0),
                                         keys.offset_key(keys.SEGMENT, prefix, 2))]
    finally:
        store.close()
