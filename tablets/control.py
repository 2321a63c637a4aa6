"""Control batches: the COMMIT marker a committed transaction leaves in each
of its partitions, so the log reads as Kafka's does.

Aborted transactions leave nothing (their data never enters a log), so the
ABORT marker is never written. A marker is one record whose key is
(version 0, type) and whose value is (version 0, coordinator epoch), in a
batch flagged transactional and control, carrying the producer's id and epoch.
"""

from __future__ import annotations

import struct

from .batch import ATTR_CONTROL, ATTR_TRANSACTIONAL, build_batch
from .batch import zigzag_varint as _zigzag

COMMIT = 1
COORDINATOR_EPOCH = 0  # one coordinator, forever


def _marker_record(kind: int) -> bytes:
    key = struct.pack(">hh", 0, kind)
    value = struct.pack(">hi", 0, COORDINATOR_EPOCH)
    body = (b"\x00" + _zigzag(0) + _zigzag(0) + _zigzag(len(key)) + key
            + _zigzag(len(value)) + value + _zigzag(0))
    return _zigzag(len(body)) + body


_COMMIT_RECORD = _marker_record(COMMIT)


def commit_marker(producer_id: int, epoch: int, timestamp_ms: int) -> bytes:
    """A COMMIT control batch (base offset 0: stamped where it is written)."""
    return build_batch(
        _COMMIT_RECORD, record_count=1, base_timestamp=timestamp_ms,
        max_timestamp=timestamp_ms, producer_id=producer_id, producer_epoch=epoch,
        base_sequence=-1, attributes=ATTR_TRANSACTIONAL | ATTR_CONTROL,
    )
