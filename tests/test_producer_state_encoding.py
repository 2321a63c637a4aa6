"""A partition's idempotent-producer state survives its encoding (a restart)."""

from __future__ import annotations

from tablets.producer_rules import CACHED_BATCHES, CachedBatch, ProducerEntry


def test_every_cached_batch_round_trips():
    entry = ProducerEntry(epoch=3, last_timestamp=1_700_000_000_000)
    for i in range(CACHED_BATCHES):
        entry.batches.append(CachedBatch(10 * i, 10 * i + 9, -1 if i == 2 else 1000 + 10 * i))
    decoded = ProducerEntry.decode(entry.encode())
    assert (decoded.epoch, decoded.last_timestamp) == (3, 1_700_000_000_000)
    assert list(decoded.batches) == list(entry.batches)
    assert decoded.last_seq == 10 * CACHED_BATCHES - 1
