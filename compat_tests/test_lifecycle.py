"""The gateway process: clean shutdown, restart, admin HTTP, fsync policy."""

from __future__ import annotations

import asyncio
import datetime
import json
import re
import urllib.request

from confluent_kafka import Producer
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12 import request as fetch
from kio.schema.offset_commit.v8 import request as offset_commit
from kio.static.primitive import i32Timedelta

from kafka_gateway.client import KafkaClient
from testkit import prom
from testkit.gateway import GatewayProcess

TIMEOUT = 30


def produce(gateway: GatewayProcess, topic: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": gateway.bootstrap, "acks": "all"})
    delivered = []
    for i in range(count):
        producer.produce(topic, value=b"v%d" % i,
                         on_delivery=lambda err, msg: delivered.append(err))
    assert producer.flush(TIMEOUT) == 0
    assert delivered == [None] * count


def long_poll(topic: str, offset: int, wait_ms: int):
    return fetch.FetchRequest(
        cluster_id=None, replica_id=-1,
        max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=wait_ms)),
        min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
        topics=(fetch.FetchTopic(topic=topic, partitions=(fetch.FetchPartition(
            partition=0, current_leader_epoch=-1, fetch_offset=offset, last_fetched_epoch=-1,
            log_start_offset=-1, partition_max_bytes=1 << 20),)),),
        forgotten_topics_data=(), rack_id="")


def test_sigterm_answers_in_flight_requests_then_restarts_complete(tmp_path):
    """SIGTERM: a parked long-poll is answered, the exit is clean, nothing is lost."""
    with GatewayProcess(tmp_path / "data") as gateway:
        produce(gateway, "lifecycle", 50)

        async def parked_fetch_during_shutdown():
            client = await KafkaClient.connect(*gateway.host_port)
            try:
                pending = asyncio.ensure_future(client.request(long_poll("lifecycle", 50, 60_000)))
                await asyncio.sleep(0.5)  # the fetch is now waiting for data
                assert not pending.done()
                gateway.process.terminate()
                return await asyncio.wait_for(pending, 15)  # answered, not reset
            finally:
                await client.close()

        answer = asyncio.run(parked_fetch_during_shutdown())
        part = answer.responses[0].partitions[0]
        assert (part.error_code, part.high_watermark) == (ErrorCode.none, 50)
        assert gateway.process.wait(TIMEOUT) == 0
        assert "stopped" in gateway.output()

        gateway.start()  # same data dir and port
        assert re.search(r"loaded 1 topics", gateway.output())
        produce(gateway, "lifecycle", 1)

        async def end_offset():
            client = await KafkaClient.connect(*gateway.host_port)
            try:
                answer = await client.request(long_poll("lifecycle", 50, 0))
                return answer.responses[0].partitions[0].high_watermark
            finally:
                await client.close()

        assert asyncio.run(end_offset()) == 51


def test_admin_http_with_fsync_always(tmp_path):
    """/health, /metrics and /topics report what happened; fsync=always fsyncs each write."""
    with GatewayProcess(tmp_path / "data", "--fsync", "always",
                        "--admin-listen", "127.0.0.1:0") as gateway:
        admin = re.search(r"admin http ([\d.]+:\d+)", gateway.output()).group(1)

        def get(path: str) -> tuple[int, str]:
            with urllib.request.urlopen(f"http://{admin}{path}", timeout=TIMEOUT) as response:
                return response.status, response.read().decode()

        produce(gateway, "watched", 20)
        assert get("/health") == (200, json.dumps({"status": "ok"}))

        _, metrics = get("/metrics")
        values = prom.samples(metrics)
        assert prom.value(values, "kafka_gateway_requests_total", api="produce") >= 1
        assert prom.value(values, "kafka_gateway_high_watermark", topic="watched",
                          partition="0") == 20
        fsyncs = prom.value(values, "kafka_gateway_store_fsyncs_total")
        writes = prom.value(values, "kafka_gateway_store_writes_total")
        assert fsyncs == writes > 0  # every group commit was fsynced
        assert prom.value(values, "kafka_gateway_request_seconds_bucket", api="metadata",
                          le="+Inf") >= 1
        assert prom.value(values, "kafka_gateway_group_rebalances_total") == 0

        async def commit(offset: int) -> None:
            client = await KafkaClient.connect(*gateway.host_port)
            try:
                await client.request(offset_commit.OffsetCommitRequest(
                    group_id="watchers", generation_id_or_member_epoch=-1, member_id="",
                    group_instance_id=None, topics=(offset_commit.OffsetCommitRequestTopic(
                        name="watched", partitions=(offset_commit.OffsetCommitRequestPartition(
                            partition_index=0, committed_offset=offset,
                            committed_leader_epoch=-1, committed_metadata=None),)),)))
            finally:
                await client.close()

        asyncio.run(commit(15))
        _, metrics = get("/metrics")
        assert prom.value(prom.samples(metrics), "kafka_gateway_consumer_lag", group="watchers",
                          topic="watched", partition="0") == 5

        _, topics = get("/topics")
        [partition] = json.loads(topics)["watched"]["partitions"]
        assert partition["high_watermark"] == 20 and partition["log_start_offset"] == 0
