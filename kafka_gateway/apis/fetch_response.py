"""The Fetch response, encoded by hand: the one hot path kio is not used for.

Measured: encoding through kio meant joining each partition's batches into
one bytes object (a copy of every byte served) and building several
dataclasses per partition; that was the largest share of the gateway's CPU
while serving consumers. Here the batches go out as they are stored, as
separate chunks for ``transport.writelines`` (or, for batches the engine hands
out as ``FileRegion``s of its files, for ``os.sendfile``: connection/regions.py),
and the fields around them are
packed with a few ``struct`` calls. Field layout per version follows Kafka's
FetchResponse.json (v4-13); a test compares the bytes with kio's encoding.
"""

from __future__ import annotations

import struct
from uuid import UUID

from tablets.seam import FileRegion

from ..codec import EncodedBody, encode_uvarint

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
# partition index, error code, high watermark, last stable offset
_PARTITION = struct.Struct(">ihqq")
_I64 = struct.Struct(">q")
_UNRESOLVED = frozenset({3, 100})  # UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_TOPIC_ID


def _array_length(count: int, flexible: bool) -> bytes:
    return encode_uvarint(count + 1) if flexible else _I32.pack(count)


# One partition's result: (index, error code, high watermark, log start, batches);
# a batch (or a run of them) is bytes or a region of one of the log's files.
PartitionResult = tuple[int, int, int, int, list[bytes | FileRegion]]


def encode(version: int, topics: dict[str | UUID, list[PartitionResult]],
           read_committed: bool = True) -> EncodedBody:
    flexible = version >= 12
    # No transaction is ever aborted here. Kafka's list is empty for
    # READ_COMMITTED and null for READ_UNCOMMITTED, except for partitions it
    # could not resolve (unknown topic or partition): empty there too.
    empty = _array_length(0, flexible)
    aborted = empty if read_committed else _array_length(-1, flexible)
    chunks: list[bytes | FileRegion] = []
    head = bytearray(_I32.pack(0))  # throttle time
    if version >= 7:
        head += _I16.pack(0) + _I32.pack(0)  # error code, session id (no sessions)
    head += _array_length(len(topics), flexible)
    for key, partitions in topics.items():
        if version >= 13:
            assert isinstance(key, UUID)
            head += key.bytes
        else:
            name = str(key).encode()
            length = encode_uvarint(len(name) + 1) if flexible else _I16.pack(len(name))
            head += length + name
        head += _array_length(len(partitions), flexible)
        for index, error, high_watermark, log_start, batches in partitions:
            # The last stable offset is the high watermark: only committed data is stored.
            head += _PARTITION.pack(index, error, high_watermark, high_watermark)
            if version >= 5:
                head += _I64.pack(log_start)
            head += empty if error in _UNRESOLVED else aborted
            if version >= 11:
                head += _I32.pack(-1)  # preferred read replica
            size = sum(map(len, batches))
            head += encode_uvarint(size + 1) if flexible else _I32.pack(size)
            if batches:
                chunks.append(bytes(head))
                chunks.extend(batches)
                head = bytearray()
            if flexible:
                head += b"\x00"  # partition tagged fields
        if flexible:
            head += b"\x00"  # topic tagged fields
    if flexible:
        head += b"\x00"  # response tagged fields
    chunks.append(bytes(head))
    return EncodedBody(chunks, flexible)
