"""InMemoryBatches: batches held in memory, trimmed from the front in O(1)."""

from __future__ import annotations

from tablets.in_memory_batches import InMemoryBatches


def run_of(count: int, size: int = 10) -> InMemoryBatches:
    run = InMemoryBatches()
    for i in range(count):
        run.append(i * 2, bytes([i % 256]) * size)  # batches of two records
    return run


def test_slice_starts_at_the_batch_containing_the_offset():
    run = run_of(5)
    assert run.slice(3, end=10, max_bytes=25, min_one=True) == [b"\x01" * 10, b"\x02" * 10]
    assert run.slice(0, end=4, max_bytes=1000, min_one=True) == [b"\x00" * 10, b"\x01" * 10]
    assert run.slice(8, end=10, max_bytes=1, min_one=True) == [b"\x04" * 10]  # KIP-74
    assert run.slice(8, end=10, max_bytes=1, min_one=False) == []


def test_trim_keeps_the_newest_batch_and_frees_the_rest():
    run = run_of(3000)
    run.trim(budget=55)
    assert len(run) == 5 and run.nbytes == 50
    assert run.first_offset(default=-1) == 2 * 2995
    assert run.slice(0, end=10**9, max_bytes=10**9, min_one=True)[0] == bytes([2995 % 256]) * 10
    run.trim(budget=0)
    assert len(run) == 1  # never empty while it holds anything
    assert len(run._offsets) < 3000  # the dropped entries were compacted away


def test_drop_below_keeps_the_batch_containing_the_offset():
    run = run_of(10)
    run.drop_below(7)  # offset 7 is in the batch starting at 6
    assert run.first_offset(default=-1) == 6
    assert run.nbytes == 70  # batches 6, 8, ..., 18
    assert InMemoryBatches().first_offset(default=42) == 42
