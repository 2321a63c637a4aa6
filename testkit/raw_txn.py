"""Transactional requests on one raw connection, answered with their error codes.

    raw = RawTxn(await KafkaClient.connect(host, port), "my-txn-id")
    await raw.init_producer_id(); await raw.add_partitions("t", 0)
    await raw.produce("t", 0, batch); await raw.end_txn(commit=True)

For tests that send what a client library would not (another id's producer
in a Produce, an EndTxn on a chosen connection), against the gateway or
Kafka alike. On a cluster (``KAFKA_GATEWAY_TEST_STORE=postgresql-cluster``)
``RawTxn.routed`` sends where a client would: the transactional requests to
the id's coordinator, Produce to the partition's leader.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from typing import Protocol

from kio.schema.add_offsets_to_txn.v3 import request as add_offsets
from kio.schema.add_partitions_to_txn.v3 import request as add_partitions
from kio.schema.end_txn.v3 import request as end_txn
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v4 import request as init_producer_id
from kio.schema.produce.v9 import request as produce
from kio.schema.txn_offset_commit.v3 import request as txn_offset_commit
from kio.static.primitive import Records, i32Timedelta

from kafka_gateway.client import KafkaClient
from testkit.routing import TRANSACTION, coordinator_client, leader_client

REROUTE_S = 30.0


class Server(Protocol):
    @property
    def host_port(self) -> tuple[str, int]: ...


class RawTxn:
    """One connection's transactional requests, answered with their error codes.

    The transactional id's producer id and epoch are shared by every
    ``RawTxn`` of the same producer (``adopt``), so a test can send one
    session's requests on several connections, as a client retrying on a
    new connection does.
    """

    def __init__(self, client: KafkaClient, transactional_id: str | None,
                 producing: KafkaClient | None = None) -> None:
        self.client = client
        self.transactional_id = transactional_id
        self.producing = producing  # where Produce goes, when not ``client``
        self.route: tuple[Server, str, int] | None = None  # (bootstrap, topic, partition)
        self.producer_id = -1
        self.epoch = -1

    @classmethod
    async def connect(cls, server: Server, transactional_id: str | None) -> RawTxn:
        return cls(await KafkaClient.connect(*server.host_port), transactional_id)

    @classmethod
    async def routed(cls, server: Server, transactional_id: str | None, topic: str,
                     partition: int) -> RawTxn:
        """Its requests on a connection to the id's coordinator (FindCoordinator
        through ``server``; without an id, ``server`` itself, as any broker
        answers InitProducerId then) and its Produce on one to the
        partition's leader (Metadata): on one broker, both are ``server``."""
        if transactional_id is None:
            client = await KafkaClient.connect(*server.host_port)
        else:
            client = await coordinator_client(server.host_port, transactional_id, TRANSACTION)
        try:
            producing = await leader_client(server.host_port, topic, partition)
        except BaseException:
            await client.close()
            raise
        raw = cls(client, transactional_id, producing)
        raw.route = server, topic, partition
        return raw

    def adopt(self, other: RawTxn) -> RawTxn:
        self.producer_id, self.epoch = other.producer_id, other.epoch
        return self

    async def close(self) -> None:
        await self.client.close()
        if self.producing is not None:
            await self.producing.close()

    async def init_producer_id(self, timeout_ms: int = 60_000) -> ErrorCode:
        response = await self.client.request(init_producer_id.InitProducerIdRequest(
            transactional_id=self.transactional_id,
            transaction_timeout=i32Timedelta.parse(datetime.timedelta(milliseconds=timeout_ms)),
            producer_id=-1, producer_epoch=-1))
        self.producer_id, self.epoch = response.producer_id, response.producer_epoch
        return response.error_code

    async def add_partitions(self, topic: str, *partitions: int) -> ErrorCode:
        response = await self.client.request(add_partitions.AddPartitionsToTxnRequest(
            v3_and_below_transactional_id=self.transactional_id,
            v3_and_below_producer_id=self.producer_id,
            v3_and_below_producer_epoch=self.epoch,
            v3_and_below_topics=(add_partitions.AddPartitionsToTxnTopic(
                name=topic, partitions=partitions),)))
        codes = {p.partition_error_code for t in response.results_by_topic_v3_and_below
                 for p in t.results_by_partition}
        (code,) = codes
        return code

    async def add_offsets(self, group: str) -> ErrorCode:
        response = await self.client.request(add_offsets.AddOffsetsToTxnRequest(
            transactional_id=self.transactional_id, producer_id=self.producer_id,
            producer_epoch=self.epoch, group_id=group))
        return response.error_code

    async def txn_offset_commit(self, group: str, topic: str, partition: int,
                                offset: int) -> ErrorCode:
        response = await self.client.request(txn_offset_commit.TxnOffsetCommitRequest(
            transactional_id=self.transactional_id, group_id=group,
            producer_id=self.producer_id, producer_epoch=self.epoch, generation_id=-1,
            member_id="", group_instance_id=None, topics=(
                txn_offset_commit.TxnOffsetCommitRequestTopic(name=topic, partitions=(
                    txn_offset_commit.TxnOffsetCommitRequestPartition(
                        partition_index=partition, committed_offset=offset,
                        committed_leader_epoch=-1, committed_metadata=""),)),)))
        (code,) = {p.error_code for t in response.topics for p in t.partitions}
        return code

    async def produce(self, topic: str, partition: int, batch: bytes) -> tuple[ErrorCode, int]:
        """(error, base offset) of one batch (built with this producer's id and epoch).
        A ``routed`` one follows its partition's leader as a client does: on
        NOT_LEADER_OR_FOLLOWER (nothing written; a cluster that just started
        may still be balancing its leaders) it sends the batch again to the
        leader Metadata names then, for up to ``REROUTE_S`` seconds."""
        deadline = time.monotonic() + REROUTE_S
        while True:
            answer = await self._produce(topic, partition, batch)
            if (answer[0] is not ErrorCode.not_leader_or_follower or self.route is None
                    or (topic, partition) != self.route[1:] or time.monotonic() > deadline):
                return answer
            server = self.route[0]
            await asyncio.sleep(0.1)  # Metadata may still name the old leader
            if self.producing is not None:
                await self.producing.close()
            self.producing = await leader_client(server.host_port, topic, partition)

    async def _produce(self, topic: str, partition: int,
                       batch: bytes) -> tuple[ErrorCode, int]:
        client = self.client if self.producing is None else self.producing
        response = await client.request(produce.ProduceRequest(
            transactional_id=self.transactional_id, acks=-1,
            timeout=i32Timedelta.parse(datetime.timedelta(seconds=10)),
            topic_data=(produce.TopicProduceData(name=topic, partition_data=(
                produce.PartitionProduceData(index=partition, records=Records(batch)),)),)))
        answer = response.responses[0].partition_responses[0]
        return answer.error_code, answer.base_offset

    async def end_txn(self, commit: bool) -> ErrorCode:
        response = await self.client.request(end_txn.EndTxnRequest(
            transactional_id=self.transactional_id, producer_id=self.producer_id,
            producer_epoch=self.epoch, committed=commit))
        return response.error_code
