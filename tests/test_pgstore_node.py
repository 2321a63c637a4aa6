"""The PostgreSQL store's node (pgstore.node, pgstore.topics) on a throwaway
PostgreSQL: topics with Kafka's checks, configs, new partitions, deletion
cascading to every row, the cluster id, a bad cleanup.policy refused, and the
claim at start-up: a second gateway on the same database fences the first.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import asyncpg
import pytest
from kio.schema.errors import ErrorCode

from kafka_gateway.errors import mapped_class
from pgstore.consumer_offsets import PgConsumerOffsets
from pgstore.engine_seam_check import node as as_node
from pgstore.node import PgNodeSettings, PgNodeStorage
from pgstore.node_records import PgNodeRecords
from tablets.errors import (
    InvalidConfig,
    InvalidPartitions,
    InvalidReplicationFactor,
    InvalidTopicName,
    NotLeader,
    StorageError,
    TopicAlreadyExists,
    UnknownPartition,
    UnknownTopic,
)
from tablets.seam import OffsetCommit
from testkit import postgres
from testkit.batches import make_batch
from testkit.postgres import PostgresServer
from txn.producer_ids import ProducerIds

pg_server = postgres.server_fixture("module")
TIMEOUT = 60


def now() -> int:
    return int(time.time() * 1000)


def batch() -> bytes:
    return make_batch([b"a", b"b"], base_timestamp=now())


def run(body: object) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(body(), TIMEOUT)  # type: ignore[operator]

    asyncio.run(bounded())


async def counts(pg: PostgresServer, schema: str) -> dict[str, int]:
    conn = await asyncpg.connect(pg.dsn)
    try:
        return {table: int(await conn.fetchval(f"SELECT count(*) FROM {schema}.{table}"))
                for table in ("topics", "partitions", "batches", "batch_data", "producers")}
    finally:
        await conn.close()


def test_topics_with_kafkas_checks_configs_partitions_and_a_cascading_delete(
        pg_server: PostgresServer) -> None:
    schema = f"node_{uuid.uuid4().hex[:10]}"

    async def body() -> None:
        node = PgNodeStorage(pg_server.dsn, PgNodeSettings(
            schema=schema, topic_defaults={"retention.ms": "3600000"}))
        await node.start()
        cluster_id = node.cluster_id
        assert len(cluster_id) == 22
        await node.create_topic("b.x", 2, {"retention.bytes": "1000"})
        await node.create_topic("a", 1, {})
        with pytest.raises(TopicAlreadyExists):
            node.check_new_topic("a", 1, 1, {})
        with pytest.raises(InvalidTopicName):
            node.check_new_topic("b_x", 1, 1, {})  # collides with b.x
        with pytest.raises(InvalidTopicName):
            node.check_new_topic("bad name", 1, 1, {})
        with pytest.raises(InvalidPartitions):
            node.check_new_topic("c", 0, 1, {})
        with pytest.raises(InvalidReplicationFactor):
            node.check_new_topic("c", 1, 3, {})
        with pytest.raises(InvalidConfig, match=r"cleanup\.policy"):
            await node.create_topic("c", 1, {"cleanup.policy": "compact,shrink"})
        with pytest.raises(InvalidConfig, match=r"cleanup\.policy"):
            await node.set_topic_configs("a", {"cleanup.policy": "shrink"})
        with pytest.raises(InvalidConfig):
            node.check_new_topic("c", 1, 1, {"retention.ms": "soon"})
        assert [t.name for t in node.list_topics()] == ["a", "b.x"]
        topic = node.topic("b.x")
        assert topic.configs == {"retention.bytes": "1000"}
        effective = node.topic_configs(topic)
        assert (effective["retention.bytes"], effective["retention.ms"]) == ("1000", "3600000")
        assert node.topic_by_id(topic.topic_id) is topic
        await node.create_partitions("b.x", 4)
        with pytest.raises(InvalidPartitions):
            node.check_new_partitions("b.x", 4)
        assert [p.partition for p in topic.partitions] == [0, 1, 2, 3]
        assert node.has_partition("b.x", 3) and not node.has_partition("b.x", 4)
        with pytest.raises(UnknownPartition):
            node.partition("b.x", 4)
        for p in topic.partitions:
            await p.append(batch(), now())
        await node.partition("a", 0).append(
            make_batch([b"x"], base_timestamp=now(), producer_id=3, producer_epoch=0,
                       base_sequence=0), now())
        with pytest.raises(StorageError):  # not connected (pgoffsets' store)
            node.consumer_offsets  # noqa: B018
        assert node.write_stats().changes >= 8 and node.store_failure() is None
        await node.close()

        # Everything as stored, after a restart; the cluster id stays.
        node = PgNodeStorage(pg_server.dsn, PgNodeSettings(schema=schema))
        await node.start()
        assert node.cluster_id == cluster_id
        assert node.topic("b.x").configs == {"retention.bytes": "1000"}
        assert [p.log_end_offset for p in node.topic("b.x").partitions] == [2, 2, 2, 2]
        assert await counts(pg_server, schema) == {
            "topics": 2, "partitions": 5, "batches": 5, "batch_data": 5, "producers": 1}
        deleted = node.partition("a", 0)
        await node.delete_topic("a")
        with pytest.raises(UnknownTopic):
            node.topic("a")
        with pytest.raises(UnknownPartition):
            deleted.append(batch(), now())
        assert await counts(pg_server, schema) == {
            "topics": 1, "partitions": 4, "batches": 4, "batch_data": 4, "producers": 0}
        await node.create_topic("a", 1, {})  # again, empty
        assert node.partition("a", 0).log_end_offset == 0
        await node.close()

    run(body)


def test_a_second_gateway_on_the_same_database_fences_the_first(
        pg_server: PostgresServer) -> None:
    schema = f"node_{uuid.uuid4().hex[:10]}"

    async def body() -> None:
        first = PgNodeStorage(pg_server.dsn, PgNodeSettings(schema=schema))
        await first.start()
        as_node(first)
        await first.create_topic("t", 2, {})
        old = first.partition("t", 0)
        assert (await old.append(batch(), now())).base_offset == 0
        await first.partition("t", 1).append(batch(), now())
        epoch = old.leader_epoch

        second = PgNodeStorage(pg_server.dsn, PgNodeSettings(schema=schema))
        await second.start()  # claims every partition
        new = second.partition("t", 0)
        assert new.leader_epoch == epoch + 1 and new.log_end_offset == 2

        # The first gateway still thinks it leads: its appends are refused by
        # the fence inside PostgreSQL, answered NOT_LEADER_OR_FOLLOWER.
        refused = await asyncio.gather(old.append(batch(), now()), old.append(batch(), now()),
                                       return_exceptions=True)
        assert [type(e) for e in refused] == [NotLeader, NotLeader], refused
        assert old.fenced
        with pytest.raises(NotLeader):
            old.append(batch(), now())  # at once, from now on
        with pytest.raises(NotLeader):
            await first.partition("t", 1).delete_records(-1)  # its other partition too
        assert await counts(pg_server, schema) == {
            "topics": 1, "partitions": 2, "batches": 2, "batch_data": 2, "producers": 0}
        assert second.partition("t", 1).log_start_offset == 0
        answer = mapped_class(NotLeader("moved")).code
        assert answer is ErrorCode.not_leader_or_follower and answer.retriable
        # The second goes on from where the log is.
        assert (await new.append(batch(), now())).base_offset == 2
        await first.close()
        await second.close()

    run(body)


def test_the_coordinators_storage_keeps_producer_ids_and_transaction_states(
        pg_server: PostgresServer) -> None:
    schema = f"node_{uuid.uuid4().hex[:10]}"

    async def body() -> None:
        node = PgNodeStorage(pg_server.dsn, PgNodeSettings(schema=schema))
        await node.start()
        await node.create_topic("t", 1, {})
        storage = node.transaction_storage()
        assert list(storage.txn_states()) == []
        ids = ProducerIds(storage)  # the coordinator's allocator
        for expected in (0, 1):
            change = storage.begin()
            assert ids.allocate(change) == expected
            await storage.commit(change)
        change = storage.begin()
        storage.put_txn_state(change, "tx", b"state")
        await storage.commit(change)
        await node.close()

        node = PgNodeStorage(pg_server.dsn, PgNodeSettings(schema=schema))
        await node.start()  # the counter is persisted: no id is handed out twice
        storage = node.transaction_storage()
        assert dict(storage.txn_states()) == {"tx": b"state"}  # loaded at start-up
        change = storage.begin()
        assert ProducerIds(storage).allocate(change) == 2
        await node.close()

    run(body)


def test_consumer_offsets_and_important_groups_on_the_node(pg_server: PostgresServer) -> None:
    schema = f"node_{uuid.uuid4().hex[:10]}"

    def started() -> PgNodeStorage:
        return PgNodeStorage(pg_server.dsn, PgNodeSettings(schema=schema),
                             offsets=PgConsumerOffsets, records=PgNodeRecords)

    async def body() -> None:
        node = started()
        await node.start()
        await node.create_topic("t", 1, {"retention.ms": "1000",
                                          "gateway.important.consumer.groups": "keep"})
        log = node.partition("t", 0)
        old = now() - 60_000
        for _ in range(4):
            await log.append(make_batch([b"a", b"b"], base_timestamp=old), now())
        offsets = node.consumer_offsets
        assert offsets.is_important("keep", "t") and not offsets.is_important("other", "t")
        await offsets.commit("keep", {("t", 0): OffsetCommit(4)}, now())
        # librdkafka sends metadata with its C terminator: PostgreSQL's text
        # holds no NUL, so it is stored escaped, and read back as sent.
        tricky = "manual\x00 and \\0 and \\"
        await offsets.commit("other", {("t", 0): OffsetCommit(1, metadata=tricky)}, now())
        await node.node_records("acl").change({b"name": b"value"})
        # Retention is due for every batch; the group holds it at offset 4.
        await node.enforce_retention()
        assert log.log_start_offset == 4
        [report] = node.important_groups("t")
        assert (report.group, report.committed, report.lag) == ("keep", 4, 4)
        assert report.held_bytes == log.size_bytes > 0
        await node.close()

        node = started()  # the offsets, the records and the log as stored
        await node.start()
        assert node.consumer_offsets.committed("keep", "t", 0).offset == 4  # type: ignore[union-attr]
        assert node.node_records("acl").get(b"name") == b"value"
        assert node.consumer_offsets.committed("other", "t", 0).metadata == tricky  # type: ignore[union-attr]
        await node.consumer_offsets.commit("keep", {("t", 0): OffsetCommit(8)}, now())
        await node.enforce_retention()
        assert node.partition("t", 0).log_start_offset == 8
        await node.delete_topic("t")  # its committed offsets go with it
        assert node.consumer_offsets.committed("keep", "t", 0) is None
        assert node.important_groups() == []
        await node.close()

    run(body)


class _PausedAfterRead:
    """A connection whose reread of the catalog stops after its first query
    until ``go`` is set: a config change can then land in between."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.read = asyncio.Event()
        self.go = asyncio.Event()

    def transaction(self, **kw: object) -> object:
        return self.conn.transaction(**kw)  # type: ignore[arg-type]

    async def fetch(self, sql: str, *args: object) -> list[asyncpg.Record]:
        rows = await self.conn.fetch(sql, *args)
        if not self.read.is_set():
            self.read.set()
            await self.go.wait()
        return rows


def test_a_catalog_reread_that_began_before_a_config_change_does_not_undo_it(
        pg_server: PostgresServer) -> None:
    """The reread (``PgTopicCatalog.refresh``, run on every topic notice) read
    the old configs, the change committed and was applied here, then the
    reread applied what it had read: the change was lost (seen once as
    test_aiokafka's AlterConfigs round trip on the PostgreSQL store)."""
    schema = f"node_{uuid.uuid4().hex[:10]}"

    async def body() -> None:
        node = PgNodeStorage(pg_server.dsn, PgNodeSettings(schema=schema))
        await node.start()
        try:
            await node.create_topic("t", 1, {})
            conn = await asyncpg.connect(pg_server.dsn)
            try:
                paused = _PausedAfterRead(conn)
                reread = asyncio.ensure_future(node.catalog.refresh(paused))  # type: ignore[arg-type]
                await paused.read.wait()  # it has read retention.bytes unset
                await node.set_topic_configs("t", {"retention.bytes": "1000"})
                paused.go.set()
                await reread
            finally:
                await conn.close()
            assert node.catalog.topic("t").configs == {"retention.bytes": "1000"}
            # A later reread (the change's own notice) agrees with the database.
            conn = await asyncpg.connect(pg_server.dsn)
            try:
                await node.catalog.refresh(conn)
            finally:
                await conn.close()
            assert node.catalog.topic("t").configs == {"retention.bytes": "1000"}
        finally:
            await node.close()

    run(body)
