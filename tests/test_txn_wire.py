"""Every advertised version of every transaction API, over the wire, in-process.

One scenario per version step, each API used at ``min(its lowest version +
step, its highest)`` (InitProducerId 0-4, AddPartitionsToTxn, AddOffsetsToTxn,
EndTxn and TxnOffsetCommit 0-3, DescribeProducers, DescribeTransactions and
ListTransactions 0): an idempotent producer's duplicate and gap, a
transaction committed and one aborted, the fences answered PRODUCER_FENCED or
INVALID_PRODUCER_EPOCH by version, and the offset-range conflict's codes.
Requests are raw kio entities on one connection (kafka_gateway.client).
"""

from __future__ import annotations

import asyncio

import pytest
from kio.schema.errors import ErrorCode
from kio.static.primitive import Records

from kafka_gateway.apis import APIS
from kafka_gateway.cli.describe_transactions_answer import (
    DescribedTxn,
    decode_describe_transactions,
)
from kafka_gateway.client import KafkaClient
from kafka_gateway.server import GatewayServer
from tablets.batch import ATTR_CONTROL, ATTR_TRANSACTIONAL, parse_batches
from tablets.records import record_timestamps
from testkit.batches import make_batch
from testkit.gateway import GatewayProcess
from testkit.inprocess import serve
from testkit.kafka_requests import Versions, ms

PRODUCE, FETCH, OFFSET_FETCH, CREATE_TOPICS, INIT_PRODUCER_ID = 0, 1, 9, 19, 22
ADD_PARTITIONS, ADD_OFFSETS, END_TXN, TXN_OFFSET_COMMIT = 24, 25, 26, 28
DESCRIBE_PRODUCERS, DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS = 61, 65, 66
TXN_APIS = (INIT_PRODUCER_ID, ADD_PARTITIONS, ADD_OFFSETS, END_TXN, TXN_OFFSET_COMMIT,
            DESCRIBE_PRODUCERS, DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS)
STEPS = max(APIS[k].max_version - APIS[k].min_version for k in TXN_APIS) + 1
NEWEST = Versions(1 << 10)  # every API at its highest version


class Txn:
    """The requests of one step, at that step's versions."""

    def __init__(self, client: KafkaClient, step: int) -> None:
        self.client = client
        self.v = Versions(step, floors={PRODUCE: 3})  # kio cannot encode Produce v0-2
        self.topic = f"txn-{step}"
        self.group = f"group-{step}"
        self.tid = f"tid-{step}"

    def fenced(self, api_key: int, since: int | None) -> ErrorCode:
        """KIP-588: PRODUCER_FENCED from ``since`` on, INVALID_PRODUCER_EPOCH before."""
        if since is not None and self.v.version(api_key) >= since:
            return ErrorCode.producer_fenced
        return ErrorCode.invalid_producer_epoch

    async def init(self, tid: str | None, timeout_ms: int = 60_000, pid: int = -1,
                   epoch: int = -1):
        return await self.client.request(self.v.make(
            INIT_PRODUCER_ID, "InitProducerIdRequest", transactional_id=tid,
            transaction_timeout=ms(timeout_ms), producer_id=pid, producer_epoch=epoch))

    async def produce(self, batch: bytes, partition: int = 0,
                      tid: str | None = None) -> tuple[ErrorCode, int]:
        v = self.v
        answer = await self.client.request(v.make(
            PRODUCE, "ProduceRequest", transactional_id=tid, acks=-1, timeout=ms(5000),
            topic_data=(v.make(PRODUCE, "TopicProduceData", name=self.topic, partition_data=(
                v.make(PRODUCE, "PartitionProduceData", index=partition,
                       records=Records(batch)),)),)))
        part = answer.responses[0].partition_responses[0]
        return part.error_code, part.base_offset

    async def add_partitions(self, pid: int, epoch: int, partitions: dict[str, list[int]]
                             ) -> dict[tuple[str, int], ErrorCode]:
        v = self.v
        answer = await self.client.request(v.make(
            ADD_PARTITIONS, "AddPartitionsToTxnRequest", v3_and_below_transactional_id=self.tid,
            v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
            v3_and_below_topics=tuple(
                v.make(ADD_PARTITIONS, "AddPartitionsToTxnTopic", name=name,
                       partitions=tuple(indexes)) for name, indexes in partitions.items())))
        return {(t.name, p.partition_index): p.partition_error_code
                for t in answer.results_by_topic_v3_and_below for p in t.results_by_partition}

    async def add_offsets(self, pid: int, epoch: int) -> ErrorCode:
        answer = await self.client.request(self.v.make(
            ADD_OFFSETS, "AddOffsetsToTxnRequest", transactional_id=self.tid, producer_id=pid,
            producer_epoch=epoch, group_id=self.group))
        return answer.error_code

    async def txn_offset_commit(self, pid: int, epoch: int, offset: int, generation: int = -1,
                                member: str = "") -> ErrorCode:
        v = self.v
        answer = await self.client.request(v.make(
            TXN_OFFSET_COMMIT, "TxnOffsetCommitRequest", transactional_id=self.tid,
            group_id=self.group, producer_id=pid, producer_epoch=epoch, generation_id=generation,
            member_id=member, group_instance_id=None, topics=(
                v.make(TXN_OFFSET_COMMIT, "TxnOffsetCommitRequestTopic", name=self.topic,
                       partitions=(v.make(TXN_OFFSET_COMMIT, "TxnOffsetCommitRequestPartition",
                                          partition_index=0, committed_offset=offset,
                                          committed_leader_epoch=-1,
                                          committed_metadata="m"),)),)))
        [[code]] = [[p.error_code for p in t.partitions] for t in answer.topics]
        return code

    async def end(self, pid: int, epoch: int, commit: bool) -> ErrorCode:
        answer = await self.client.request(self.v.make(
            END_TXN, "EndTxnRequest", transactional_id=self.tid, producer_id=pid,
            producer_epoch=epoch, committed=commit))
        return answer.error_code

    async def describe(self, *tids: str) -> list[DescribedTxn]:
        # Read by hand: Kafka answers -1 for "no start time", which kio's
        # datetime reader refuses.
        frame = await self.client.request_frame(self.v.make(
            DESCRIBE_TRANSACTIONS, "DescribeTransactionsRequest", transactional_ids=tids))
        return decode_describe_transactions(frame)

    async def list(self, states: tuple[str, ...] = (), pids: tuple[int, ...] = ()):
        return await self.client.request(self.v.make(
            LIST_TRANSACTIONS, "ListTransactionsRequest", state_filters=states,
            producer_id_filters=pids))

    async def producers(self, *partitions: int):
        v = self.v
        answer = await self.client.request(v.make(
            DESCRIBE_PRODUCERS, "DescribeProducersRequest", topics=(
                v.make(DESCRIBE_PRODUCERS, "TopicRequest", name=self.topic,
                       partition_indexes=partitions),)))
        return {p.partition_index: p for p in answer.topics[0].partitions}

    # Helpers at the newest versions (their own versions are tested elsewhere).
    async def create_topic(self) -> None:
        v = NEWEST
        answer = await self.client.request(v.make(
            CREATE_TOPICS, "CreateTopicsRequest", timeout=ms(5000), validate_only=False,
            topics=(v.make(CREATE_TOPICS, "CreatableTopic", name=self.topic, num_partitions=2,
                           replication_factor=1, assignments=(), configs=()),)))
        assert answer.topics[0].error_code is ErrorCode.none

    async def fetch(self, partition: int = 0):
        v = NEWEST
        answer = await self.client.request(v.make(
            FETCH, "FetchRequest", replica_id=-1, max_wait=ms(0), min_bytes=1,
            max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
            forgotten_topics_data=(), rack_id="",
            topics=(v.make(FETCH, "FetchTopic", topic=self.topic, topic_id=self.topic_id,
                           partitions=(v.make(FETCH, "FetchPartition", partition=partition,
                                              fetch_offset=0, partition_max_bytes=1 << 20,
                                              current_leader_epoch=-1, last_fetched_epoch=-1,
                                              log_start_offset=-1),)),)))
        return answer.responses[0].partitions[0]

    async def stable_offset(self) -> tuple[ErrorCode, int]:
        v = NEWEST
        answer = await self.client.request(v.make(
            OFFSET_FETCH, "OffsetFetchRequest", require_stable=True, groups=(
                v.make(OFFSET_FETCH, "OffsetFetchRequestGroup", group_id=self.group, topics=(
                    v.make(OFFSET_FETCH, "OffsetFetchRequestTopics", name=self.topic,
                           partition_indexes=(0,)),)),)))
        part = answer.groups[0].topics[0].partitions[0]
        return part.error_code, part.committed_offset


def transactional(values: list[bytes], pid: int, epoch: int, seq: int) -> bytes:
    return make_batch(values, producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                      attributes=ATTR_TRANSACTIONAL)


async def topic_id(client: KafkaClient, topic: str):
    metadata = await client.request(NEWEST.make(
        3, "MetadataRequest", allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
        topics=(NEWEST.make(3, "MetadataRequestTopic", name=topic, topic_id=None),)))
    return metadata.topics[0].topic_id


async def scenario(client: KafkaClient, step: int) -> None:
    t = Txn(client, step)
    v = t.v
    await t.create_topic()
    t.topic_id = await topic_id(client, t.topic)

    # --- an idempotent producer: fresh id, duplicate, gap
    answer = await t.init(None)
    assert (answer.error_code, answer.producer_epoch) == (ErrorCode.none, 0)
    idem = answer.producer_id
    batch = make_batch([b"i0", b"i1", b"i2"], producer_id=idem, producer_epoch=0,
                       base_sequence=0)
    assert await t.produce(batch) == (ErrorCode.none, 0)
    assert await t.produce(batch) == (ErrorCode.none, 0)  # a retry: the original offset
    later = make_batch([b"i3"], producer_id=idem, producer_epoch=0, base_sequence=3)
    assert await t.produce(later) == (ErrorCode.none, 3)
    gap = make_batch([b"i5"], producer_id=idem, producer_epoch=0, base_sequence=5)
    assert (await t.produce(gap))[0] is ErrorCode.out_of_order_sequence_number
    unknown = make_batch([b"?"], producer_id=idem + 1000, producer_epoch=0, base_sequence=7)
    assert (await t.produce(unknown))[0] is ErrorCode.unknown_producer_id

    # --- a transactional producer
    assert (await t.init(t.tid, 900_001)).error_code is ErrorCode.invalid_transaction_timeout
    answer = await t.init(t.tid)
    assert (answer.error_code, answer.producer_epoch) == (ErrorCode.none, 0)
    pid = answer.producer_id
    assert pid != idem
    if v.version(INIT_PRODUCER_ID) >= 3:  # KIP-360: the session bumps its own epoch
        answer = await t.init(t.tid, pid=pid, epoch=0)
        assert (answer.error_code, answer.producer_id, answer.producer_epoch) == (
            ErrorCode.none, pid, 1)
    else:
        answer = await t.init(t.tid)
        assert (answer.error_code, answer.producer_epoch) == (ErrorCode.none, 1)
    epoch = 1

    assert await t.add_partitions(pid, epoch, {t.topic: [0], "no-such-topic": [0]}) == {
        (t.topic, 0): ErrorCode.operation_not_attempted,
        ("no-such-topic", 0): ErrorCode.unknown_topic_or_partition}
    assert await t.add_partitions(pid, epoch, {t.topic: [0]}) == {(t.topic, 0): ErrorCode.none}
    assert await t.produce(transactional([b"t0", b"t1"], pid, epoch, 0), 0, t.tid) == (
        ErrorCode.none, -1)
    assert await t.produce(transactional([b"t0", b"t1"], pid, epoch, 0), 0, t.tid) == (
        ErrorCode.none, -1)  # a retry: stored once
    assert (await t.produce(transactional([b"x"], pid, epoch, 0), 1, t.tid))[0] is (
        ErrorCode.invalid_txn_state)  # partition 1 was not added
    assert await t.add_offsets(pid, epoch) is ErrorCode.none
    assert await t.txn_offset_commit(pid, epoch, 6) is ErrorCode.none
    assert await t.stable_offset() == (ErrorCode.unstable_offset_commit, -1)
    if v.version(TXN_OFFSET_COMMIT) >= 3:  # KIP-447 group metadata, checked when sent
        assert await t.txn_offset_commit(pid, epoch, 6, generation=4) is (
            ErrorCode.illegal_generation)

    [state, missing] = await t.describe(t.tid, "nobody")
    assert (state.error_code, state.transactional_id, state.state, state.producer_id,
            state.producer_epoch, state.timeout_ms) == (
        ErrorCode.none, t.tid, "Ongoing", pid, epoch, 60_000)
    assert state.start_ms > 1_600_000_000_000
    assert state.topics == [(t.topic, [0])]
    assert (missing.error_code, missing.transactional_id, missing.start_ms,
            missing.producer_id) == (ErrorCode.transactional_id_not_found, "nobody", -1, -1)
    listed = await t.list(("Ongoing",))
    assert (t.tid, pid, "Ongoing") in {(s.transactional_id, s.producer_id, s.transaction_state)
                                       for s in listed.transaction_states}
    listed = await t.list(("Bogus",))
    assert (listed.unknown_state_filters, listed.transaction_states) == (("Bogus",), ())
    listed = await t.list((), (pid,))
    assert [s.transactional_id for s in listed.transaction_states] == [t.tid]

    producers = await t.producers(0, 1, 7)
    assert {p.producer_id: (p.producer_epoch, p.last_sequence, p.current_txn_start_offset)
            for p in producers[0].active_producers} == {idem: (0, 3, -1), pid: (epoch, 1, -1)}
    assert producers[1].active_producers == ()
    assert producers[7].error_code is ErrorCode.unknown_topic_or_partition

    data = await t.fetch()
    assert (data.high_watermark, data.last_stable_offset) == (4, 4)  # nothing pending shows
    assert await t.end(pid, epoch, True) is ErrorCode.none
    assert await t.end(pid, epoch, True) is ErrorCode.none  # a retry
    assert await t.end(pid, epoch, False) is ErrorCode.invalid_txn_state
    assert await t.stable_offset() == (ErrorCode.none, 6)
    [state] = await t.describe(t.tid)
    assert (state.state, state.topics) == ("CompleteCommit", [])
    assert state.start_ms > 1_600_000_000_000  # kept after completion, as Kafka does

    data = await t.fetch()
    assert (data.error_code, data.high_watermark, data.last_stable_offset) == (
        ErrorCode.none, 7, 7)
    assert not data.aborted_transactions
    raw = bytes(data.records)
    headers = parse_batches(raw)
    assert [(h.attributes & (ATTR_TRANSACTIONAL | ATTR_CONTROL), h.record_count)
            for h in headers] == [(0, 3), (0, 1), (ATTR_TRANSACTIONAL, 2),
                                  (ATTR_TRANSACTIONAL | ATTR_CONTROL, 1)]
    assert [o for h in headers for o, _ in record_timestamps(raw[h.start:h.start + h.size])
            ] == [0, 1, 2, 3, 4, 5, 6]

    # --- the offset-range conflict: offset 5 is behind the committed 6 (re-sending
    # its own 6 would claim an empty range, which passes)
    assert await t.add_partitions(pid, epoch, {t.topic: [1]}) == {(t.topic, 1): ErrorCode.none}
    assert await t.produce(transactional([b"again"], pid, epoch, 0), 1, t.tid) == (
        ErrorCode.none, -1)
    assert await t.add_offsets(pid, epoch) is ErrorCode.none
    assert await t.txn_offset_commit(pid, epoch, 5) is ErrorCode.illegal_generation
    assert await t.end(pid, epoch, True) is ErrorCode.unknown_producer_id
    assert await t.end(pid, epoch, False) is ErrorCode.none  # the client aborts and goes on
    assert (await t.fetch(1)).high_watermark == 0

    # --- an abort publishes nothing
    assert await t.add_partitions(pid, epoch, {t.topic: [0]}) == {(t.topic, 0): ErrorCode.none}
    assert await t.produce(transactional([b"never"], pid, epoch, 2), 0, t.tid) == (
        ErrorCode.none, -1)
    assert await t.end(pid, epoch, False) is ErrorCode.none
    assert (await t.fetch()).high_watermark == 7

    # --- fencing: a new session of the transactional id fences this one
    await t.init(t.tid)
    answer = await t.init(t.tid)
    assert (answer.error_code, answer.producer_id, answer.producer_epoch) == (
        ErrorCode.none, pid, epoch + 2)
    assert await t.add_partitions(pid, epoch, {t.topic: [0]}) == {
        (t.topic, 0): t.fenced(ADD_PARTITIONS, 2)}
    assert await t.add_offsets(pid, epoch) is t.fenced(ADD_OFFSETS, 2)
    assert await t.end(pid, epoch, True) is t.fenced(END_TXN, 2)
    assert await t.txn_offset_commit(pid, epoch, 9) is ErrorCode.invalid_producer_epoch
    assert (await t.produce(transactional([b"z"], pid, epoch, 3), 0, t.tid))[0] is (
        ErrorCode.invalid_producer_epoch)
    if v.version(INIT_PRODUCER_ID) >= 3:  # two bumps behind: not a retry, a zombie
        answer = await t.init(t.tid, pid=pid, epoch=epoch)
        assert answer.error_code is t.fenced(INIT_PRODUCER_ID, 4)
    assert await t.end(pid + 1000, epoch + 2, True) is ErrorCode.invalid_producer_id_mapping


@pytest.mark.timeout(120)
def test_every_version_of_every_transaction_api(tmp_path):
    async def main(client: KafkaClient, _server: GatewayServer) -> None:
        for step in range(STEPS):
            await scenario(client, step)

    serve(tmp_path, main)


@pytest.mark.timeout(120)
def test_producer_state_and_transactions_survive_kill_9(tmp_path):
    """A retried idempotent batch keeps its offset, an open transaction stays
    open (and commits), a committed one stays committed, across kill -9."""
    newest = 1 << 10

    async def before(gw: GatewayProcess) -> tuple[int, int]:
        client = await KafkaClient.connect(*gw.host_port)
        t = Txn(client, newest)
        await t.create_topic()
        idem = (await t.init(None)).producer_id
        for seq, offset in ((0, 0), (2, 2)):
            batch = make_batch([b"a", b"b"], producer_id=idem, producer_epoch=0,
                               base_sequence=seq)
            assert await t.produce(batch) == (ErrorCode.none, offset)
        pid = (await t.init(t.tid)).producer_id
        assert await t.add_partitions(pid, 0, {t.topic: [1]}) == {(t.topic, 1): ErrorCode.none}
        assert await t.produce(transactional([b"open"], pid, 0, 0), 1, t.tid) == (
            ErrorCode.none, -1)
        assert await t.add_offsets(pid, 0) is ErrorCode.none
        assert await t.txn_offset_commit(pid, 0, 5) is ErrorCode.none
        await client.close()
        return idem, pid

    async def after_kill(gw: GatewayProcess, idem: int, pid: int) -> None:
        client = await KafkaClient.connect(*gw.host_port)
        t = Txn(client, newest)
        t.topic_id = await topic_id(client, t.topic)
        for seq, offset in ((0, 0), (2, 2)):  # retries: recognised, not stored again
            batch = make_batch([b"a", b"b"], producer_id=idem, producer_epoch=0,
                               base_sequence=seq)
            assert await t.produce(batch) == (ErrorCode.none, offset)
        batch = make_batch([b"c"], producer_id=idem, producer_epoch=0, base_sequence=4)
        assert await t.produce(batch) == (ErrorCode.none, 4)
        [state] = await t.describe(t.tid)
        assert (state.state, state.topics) == ("Ongoing", [(t.topic, [1])])
        assert await t.stable_offset() == (ErrorCode.unstable_offset_commit, -1)
        assert (await t.fetch(1)).high_watermark == 0
        assert await t.end(pid, 0, True) is ErrorCode.none
        assert await t.stable_offset() == (ErrorCode.none, 5)
        data = await t.fetch(1)
        assert data.high_watermark == 2
        assert [h.record_count for h in parse_batches(bytes(data.records))] == [1, 1]
        await client.close()

    async def after_second_kill(gw: GatewayProcess, pid: int) -> None:
        client = await KafkaClient.connect(*gw.host_port)
        t = Txn(client, newest)
        [state] = await t.describe(t.tid)
        assert state.state == "CompleteCommit"
        assert await t.end(pid, 0, True) is ErrorCode.none  # a retry of the commit
        assert await t.stable_offset() == (ErrorCode.none, 5)
        await client.close()

    with GatewayProcess(tmp_path / "data") as gw:
        idem, pid = asyncio.run(before(gw))
        gw.restart(hard=True)
        asyncio.run(after_kill(gw, idem, pid))
        gw.restart(hard=True)
        asyncio.run(after_second_kill(gw, pid))
