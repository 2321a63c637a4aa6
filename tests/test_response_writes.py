"""How answers reach the socket (issue 19, item 4): a bounded number of
buffers whatever the answer's size, and a write the socket refuses is logged
and counted, never a silent close."""

from __future__ import annotations

import asyncio
import logging

import pytest
from kio.schema.errors import ErrorCode

from kafka_gateway.client import KafkaClient
from kafka_gateway.codec import (
    COALESCE_BYTES,
    PASS_THROUGH_BYTES,
    build,
    encode_response,
    response_schema,
)
from kafka_gateway.server import GatewayServer
from testkit import kafka_requests as kr
from testkit.inprocess import serve


def test_a_large_answer_is_a_few_large_buffers():
    # 100,000 partitions: kio writes about half a million fields.
    s = response_schema(9, 8)
    body = build(s.OffsetFetchResponse, throttle_time=kr.ms(0), groups=(build(
        s.OffsetFetchResponseGroup, group_id="g", error_code=ErrorCode.none, topics=(build(
            s.OffsetFetchResponseTopics, name="t", partitions=tuple(
                build(s.OffsetFetchResponsePartitions, partition_index=i, committed_offset=i,
                      committed_leader_epoch=-1, metadata="", error_code=ErrorCode.none)
                for i in range(100_000))),)),))
    chunks = encode_response(9, 7, body)
    size = sum(map(len, chunks))
    assert len(chunks) <= 2 * size // PASS_THROUGH_BYTES + 2, (len(chunks), size)
    assert all(len(c) <= COALESCE_BYTES + PASS_THROUGH_BYTES for c in chunks)
    frame = b"".join(chunks)
    assert int.from_bytes(frame[:4], "big") == size - 4
    assert frame[4:8] == (7).to_bytes(4, "big")


@pytest.mark.parametrize("failure", ["closes", "raises"])
def test_a_refused_write_is_logged_and_counted(tmp_path, caplog, failure):
    """uvloop's writev refusing an answer (EINVAL) closes the transport inside
    writelines(); other transports may raise. Either way: a log line and a count."""

    async def scenario(client: KafkaClient, server: GatewayServer) -> None:
        await client.request(kr.metadata([]))
        [connection] = server.connections
        transport = connection.transport
        assert transport is not None

        def refuse(chunks: list[bytes]) -> None:
            if failure == "raises":
                raise OSError(22, "Invalid argument")
            transport.abort()

        transport.writelines = refuse  # type: ignore[method-assign]
        before = server.broker.metrics.response_write_failures
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            await asyncio.wait_for(client.request(kr.metadata([])), 10)
        assert server.broker.metrics.response_write_failures == before + 1

    with caplog.at_level(logging.ERROR, logger="kafka_gateway.connection"):
        serve(tmp_path, scenario)
    assert any("writing an answer of" in r.getMessage() for r in caplog.records), caplog.text
