"""Transactional Produce over the wire, through the real Produce handler, in
an in-process gateway (issue 18, items 2 and 4).

Item 2: a compressed batch whose records check is held (``HeldChecks``)
while its transaction is aborted, fenced by a new session or committed; a
Produce during the commit's wait gets NOT_ENOUGH_REPLICAS (Kafka 3.6+'s
answer to CONCURRENT_TRANSACTIONS at Produce).

Item 4: a Produce's transactional id must own the batch's producer id, as
Kafka 3.6+ verifies (KIP-890): another id's producer gets
INVALID_PRODUCER_ID_MAPPING and stores nothing; transactional batches with a
null transactional id get TRANSACTIONAL_ID_AUTHORIZATION_FAILED, with an
empty one INVALID_REQUEST, and batches of two producer ids in one request
INVALID_PRODUCER_ID_MAPPING, every partition of the request.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from kafka_gateway.client import KafkaClient
from kafka_gateway.server import GatewayServer
from tablets import batch as batch_header
from tablets import keys
from testkit import kafka_requests as rq
from testkit.batches import GZIP, decode_batches, make_batch
from testkit.inprocess import serve
from testkit.kafka_requests import create_topic
from testkit.raw_txn import RawTxn
from testkit.txn import HeldChecks
from txn.errors import ConcurrentTransactions

TOPIC = "race"
READ_COMMITTED = 1


def transactional(raw: RawTxn, seq: int, values: list[bytes], codec: int = GZIP) -> bytes:
    return make_batch(values, producer_id=raw.producer_id, producer_epoch=raw.epoch,
                      base_sequence=seq, attributes=batch_header.ATTR_TRANSACTIONAL, codec=codec)


async def connect(server: GatewayServer, tid: str | None) -> RawTxn:
    return RawTxn(await KafkaClient.connect(*server.config.listen), tid)


def blob_count(server: GatewayServer) -> int:
    """Pending transactional batches stored (a commit moves them into the log)."""
    store = server.broker.engine.store
    return sum(1 for _ in store.scan(keys.TXN_BLOB, keys.prefix_end(keys.TXN_BLOB)))


def stored_bytes(server: GatewayServer) -> int:
    """Bytes of batches the partition's segment files hold live."""
    tablet = server.broker.engine.partition(TOPIC, 0)
    return sum(f.live for f in tablet.files.files.values())


def assert_nothing_pending(server: GatewayServer) -> None:
    txns = server.broker.txns
    assert (txns.budget.used, txns.pending_bytes) == (0, 0)


async def until_held(held: HeldChecks, count: int) -> None:
    for _ in range(500):
        if len(held.held) == count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{len(held.held)} checks held, expected {count}")


async def until_committing(server: GatewayServer, raw: RawTxn) -> None:
    """Until the commit of ``raw``'s transaction waits for its in-flight batches."""
    for _ in range(500):
        try:
            server.broker.txns.sink_for(raw.transactional_id, raw.producer_id, raw.epoch,
                                        TOPIC, 0)
        except ConcurrentTransactions:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the commit never began to wait for the in-flight batch")


async def committed_values(client: KafkaClient, partition: int = 0) -> list[bytes]:
    """What a read_committed consumer reads from ``partition``."""
    answer = await client.request(rq.fetch(TOPIC, [(partition, 0, 1 << 20)],
                                           isolation_level=READ_COMMITTED))
    data = answer.responses[0].partitions[0]
    assert data.error_code is ErrorCode.none
    return [record["value"] for batch in decode_batches(bytes(data.records or b""))
            if not batch["attributes"] & batch_header.ATTR_CONTROL for record in batch["records"]]


async def produce_many(client: KafkaClient, tid: str | None,
                       batches: list[tuple[int, bytes]]) -> list[tuple[ErrorCode, int]]:
    """One Produce of several partitions' batches: (error, base offset) of each."""
    answer: Any = await client.request(rq.produce(
        [(TOPIC, partition, batch) for partition, batch in batches], transactional_id=tid))
    return [(p.error_code, p.base_offset) for t in answer.responses
            for p in t.partition_responses]


@pytest.mark.timeout(60)
def test_a_produce_racing_its_transactions_end_over_the_wire(tmp_path):
    async def scenario(client: KafkaClient, server: GatewayServer) -> None:
        await create_topic(client, TOPIC)
        held = HeldChecks.install(server.broker.engine.partition(TOPIC, 0))
        owner = RawTxn(client, "racer")
        producer = await connect(server, "racer")  # the Produce waits on its own connection
        try:
            # --- EndTxn(abort) while the batch is checked
            assert await owner.init_producer_id() is ErrorCode.none
            producer.adopt(owner)
            assert await owner.add_partitions(TOPIC, 0) is ErrorCode.none
            late = asyncio.create_task(producer.produce(TOPIC, 0, transactional(
                owner, 0, [b"aborted"])))
            await until_held(held, 1)
            assert await owner.end_txn(False) is ErrorCode.none
            held.release()
            assert await late == (ErrorCode.invalid_txn_state, -1)
            assert blob_count(server) == 0
            assert_nothing_pending(server)

            # --- a new session's InitProducerId fences it while it is checked
            assert await owner.add_partitions(TOPIC, 0) is ErrorCode.none
            late = asyncio.create_task(producer.produce(TOPIC, 0, transactional(
                owner, 0, [b"zombie"])))
            await until_held(held, 1)
            successor = await connect(server, "racer")
            try:
                assert await successor.init_producer_id() is ErrorCode.none
                assert successor.epoch == owner.epoch + 1
                held.release()
                assert await late == (ErrorCode.invalid_producer_epoch, -1)
                assert blob_count(server) == 0
                assert_nothing_pending(server)

                # --- EndTxn(commit) waits for it, and a Produce meanwhile is
                # refused with a retriable error
                producer.adopt(successor)
                assert await successor.add_partitions(TOPIC, 0) is ErrorCode.none
                batch = asyncio.create_task(producer.produce(TOPIC, 0, transactional(
                    successor, 0, [b"c0", b"c1"])))
                await until_held(held, 1)
                commit = asyncio.create_task(successor.end_txn(True))
                await until_committing(server, successor)
                probe = await connect(server, "racer")
                try:
                    probe.adopt(successor)
                    assert await probe.produce(TOPIC, 0, transactional(
                        successor, 2, [b"probe"], codec=0)) == (
                        ErrorCode.not_enough_replicas, -1)
                finally:
                    await probe.close()
                assert not commit.done() and not batch.done()
                held.release()
                assert await batch == (ErrorCode.none, -1)
                assert await commit is ErrorCode.none
            finally:
                await successor.close()
            assert await committed_values(client) == [b"c0", b"c1"]
            # The committed batch (and its marker) only: the late ones stored nothing.
            assert blob_count(server) == 0
            assert stored_bytes(server) == server.broker.engine.partition(TOPIC, 0).size_bytes
            assert_nothing_pending(server)
        finally:
            await producer.close()

    serve(tmp_path, scenario)


@pytest.mark.timeout(60)
def test_a_producer_cannot_write_into_another_transactional_ids_transaction(tmp_path):
    async def scenario(client: KafkaClient, server: GatewayServer) -> None:
        await create_topic(client, TOPIC, partitions=2)
        owner, other = RawTxn(client, "owner"), RawTxn(client, "other")
        for raw in (owner, other):
            assert await raw.init_producer_id() is ErrorCode.none
            assert await raw.add_partitions(TOPIC, 0, 1) is ErrorCode.none
        assert owner.producer_id != other.producer_id

        # Another id's producer id and epoch under the owner's transactional
        # id, and the reverse; an id that does not exist.
        for tid, batch in (("owner", transactional(other, 0, [b"intruder"], codec=0)),
                           ("other", transactional(owner, 0, [b"intruder"])),
                           ("nobody", transactional(owner, 0, [b"intruder"]))):
            intruder = RawTxn(client, tid)
            assert await intruder.produce(TOPIC, 0, batch) == (
                ErrorCode.invalid_producer_id_mapping, -1), tid
        # Transactional batches with a null transactional id, alone or with a
        # plain batch: every partition is refused (Kafka, with or without an
        # authorizer).
        nameless = RawTxn(client, None)
        assert await nameless.produce(TOPIC, 0, transactional(owner, 0, [b"x"])) == (
            ErrorCode.transactional_id_authorization_failed, -1)
        plain = make_batch([b"plain"])
        assert await produce_many(client, None, [
            (0, transactional(owner, 0, [b"x"])), (1, plain)]) == [
            (ErrorCode.transactional_id_authorization_failed, -1)] * 2
        assert await RawTxn(client, "").produce(TOPIC, 0, transactional(owner, 0, [b"x"])) == (
            ErrorCode.invalid_request, -1)
        # Two producer ids in one request: every partition (Kafka 3.6+).
        assert await produce_many(client, "owner", [
            (0, transactional(owner, 0, [b"x"])), (1, transactional(other, 0, [b"y"]))]) == [
            (ErrorCode.invalid_producer_id_mapping, -1)] * 2

        # Nothing of them is stored: no blob, no sequence, no plain record.
        assert blob_count(server) == 0
        for partition in (0, 1):
            producers = server.broker.engine.partition(TOPIC, partition).producers
            assert producers.get(owner.producer_id) is None
            assert producers.get(other.producer_id) is None
        # The owners' own batches still go in, and commit.
        assert await owner.produce(TOPIC, 0, transactional(owner, 0, [b"mine"])) == (
            ErrorCode.none, -1)
        assert await other.produce(TOPIC, 1, transactional(other, 0, [b"theirs"])) == (
            ErrorCode.none, -1)
        assert await owner.end_txn(True) is ErrorCode.none
        assert await other.end_txn(True) is ErrorCode.none
        assert await committed_values(client, 0) == [b"mine"]
        assert await committed_values(client, 1) == [b"theirs"]
        assert_nothing_pending(server)

    serve(tmp_path, scenario)
