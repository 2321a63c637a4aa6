"""Transactions on the PostgreSQL engine (pgstore.partition_log as the
``TxnPartition`` of pgstore.txn_storage), through the seam alone, as the
coordinator drives it, on a throwaway PostgreSQL:

- a transactional append is stored once as a pending row and nothing of
  it is in the log (high watermark and last stable offset unmoved), while
  ordinary appends go on around it; its transaction hears of it once it
  is durable, and each batch is settled exactly once;
- after a restart the pending batch is recovered; its commit publishes
  it and the COMMIT marker at the log end, through the in-memory tail's
  rules (the tail never answers for offsets it does not hold);
- an abort deletes the pending rows and their bytes: nothing of the
  aborted batches ever appears in the log;
- a retried transactional batch is answered without storing it again; a
  batch whose transaction ended meanwhile stores nothing and is settled;
- a transactional batch outside a transaction (and the reverse) is refused;
- a commit refused whole (its pending batches aborted meanwhile) gives its
  reserved offsets back: the log rereads its row and goes on.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg
import pytest

from pgstore.node import PgNodeSettings, PgNodeStorage
from pgstore.txn_publication import MissingPending
from pgstore.txn_storage import PgTransactionStorage
from tablets import batch as batch_header
from tablets.control import commit_marker
from tablets.errors import UnsupportedRecordKind
from tablets.seam import LEADER_EPOCH, PendingBlob, ReadResult
from testkit import postgres
from testkit.batches import decode_batches, make_batch
from testkit.postgres import PostgresServer

pg_server = postgres.server_fixture("module")
T = TypeVar("T")
TIMEOUT = 60
PRODUCER = 9


def run(body: Callable[[], Awaitable[T]]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(body(), TIMEOUT)

    return asyncio.run(bounded())


def now() -> int:
    return int(time.time() * 1000)


def txn_batch(values: list[bytes | None], seq: int) -> bytes:
    return make_batch(values, base_timestamp=now(), producer_id=PRODUCER, producer_epoch=0,
                      base_sequence=seq, attributes=batch_header.ATTR_TRANSACTIONAL)


class Ended(Exception):
    """What the transaction raises (as txn/ raises InvalidTxnState)."""


class Sink:
    """One open transaction of one partition, as ``txn.pending`` is: it counts
    what it expects and what settled, and keeps what was added."""

    def __init__(self, storage: PgTransactionStorage, instance: int) -> None:
        self.storage = storage
        self.instance = instance
        self.ordinal = 0
        self.expected = 0
        self.settles = 0
        self.blobs: list[PendingBlob] = []
        self.ended = False

    def expect(self) -> None:
        self.expected += 1

    def admit(self, nbytes: int) -> None: ...

    def settled(self) -> None:
        self.settles += 1

    def pending_records(self, partition_prefix: bytes) -> int:
        return sum(batch_header.record_count_of(b.header) for b in self.blobs)

    def next_key(self, partition_prefix: bytes) -> bytes:
        if self.ended:
            raise Ended("the transaction ended before this batch was stored")
        self.ordinal += 1
        return self.storage.pending_ref(partition_prefix, self.instance, self.ordinal)

    def added(self, key: bytes, batch: bytes) -> None:
        self.blobs.append(PendingBlob(key, batch[:batch_header.HEADER_SIZE], batch))


async def count(pg: PostgresServer, sql: str) -> int:
    conn = await asyncpg.connect(pg.dsn)
    try:
        return int(await conn.fetchval(sql))
    finally:
        await conn.close()


def raw(read: ReadResult) -> list[bytes]:
    """The batches read, as bytes (this store never answers with file regions)."""
    assert all(isinstance(b, bytes) for b in read.batches), read.batches
    return [b for b in read.batches if isinstance(b, bytes)]


def values_of(batches: list[bytes]) -> list[tuple[int, bool, list[bytes | None]]]:
    """(base offset, is a control batch, values) of each batch."""
    out = []
    for data in batches:
        header = batch_header.parse_batches(memoryview(data))[0]
        out.append((header.base_offset, header.is_control,
                    [r["value"] for b in decode_batches(data) for r in b["records"]]))
    return out


def test_pending_batches_stay_out_of_the_log_until_their_commit_publishes_them(
        pg_server: PostgresServer) -> None:
    schema = f"txe_{uuid.uuid4().hex[:10]}"

    async def first() -> None:
        node = PgNodeStorage(pg_server.dsn, PgNodeSettings(schema=schema))
        await node.start()
        await node.create_topic("t", 1, {})
        storage = node.transaction_storage()
        log = node.partition("t", 0)
        sink = Sink(storage, 7)
        results = await asyncio.gather(
            log.append(txn_batch([b"t1", b"t2"], 0), now(), sink),
            log.append(make_batch([b"plain"], base_timestamp=now()), now()),
            log.append(txn_batch([b"t3"], 2), now(), sink))
        assert [r.base_offset for r in results] == [-1, 0, -1]
        assert sink.expected == sink.settles == 2 and len(sink.blobs) == 2
        # Pending: not in the log, whatever the isolation level.
        assert log.high_watermark == log.last_stable_offset == log.log_end_offset == 1
        read = await log.read(0, 1 << 20)
        assert values_of(raw(read)) == [(0, False, [b"plain"])]
        pending = await count(pg_server, f"SELECT count(*) FROM {schema}.pending_batches")
        assert pending == 2
        # A retry of the first transactional batch: answered, not stored again.
        retry = await log.append(txn_batch([b"t1", b"t2"], 0), now(), sink)
        assert retry.base_offset == -1 and len(sink.blobs) == 2
        assert sink.expected == sink.settles == 3
        assert await count(pg_server, f"SELECT count(*) FROM {schema}.pending_batches") == 2
        with pytest.raises(UnsupportedRecordKind):  # outside a transaction
            log.append(txn_batch([b"x"], 3), now())
        with pytest.raises(UnsupportedRecordKind):  # a plain batch in one
            log.append(make_batch([b"x"], base_timestamp=now()), now(), sink)
        assert sink.expected == sink.settles == 3
        sink.ended = True  # the transaction ended (committed or aborted) meanwhile
        with pytest.raises(Ended):
            await log.append(txn_batch([b"late"], 3), now(), sink)
        assert sink.expected == sink.settles == 4 and len(sink.blobs) == 2
        assert log.log_end_offset == 1
        await log.append(make_batch([b"on"], base_timestamp=now()), now())  # the log goes on
        await node.close()

    async def second() -> None:
        node = PgNodeStorage(pg_server.dsn, PgNodeSettings(schema=schema))
        await node.start()
        storage = node.transaction_storage()
        log = node.partition("t", 0)
        recovered = storage.recover_pending(storage.log_ref(log), 7)
        assert [b.ordinal for b in recovered] == [1, 2]
        # A later plain append is in the tail; the commit goes after it.
        await log.append(make_batch([b"before"], base_timestamp=now()), now())
        change = storage.begin()
        publish = storage.stage_commit(
            change, log, [PendingBlob(b.ref, b.header, None) for b in recovered],
            commit_marker(PRODUCER, 0, now()))
        committed = storage.commit(change)  # staged and submitted at once, as txn/ does
        after = log.append(make_batch([b"after"], base_timestamp=now()), now())
        await committed
        publish()
        assert (await after).base_offset == 7  # 3 + 3 records + the marker
        assert log.high_watermark == log.last_stable_offset == log.log_end_offset == 8
        whole = values_of(raw(await log.read(0, 1 << 20)))
        assert [(o, control) for o, control, _ in whole] == [
            (0, False), (1, False), (2, False), (3, False), (5, False), (6, True), (7, False)]
        assert [v for _, control, v in whole if not control] == [
            [b"plain"], [b"on"], [b"before"], [b"t1", b"t2"], [b"t3"], [b"after"]]
        # Stamped with the epoch Fetch and Metadata answer, not the row's
        # fencing epoch (bumped by each start: a Java consumer validates its
        # position with the records' epoch).
        assert log.leader_epoch > LEADER_EPOCH
        stamped = {int.from_bytes(b[12:16], "big", signed=True)
                   for b in raw(await log.read(0, 1 << 20))}
        assert stamped == {LEADER_EPOCH}
        for start in range(8):  # below the tail (the database) and in it
            read = await log.read(start, 1 << 20)
            got = raw(read)
            assert got, start
            first = batch_header.parse_batches(memoryview(got[0]))[0]
            assert first.base_offset <= start <= first.base_offset + first.last_offset_delta
            assert values_of(got) == [w for w in whole if w[0] >= first.base_offset], start
        assert await count(pg_server, f"SELECT count(*) FROM {schema}.pending_batches") == 0
        await node.close()

    run(first)
    run(second)


def test_an_abort_leaves_nothing_of_its_batches(pg_server: PostgresServer) -> None:
    schema = f"txe_{uuid.uuid4().hex[:10]}"

    async def body() -> None:
        node = PgNodeStorage(pg_server.dsn, PgNodeSettings(schema=schema))
        await node.start()
        await node.create_topic("t", 1, {})
        storage = node.transaction_storage()
        log = node.partition("t", 0)
        sink = Sink(storage, 3)
        for seq in range(3):
            await log.append(txn_batch([b"doomed"], seq), now(), sink)
        assert len(sink.blobs) == 3
        data = f"SELECT count(*) FROM {schema}.batch_data"
        assert await count(pg_server, data) == 3
        change = storage.begin()
        storage.abort_pending(change, storage.log_ref(log), 3)
        await storage.commit(change)
        assert await count(pg_server, f"SELECT count(*) FROM {schema}.pending_batches") == 0
        assert await count(pg_server, data) == 0  # the bytes too
        assert log.high_watermark == log.last_stable_offset == 0
        await log.append(make_batch([b"kept"], base_timestamp=now()), now())
        read = await log.read(0, 1 << 20)
        assert values_of(raw(read)) == [(0, False, [b"kept"])]
        await node.close()

    run(body)


def test_a_commit_that_fails_leaves_the_log_whole(pg_server: PostgresServer) -> None:
    """A commit naming pending batches aborted meanwhile is refused whole;
    the offsets it reserved are given back by a reread of the row, so the
    next append lands right after what is stored."""
    schema = f"txe_{uuid.uuid4().hex[:10]}"

    async def body() -> None:
        node = PgNodeStorage(pg_server.dsn, PgNodeSettings(schema=schema))
        await node.start()
        await node.create_topic("t", 1, {})
        storage = node.transaction_storage()
        log = node.partition("t", 0)
        await log.append(make_batch([b"first"], base_timestamp=now()), now())
        sink = Sink(storage, 4)
        await log.append(txn_batch([b"gone"], 0), now(), sink)
        change = storage.begin()
        storage.abort_pending(change, storage.log_ref(log), 4)
        await storage.commit(change)
        change = storage.begin()
        storage.stage_commit(change, log, sink.blobs, commit_marker(PRODUCER, 0, now()))
        assert log.log_end_offset == 3  # reserved: the batch and the marker
        with pytest.raises(MissingPending):
            await storage.commit(change)
        assert log.high_watermark == 1
        result = await log.append(make_batch([b"next"], base_timestamp=now()), now())
        assert result.base_offset == 1 and log.log_end_offset == log.high_watermark == 2
        read = await log.read(0, 1 << 20)
        assert values_of(raw(read)) == [(0, False, [b"first"]), (1, False, [b"next"])]
        await node.close()

    run(body)
