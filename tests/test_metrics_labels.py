"""/metrics label values are escaped (backslash, double quote, newline, by
prometheus_client): a client's group id cannot forge a line."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import re

import aiohttp
from kio.schema.errors import ErrorCode

from kafka_gateway.client import KafkaClient
from kafka_gateway.codec import request_schema
from kafka_gateway.server import GatewayServer
from kafka_gateway.settings import GatewayConfig

FORGER = 'x"} 1\nkafka_gateway_fake_metric{a="b'
ODD = 'back\\slash "quoted"\nnew line'
_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_VALUE = r'"(?:[^"\\\n]|\\[\\"n])*"'
# One sample line of the Prometheus text format.
_SAMPLE = re.compile(rf"{_NAME}(?:\{{{_NAME}={_VALUE}(?:,{_NAME}={_VALUE})*\}})? \S+")
_LABEL = re.compile(rf'({_NAME})=({_VALUE})')


def _unescape(quoted: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), quoted[1:-1])


def test_a_group_id_cannot_forge_a_metric_line(tmp_path):
    async def main() -> str:
        config = dataclasses.replace(GatewayConfig(), listen=("127.0.0.1", 0),
                                     data_dir=str(tmp_path / "data"), admin_listen="127.0.0.1:0")
        server = GatewayServer(config)
        await server.start()
        try:
            client = await KafkaClient.connect(*server.config.listen)
            try:
                create = request_schema(19, 7)
                await client.request(create.CreateTopicsRequest(
                    topics=(create.CreatableTopic(name="lagged", num_partitions=1,
                                                  replication_factor=1, assignments=(),
                                                  configs=()),),
                    timeout=datetime.timedelta(seconds=5), validate_only=False))
                commit = request_schema(8, 8)
                for group in (FORGER, ODD):
                    answer = await client.request(commit.OffsetCommitRequest(
                        group_id=group, generation_id_or_member_epoch=-1, member_id="",
                        group_instance_id=None, topics=(commit.OffsetCommitRequestTopic(
                            name="lagged", partitions=(commit.OffsetCommitRequestPartition(
                                partition_index=0, committed_offset=0,
                                committed_leader_epoch=-1, committed_metadata=None),)),)))
                    assert answer.topics[0].partitions[0].error_code is ErrorCode.none
            finally:
                await client.close()
            assert server._admin is not None
            async with aiohttp.ClientSession() as http, http.get(
                    f"http://{server._admin.address}/metrics") as response:
                return await response.text()
        finally:
            await server.stop()

    text = asyncio.run(main())
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    for line in samples:
        assert _SAMPLE.fullmatch(line), f"not a sample line: {line!r}"
    assert not any(line.startswith("kafka_gateway_fake_metric") for line in samples)
    groups = {
        _unescape(dict(_LABEL.findall(line))["group"])
        for line in samples if line.startswith("kafka_gateway_consumer_lag{")
    }
    assert groups == {FORGER, ODD}
