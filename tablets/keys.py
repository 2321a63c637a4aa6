"""The key layout of the one RocksDB database a gateway node keeps.

Every key starts with a one-byte kind. Partition keys continue with the
topic's id (16 bytes) and the partition (4 bytes, big-endian), so one
partition's keys are contiguous and a topic's are one range (deleted with one
range tombstone). Offsets are big-endian so keys sort by offset.

=====  =========================================  ===============================
kind   rest of the key                            value
=====  =========================================  ===============================
``T``  topic name (utf-8)                         topic record (JSON)
``M``  topic id, partition                        partition meta (PartitionMeta)
``L``  topic id, partition, base offset           log entry: where a batch lies
``X``  topic id, partition, base offset           time index: running max timestamp
``S``  topic id, partition, base offset           a closed segment: size, timestamps
``F``  topic id, partition, file number           a segment file: size, live bytes
``P``  topic id, partition, producer id           idempotent producer state
``C``  group, 0x00, topic name, 0x00, partition   committed consumer offset
``B``  topic id, partition, txn instance, n        pending transactional batch:
                                                  where it lies (as ``L``)
``Y``  transactional id (utf-8)                   transaction state (txn.state)
``Q``  id length (2), transactional id, txn        topic name
       instance, topic id, partition              (a partition of an open txn)
``R``  group, 0x00 [topic, 0x00, partition]       empty: the group's offsets were
                                                  deleted (all, or one partition's):
                                                  it no longer holds retention
``N``  counter name                               counters (producer ids, ...)
``U``  user (utf-8), 0x00, SCRAM mechanism         salted SCRAM credential
``A``  an ACL binding (JSON)                       empty
``V``  (nothing)                                  the data directory's format
=====  =========================================  ===============================

``U`` and ``A`` are node-wide records (``node_records.NodeRecords``); their
bytes mean something only to the gateway's security layer.
"""

from __future__ import annotations

import struct
from uuid import UUID

TOPIC = b"T"
META = b"M"
LOG = b"L"
TIME_INDEX = b"X"
SEGMENT = b"S"
FILE = b"F"
FORMAT = b"V"
PRODUCER = b"P"
CONSUMER_OFFSET = b"C"
RELEASED = b"R"
TXN_BLOB = b"B"
TXN_STATE = b"Y"
TXN_PARTITION = b"Q"
COUNTER = b"N"
SCRAM_CREDENTIAL = b"U"
ACL = b"A"

_PARTITION = struct.Struct(">16si")
_OFFSET = struct.Struct(">q")


def topic_key(name: str) -> bytes:
    return TOPIC + name.encode()


def partition_prefix(topic_id: UUID, partition: int) -> bytes:
    """The 20 bytes naming one partition inside a key."""
    return _PARTITION.pack(topic_id.bytes, partition)


def topic_range(kind: bytes, topic_id: UUID) -> tuple[bytes, bytes]:
    """[start, end) covering every key of one kind for a whole topic."""
    start = kind + topic_id.bytes
    return start, start + b"\xff" * 13  # above any partition (4) + offset (8) suffix


def offset_key(kind: bytes, prefix: bytes, offset: int) -> bytes:
    return kind + prefix + _OFFSET.pack(offset)


def offset_of_key(key: bytes) -> int:
    offset: int = _OFFSET.unpack_from(key, 21)[0]
    return offset


_INSTANCE = struct.Struct(">q")
_ORDINAL = struct.Struct(">i")


def blob_range(partition_prefix: bytes, instance: int) -> tuple[bytes, bytes]:
    """[start, end) of one transaction's blobs in one partition (instance
    numbers are node-wide, so no two transactions share a range)."""
    start = TXN_BLOB + partition_prefix + _INSTANCE.pack(instance)
    return start, start + b"\xff" * 4


def blob_key(partition_prefix: bytes, instance: int, ordinal: int) -> bytes:
    """The ``ordinal``-th blob of a transaction in a partition, in arrival order."""
    return TXN_BLOB + partition_prefix + _INSTANCE.pack(instance) + _ORDINAL.pack(ordinal)


def blob_ordinal(key: bytes) -> int:
    ordinal: int = _ORDINAL.unpack_from(key, len(key) - 4)[0]
    return ordinal


def blob_partition(key: bytes) -> bytes:
    """The partition prefix of a blob's key (its topic id and partition)."""
    return key[len(TXN_BLOB):len(TXN_BLOB) + _PARTITION.size]


def prefix_end(prefix: bytes) -> bytes:
    """The first key after every key that starts with ``prefix``: the end of a
    scan of all of them. ``prefix + b"\xff"`` is not, when the next byte may be
    0xff (a topic id is random bytes)."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        raise ValueError("a prefix of only 0xff bytes has no end")
    return trimmed[:-1] + bytes([trimmed[-1] + 1])


def txn_state_key(transactional_id: str) -> bytes:
    return TXN_STATE + transactional_id.encode()


_ID_LENGTH = struct.Struct(">H")  # Kafka strings are at most 32,767 bytes


def txn_partitions_prefix(transactional_id: str, instance: int) -> bytes:
    """Every partition key of one transaction (``instance``) of a transactional
    id starts with these bytes (the id is length-prefixed: it may hold any byte)."""
    tid = transactional_id.encode()
    return TXN_PARTITION + _ID_LENGTH.pack(len(tid)) + tid + _INSTANCE.pack(instance)


def txn_partition_key(transactional_id: str, instance: int, topic_id: UUID,
                      partition: int) -> bytes:
    """A partition added to a transaction, with the id of the topic it was
    added as (a topic recreated under the same name has another id)."""
    return txn_partitions_prefix(transactional_id, instance) + partition_prefix(topic_id,
                                                                                partition)


def parse_txn_partition_key(key: bytes) -> tuple[UUID, int]:
    """(topic id, partition) of a ``Q`` key."""
    topic_id, partition = _PARTITION.unpack_from(key, len(key) - _PARTITION.size)
    return UUID(bytes=topic_id), partition


_CONSUMER_PARTITION = struct.Struct(">i")


def consumer_group_prefix(group: str) -> bytes:
    """Every committed offset of one group starts with these bytes.

    Group ids must not contain NUL (the separator); the coordinator rejects them.
    """
    return CONSUMER_OFFSET + group.encode() + b"\x00"


def consumer_offset_key(group: str, topic: str, partition: int) -> bytes:
    return consumer_group_prefix(group) + topic.encode() + b"\x00" + (
        _CONSUMER_PARTITION.pack(partition)
    )


def released_key(group: str, topic: str | None = None, partition: int = 0) -> bytes:
    """The marker of a group (or one partition of it) whose offsets were deleted."""
    key = RELEASED + group.encode() + b"\x00"
    if topic is None:
        return key
    return key + topic.encode() + b"\x00" + _CONSUMER_PARTITION.pack(partition)


def parse_released_key(key: bytes) -> tuple[str, str | None, int]:
    """(group, topic or None for the whole group, partition) of an ``R`` key."""
    group, rest = key[1:].split(b"\x00", 1)
    if not rest:
        return group.decode(), None, 0
    return (group.decode(), rest[:-5].decode(),
            _CONSUMER_PARTITION.unpack_from(key, len(key) - 4)[0])


def parse_consumer_offset_key(key: bytes) -> tuple[str, str, int]:
    """(group, topic, partition) of a ``C`` key (topic names never contain NUL)."""
    group, topic = key[1:-5].split(b"\x00", 1)
    return group.decode(), topic.decode(), _CONSUMER_PARTITION.unpack_from(key, len(key) - 4)[0]
