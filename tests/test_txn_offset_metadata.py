"""TxnOffsetCommit applies ``offset.metadata.max.bytes`` as OffsetCommit does (issue 19).

Kafka's GroupMetadataManager.storeOffsets refuses a partition whose metadata is
too long with OFFSET_METADATA_TOO_LARGE and stores the others of the request;
once the transaction commits, OffsetFetch shows exactly what was stored.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from kafka_gateway.client import KafkaClient
from kafka_gateway.server import GatewayServer
from testkit import kafka_requests as kr
from testkit.inprocess import serve

LIMIT = 4096  # offset.metadata.max.bytes, Kafka's default


def test_txn_offset_commit_refuses_metadata_past_the_limit(tmp_path):
    async def scenario(client: KafkaClient, server: GatewayServer) -> None:
        assert server.config.offset_metadata_max_bytes == LIMIT
        created = await client.request(kr.create_topics([("t", 3)]))
        assert created.topics[0].error_code is ErrorCode.none
        init = await client.request(kr.init_producer_id("tid"))
        assert init.error_code is ErrorCode.none
        pid, epoch = init.producer_id, init.producer_epoch
        added = await client.request(kr.add_offsets_to_txn("tid", pid, epoch, "g"))
        assert added.error_code is ErrorCode.none
        at_limit = "é" * (LIMIT // 2)  # 4096 bytes in UTF-8: still allowed
        answer = await client.request(kr.txn_offset_commit("tid", pid, epoch, "g", "t", [
            (0, 10, "x" * (LIMIT + 1)), (1, 11, at_limit), (2, 12, "small")]))
        codes = {p.partition_index: p.error_code for p in answer.topics[0].partitions}
        assert codes == {0: ErrorCode.offset_metadata_too_large, 1: ErrorCode.none,
                         2: ErrorCode.none}
        # Every partition refused: nothing staged, and the transaction still commits.
        # (The longest string the protocol carries: a longer one does not parse,
        # and the connection closes, in Kafka and in the gateway alike.)
        answer = await client.request(kr.txn_offset_commit("tid", pid, epoch, "g", "t", [
            (0, 20, "y" * 32767)]))
        assert [p.error_code for p in answer.topics[0].partitions] == [
            ErrorCode.offset_metadata_too_large]
        ended = await client.request(kr.end_txn("tid", pid, epoch, commit=True))
        assert ended.error_code is ErrorCode.none

        fetched = await client.request(kr.offset_fetch("g", "t", [0, 1, 2]))
        stored = {p.partition_index: (p.committed_offset, p.metadata)
                  for p in fetched.groups[0].topics[0].partitions}
        assert stored == {0: (-1, ""), 1: (11, at_limit), 2: (12, "small")}

    serve(tmp_path, scenario)
