"""The compaction planner (tablets.compaction) with no engine under it: a
run reads its batches through ``BatchesInOrder`` alone, here an in-memory
log, and hands back the engine's entries and sizes it was given."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from tablets import batch as batch_header
from tablets import compaction
from tablets.compaction import Plan, Throttle
from tablets.seam import RunStats
from testkit.compaction import decode, keyed_batch, now_ms


class InMemoryLog:
    """Batches at their offsets; each entry names its batch, each size is made up."""

    def __init__(self, batches: list[bytes]) -> None:
        self.batches_at: list[tuple[int, bytes]] = []
        offset = 0
        for data in batches:
            [header] = batch_header.parse_batches(data)
            self.batches_at.append((offset, batch_header.stamp(memoryview(data), header,
                                                               offset, 0)))
            offset += header.record_count
        self.asked: list[tuple[int, int]] = []

    def batches(self, start: int, end: int) -> Iterator[tuple[bytes, int, bytes]]:
        self.asked.append((start, end))
        for offset, data in self.batches_at:
            if offset < end and batch_header.last_offset_of(data) >= start:
                yield f"entry {offset}".encode(), 1000 + offset, data


def test_a_run_reads_through_the_port_and_keeps_the_newest_of_each_key():
    stamp = now_ms()
    log = InMemoryLog([keyed_batch([(b"a", b"1"), (b"b", b"1")], timestamp=stamp),
                       keyed_batch([(b"a", b"2")], timestamp=stamp + 1),
                       keyed_batch([(b"c", b"1")], timestamp=stamp + 2)])
    stats = RunStats()
    plan = Plan(log_start=0, first_dirty=0, first_uncleanable=4, now_ms=stamp + 3,
                delete_retention_ms=0)
    [chunk] = compaction.run(log, plan, b"\0" * 16, 100,
                             Throttle(float("inf"), threading.Event()), stats)
    assert log.asked == [(0, 4), (0, 4)]  # the offset map, then the rewrite
    [change] = chunk.changes
    assert (change.offset, change.old_size, change.entry) == (0, 1000, b"entry 0")
    assert change.data is not None
    assert [(r.offset, r.key, r.value) for r in decode(change.data)] == [(1, b"b", b"1")]
    assert list(chunk.bases) == [0, 2, 3] and chunk.last and chunk.clean_end == 4
    assert (stats.keys, stats.map_end, stats.records_read, stats.records_kept) == (3, 4, 4, 3)
    assert stats.bytes_reclaimed == 1000 - len(change.data)
