"""The hand-written Fetch response encoder writes exactly what kio would."""

from __future__ import annotations

import uuid

import pytest
from kio.schema.errors import ErrorCode
from kio.static.primitive import Records

from kafka_gateway.apis import fetch_response
from kafka_gateway.codec import NO_THROTTLE, ChunkWriter, build, entity_writer_for, response_schema
from testkit.batches import make_batch

TOPIC_ID = uuid.UUID("12345678-1234-5678-1234-567812345678")


def kio_encoding(version, topics, read_committed=True):
    schema = response_schema(1, version)
    key_field = "topic_id" if version >= 13 else "topic"
    body = build(
        schema.FetchResponse, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
        session_id=0,
        responses=tuple(
            build(schema.FetchableTopicResponse, **{key_field: key}, partitions=tuple(
                build(schema.PartitionData, partition_index=index,
                      error_code=ErrorCode(code), high_watermark=hw, last_stable_offset=hw,
                      log_start_offset=start,
                      aborted_transactions=() if read_committed or code in (3, 100) else None,
                      preferred_read_replica=-1, records=Records(b"".join(batches)))
                for index, code, hw, start, batches in parts))
            for key, parts in topics.items()),
    )
    out = ChunkWriter()
    entity_writer_for(type(body))(out, body)
    return b"".join(out.chunks)


@pytest.mark.parametrize("read_committed", [True, False])
@pytest.mark.parametrize("version", range(4, 14))
def test_same_bytes_as_kio(version, read_committed):
    key = TOPIC_ID if version >= 13 else "orders"
    batches = [make_batch([b"a", b"b"]), make_batch([b"c"])]
    topics = {
        key: [(0, 0, 3, 0, batches), (1, 0, 0, 0, []), (2, ErrorCode.offset_out_of_range.value,
                                                       10, 5, [])],
        (uuid.uuid4() if version >= 13 else "other"): [(0, 3, -1, -1, [])],
    }
    encoded = fetch_response.encode(version, topics, read_committed)
    assert encoded.flexible == (version >= 12)
    assert b"".join(encoded.chunks) == kio_encoding(version, topics, read_committed)
    assert any(chunk is batches[0] for chunk in encoded.chunks)  # passed through, not copied
