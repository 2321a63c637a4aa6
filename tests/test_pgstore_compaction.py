"""Compacted topics on the PostgreSQL store (pgstore.compaction, pgstore.cleaner)
on a throwaway PostgreSQL, through the node as the gateway drives it:

- keys overwritten and tombstoned: a run keeps each key's newest record at
  its own offset (gaps where the others were), stamps the tombstones, and a
  run after their delete horizon drops them; index rows and bytes agree
  (one ``batch_data`` row per index row, sizes add up, CRCs hold); the clean
  offset and delete horizon are in the partition row; retention's pass
  vacuums the dead rows the runs left;
- scheduling: min.cleanable.dirty.ratio, min.compaction.lag.ms and
  max.compaction.lag.ms decide what the cleaner's pass runs; a topic
  altered to compact is compacted; records without a key are refused;
- a committed transaction's records and its COMMIT marker: the marker stays
  while a batch of its transaction does, goes (stamped, then after the
  horizon) once none is left;
- the leader-epoch fence: a compactor whose partition was claimed by another
  gateway writes nothing, also between two chunks of a run;
- a restart (a new leader) continues from the persisted state: the delete
  horizon passed makes a run due, which drops the tombstones;
- reads while the chunks are swapped in never see a torn log;
- a swap whose outcome is unknown (the connection lost during its commit)
  stops the run without marking the partition uncleanable; the partition's
  row is reread, and the next run goes on.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import asyncpg
import pytest
from test_pgstore_txn_engine import Sink

from pgstore.compaction import PgCompactedLog
from pgstore.node import PgNodeSettings, PgNodeStorage
from pgstore.partition_log import PgPartitionLog
from pgstore.writer import OutcomeUnknown
from tablets import batch as batch_header
from tablets.compaction_config import CleanerSettings
from tablets.control import commit_marker
from tablets.errors import InvalidRecord, NotLeader
from tablets.seam import PendingBlob
from testkit import postgres
from testkit.batches import GZIP, NONE, ZSTD
from testkit.compaction import EAGER, Rec, decode, keyed_batch, stamps_past_ms
from testkit.postgres import PostgresServer

pg_server = postgres.server_fixture("module")
T = TypeVar("T")
TIMEOUT = 90
OFF = CleanerSettings(enable=False)


def run(body: Callable[[], Awaitable[T]]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(body(), TIMEOUT)

    return asyncio.run(bounded())


def now() -> int:
    return int(time.time() * 1000)


async def start(pg: PostgresServer, schema: str, cleaner: CleanerSettings = OFF
                ) -> PgNodeStorage:
    node = PgNodeStorage(pg.dsn, PgNodeSettings(schema=schema, cleaner=cleaner))
    await node.start()
    return node


async def read_batches(log: PgPartitionLog, max_bytes: int = 1 << 14) -> list[bytes]:
    """Every batch from the log start to the high watermark, in reads."""
    out: list[bytes] = []
    offset = log.log_start_offset
    while offset < log.high_watermark:
        read = await log.read(offset, max_bytes)
        if not read.batches:
            break
        for data in read.batches:
            assert isinstance(data, bytes)
            if batch_header.last_offset_of(data) >= offset:
                out.append(data)
                offset = batch_header.last_offset_of(data) + 1
    return out


def records_of(batches: list[bytes]) -> list[Rec]:
    return [r for data in batches if not batch_header.parse_batches(data)[0].is_control
            for r in decode(data)]


async def read_all(log: PgPartitionLog) -> list[Rec]:
    return records_of(await read_batches(log))


def as_model(records: list[Rec]) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(r.offset, r.key, r.value) for r in records]


async def write(log: PgPartitionLog, batches: list[bytes],
                model: dict[bytes, tuple[int, bytes | None]]) -> None:
    """Append each batch, and note each key's newest (offset, value)."""
    for data in batches:
        base = (await log.append(data, now())).base_offset
        for record in decode(data):
            assert record.key is not None
            model[record.key] = (base + record.offset, record.value)


def expected(model: dict[bytes, tuple[int, bytes | None]], tombstones: bool
             ) -> list[tuple[int, bytes | None, bytes | None]]:
    return sorted((offset, key, value) for key, (offset, value) in model.items()
                  if tombstones or value is not None)


async def rows(pg: PostgresServer, schema: str, log_id: int) -> dict[str, Any]:
    """The partition's rows as PostgreSQL has them, checked for agreement:
    every index row names its own bytes, of its size, stored uncompressed
    (TOAST's pglz never tried), whose CRC holds and whose base offset is
    the row's; the partition's size is their sum."""
    conn = await asyncpg.connect(pg.dsn)
    try:
        part = await conn.fetchrow(
            f"SELECT size_bytes, clean_offset, delete_horizon, leader_epoch "
            f"FROM {schema}.partitions WHERE log_id = $1", log_id)
        index = await conn.fetch(
            f"SELECT b.base_offset, b.last_offset, b.size, b.shifted, b.max_timestamp, "
            f"b.data_id, d.data, pg_column_compression(d.data) AS compression "
            f"FROM {schema}.batches b JOIN {schema}.batch_data d "
            f"ON d.log_id = b.log_id AND d.data_id = b.data_id "
            f"WHERE b.log_id = $1 ORDER BY b.base_offset", log_id)
        blobs = int(await conn.fetchval(
            f"SELECT count(*) FROM {schema}.batch_data WHERE log_id = $1", log_id))
        all_index = int(await conn.fetchval(
            f"SELECT count(*) FROM {schema}.batches WHERE log_id = $1", log_id))
    finally:
        await conn.close()
    assert part is not None
    assert all_index == len(index) == blobs, (all_index, len(index), blobs)
    for row in index:
        assert row["compression"] is None  # STORAGE EXTERNAL: stored as written
        data = bytes(row["data"])
        assert len(data) == row["size"]
        [header] = batch_header.parse_batches(data)  # CRC-checked
        if not row["shifted"]:
            assert header.base_offset == row["base_offset"]
        assert row["base_offset"] + header.last_offset_delta == row["last_offset"]
        assert header.max_timestamp <= row["max_timestamp"] or header.is_control
    assert int(part["size_bytes"]) == sum(int(r["size"]) for r in index)
    return {"size": int(part["size_bytes"]), "clean": int(part["clean_offset"]),
            "horizon": part["delete_horizon"], "epoch": int(part["leader_epoch"]),
            "bases": [int(r["base_offset"]) for r in index],
            "data_ids": [int(r["data_id"]) for r in index]}


def rounds(keys: int, count: int) -> list[bytes]:
    codecs = [NONE, GZIP, ZSTD]
    return [keyed_batch([(f"k{k}".encode(), f"r{n}-k{k}".encode() * 20)
                         for k in range(n % 2, keys, 2 if n % 3 else 1)],
                        codec=codecs[n % len(codecs)]) for n in range(count)]


def test_the_newest_record_of_each_key_stays_and_tombstones_go_after_the_horizon(
        pg_server: PostgresServer) -> None:
    schema = f"pgc_{uuid.uuid4().hex[:10]}"

    async def body() -> None:
        node = await start(pg_server, schema)
        await node.create_topic("c", 1, EAGER)
        log = node.partition("c", 0)
        model: dict[bytes, tuple[int, bytes | None]] = {}
        await write(log, rounds(12, 9), model)
        await write(log, [keyed_batch([(b"k3", None), (b"k7", None)])], model)
        await write(log, [keyed_batch([(b"last", b"the active segment")])], model)
        before = await rows(pg_server, schema, log.log_id)
        everything = await read_all(log)

        first = await node.compact("c", 0)
        assert first is not None and first.batches_dropped > 0 and first.batches_rewritten > 0
        # The newest record of each key, at its offset; the tombstones still there.
        assert as_model(await read_all(log)) == expected(model, tombstones=True)
        after = await rows(pg_server, schema, log.log_id)
        assert after["size"] == log.size_bytes < before["size"]
        last = model[b"last"][0]
        assert after["clean"] == last  # the active segment (the last batch) stays dirty
        assert after["horizon"] is not None and after["horizon"] <= now()
        assert last in after["bases"] and after["bases"][-1] == last
        # A read from an offset compaction removed starts at the next batch.
        read = await log.read(0, 1 << 20)
        assert records_of([b for b in read.batches if isinstance(b, bytes)])[0].offset == \
            expected(model, True)[0][0]

        second = await node.compact("c", 0)  # the horizon (delete.retention.ms=0) passed
        assert second is not None
        assert as_model(await read_all(log)) == expected(model, tombstones=False)
        final = await rows(pg_server, schema, log.log_id)
        assert final["size"] == log.size_bytes < after["size"]
        assert final["clean"] == last and final["horizon"] is None
        assert len(everything) > len(await read_all(log))
        # Records without a key are refused on a compacted topic.
        with pytest.raises(InvalidRecord):
            await log.append(keyed_batch([(None, b"no key")]), now())
        # Appends go on after it, at the log end.
        compacted = as_model(await read_all(log))
        await write(log, [keyed_batch([(b"k1", b"after")])], model)
        assert as_model(await read_all(log)) == [*compacted, (model[b"k1"][0], b"k1", b"after")]
        statuses = node.compaction_statuses(now())
        assert [(s.topic, s.partition, s.clean_offset, s.status.runs) for s in statuses] == [
            ("c", 0, last, 2)]
        assert node.cleaner_stats().runs == 2
        # The rows the runs replaced are dead tuples: retention's pass counts
        # them and vacuums (they are more than a quarter of what is retained).
        replaced = node.retention.deleted_since_vacuum
        assert replaced >= before["size"] - final["size"]
        assert node.retention.vacuums == 0
        await node.enforce_retention()
        assert (node.retention.vacuums, node.retention.deleted_since_vacuum) == (1, 0)
        await node.close()

    run(body)


def test_the_cleaner_runs_what_is_due_by_dirty_ratio_and_compaction_lag(
        pg_server: PostgresServer) -> None:
    schema = f"pgc_{uuid.uuid4().hex[:10]}"

    async def body() -> None:
        node = await start(pg_server, schema)
        await node.create_topic("eager", 1, EAGER)
        await node.create_topic("young", 1, {**EAGER, "min.compaction.lag.ms": "3600000"})
        await node.create_topic("clean", 1, {**EAGER, "min.cleanable.dirty.ratio": "0.9"})
        await node.create_topic("plain", 1, {})
        await node.create_topic("altered", 1, {})
        await node.create_topic("overdue", 1, {**EAGER, "min.cleanable.dirty.ratio": "0.9",
                                               "max.compaction.lag.ms": "1"})
        models: dict[str, dict[bytes, tuple[int, bytes | None]]] = {}
        for name in ("eager", "young", "clean", "plain", "altered", "overdue"):
            models[name] = {}
            await write(node.partition(name, 0), rounds(6, 4), models[name])
        untouched = {name: await read_all(node.partition(name, 0))
                     for name in ("young", "plain")}
        cleaner = node.cleaner
        # Never compacted: every topic's dirty ratio is 1, but nothing of
        # "young" is older than its min.compaction.lag.ms of an hour.
        assert await cleaner.pass_once(node.catalog.logs()) == 3  # "eager", "clean", "overdue"
        # A topic altered to compact is compacted from then on.
        await node.set_topic_configs("altered", EAGER)
        assert await cleaner.pass_once(node.catalog.logs()) == 1
        assert {r.key: r.value for r in await read_all(node.partition("altered", 0))} == {
            k: v for k, (_o, v) in models["altered"].items()}
        assert len(await read_all(node.partition("altered", 0))) < sum(
            len(decode(b)) for b in rounds(6, 4))
        young = cleaner.compacted(node.partition("young", 0)).status
        assert young.cleanable_bytes == 0 and young.dirty_ratio == 0
        for name in ("eager", "clean"):
            kept = await read_all(node.partition(name, 0))
            assert len(kept) < sum(len(decode(b)) for b in rounds(6, 4))
            # Each key's newest stays (the last batch, the active segment, whole).
            assert {r.key: r.value for r in kept} == {
                k: v for k, (_o, v) in models[name].items()}
        # A little more dirt: past eager's ratio of 0.01, not past clean's
        # (or overdue's) 0.9; but overdue's is older than its
        # max.compaction.lag.ms of 1 ms.
        for name in ("eager", "clean", "overdue"):
            await write(node.partition(name, 0), rounds(6, 2), models[name])
        # overdue's dirty batches were stamped up to tens of ms ahead of the
        # clock (testkit.compaction.next_stamp): wait until they are past.
        await asyncio.sleep(stamps_past_ms() / 1000)
        assert await cleaner.pass_once(node.catalog.logs()) == 2
        assert cleaner.compacted(node.partition("eager", 0)).status.runs == 2
        overdue = cleaner.compacted(node.partition("overdue", 0)).status
        assert overdue.runs == 2
        clean = cleaner.compacted(node.partition("clean", 0)).status
        assert clean.runs == 1 and 0 < clean.dirty_ratio < 0.9 and clean.cleanable_bytes > 0
        for name, records in untouched.items():
            assert await read_all(node.partition(name, 0)) == records
        assert [s.topic for s in node.compaction_statuses(now())] == [
            "eager", "young", "clean", "altered", "overdue"]
        # Nothing new: nothing due.
        assert await cleaner.pass_once(node.catalog.logs()) == 0
        # A check replays only the index rows appended since the last one:
        # the same answer as segments rebuilt from scratch.
        log = node.partition("clean", 0)
        for _ in range(2):
            await write(log, rounds(6, 1), models["clean"])
            cached = await cleaner.compacted(log).cleanable(now())
            rebuilt = await PgCompactedLog(log, cleaner.sql).cleanable(now())
            assert cached == rebuilt and cached is not None and cached.cleanable_bytes > 0
        await node.close()

    run(body)


def test_a_transactions_records_and_marker_go_as_the_planner_says(
        pg_server: PostgresServer) -> None:
    schema = f"pgc_{uuid.uuid4().hex[:10]}"
    producer = 9

    def txn(pairs: list[tuple[bytes | None, bytes | None]], seq: int) -> bytes:
        return keyed_batch(pairs, producer_id=producer, producer_epoch=0, base_sequence=seq,
                           attributes=batch_header.ATTR_TRANSACTIONAL)

    async def commit(node: PgNodeStorage, log: PgPartitionLog, instance: int,
                     batches: list[bytes]) -> None:
        storage = node.transaction_storage()
        sink = Sink(storage, instance)
        for data in batches:
            assert (await log.append(data, now(), sink)).base_offset == -1
        change = storage.begin()
        publish = storage.stage_commit(
            change, log, [PendingBlob(b.key, b.header, None) for b in sink.blobs],
            commit_marker(producer, 0, now()))
        await storage.commit(change)
        publish()

    async def body() -> None:
        node = await start(pg_server, schema)
        await node.create_topic("t", 1, EAGER)
        log = node.partition("t", 0)
        model: dict[bytes, tuple[int, bytes | None]] = {}
        await write(log, [keyed_batch([(b"a", b"plain-a"), (b"b", b"plain-b")])], model)
        # Transaction 1: both keys, then overwritten by plain records.
        await commit(node, log, 1, [txn([(b"a", b"t1-a"), (b"b", b"t1-b")], 0)])
        await write(log, [keyed_batch([(b"a", b"plain-a2"), (b"b", b"plain-b2")])], model)
        # Transaction 2: key c, newest.
        await commit(node, log, 2, [txn([(b"c", b"t2-c")], 2)])
        t2_offset = log.log_end_offset - 2  # its record, then its marker
        model[b"c"] = (t2_offset, b"t2-c")
        await write(log, [keyed_batch([(b"last", b"active")])], model)

        def shape(batches: list[bytes]) -> list[tuple[int, bool, bool]]:
            out = []
            for data in batches:
                header = batch_header.parse_batches(data)[0]
                out.append((header.base_offset, header.is_control,
                            bool(header.attributes & batch_header.ATTR_DELETE_HORIZON)))
            return out

        before = shape(await read_batches(log))
        assert before == [(0, False, False), (2, False, False), (4, True, False),
                          (5, False, False), (7, False, False), (8, True, False),
                          (9, False, False)]
        assert await node.compact("t", 0) is not None
        assert as_model(await read_all(log)) == expected(model, tombstones=False)
        # Transaction 1's batch went (its records superseded); its marker
        # stays, stamped with a delete horizon; transaction 2's batch and its
        # marker stay as they were.
        first = shape(await read_batches(log))
        assert first == [(4, True, True), (5, False, False), (7, False, False),
                         (8, True, False), (9, False, False)]
        assert await node.compact("t", 0) is not None  # past the horizon: the marker goes
        assert shape(await read_batches(log)) == first[1:]
        assert as_model(await read_all(log)) == expected(model, tombstones=False)
        await rows(pg_server, schema, log.log_id)
        await node.close()

    run(body)


def test_a_compactor_whose_partition_moved_writes_nothing(pg_server: PostgresServer) -> None:
    schema = f"pgc_{uuid.uuid4().hex[:10]}"

    async def claim(log_id: int) -> None:
        """Another gateway claims the partition (its leader epoch moves)."""
        conn = await asyncpg.connect(pg_server.dsn)
        try:
            await conn.execute(f"UPDATE {schema}.partitions SET leader_epoch = leader_epoch + 1 "
                               "WHERE log_id = $1", log_id)
        finally:
            await conn.close()

    async def body() -> None:
        node = await start(pg_server, schema,
                           CleanerSettings(enable=False, io_buffer_bytes=1))
        await node.create_topic("a", 1, EAGER)
        await node.create_topic("b", 1, EAGER)
        model: dict[bytes, tuple[int, bytes | None]] = {}
        for name in ("a", "b"):
            await write(node.partition(name, 0), rounds(8, 6), model if name == "b" else {})
        # Before the run: the fence refuses its first chunk.
        log = node.partition("a", 0)
        before = await rows(pg_server, schema, log.log_id)
        await claim(log.log_id)
        with pytest.raises(NotLeader):
            await node.compact("a", 0)
        assert log.fenced
        stale = await rows(pg_server, schema, log.log_id)
        assert {k: v for k, v in stale.items() if k != "epoch"} == {
            k: v for k, v in before.items() if k != "epoch"}
        assert await node.cleaner.pass_once([log]) == 0  # no longer led here: not compacted
        # During a run: the partition moves after its first chunk (one chunk
        # per changed batch); nothing after it lands, and the log is whole.
        log = node.partition("b", 0)
        compacted = node.cleaner.compacted(log)
        applied = []
        apply = compacted.apply

        async def then_claim(chunk: Any, plan: Any) -> bool:
            done = await apply(chunk, plan)
            applied.append(done)
            if len(applied) == 1:
                await claim(log.log_id)
            return done

        compacted.apply = then_claim  # type: ignore[method-assign]
        with pytest.raises(NotLeader):
            await node.compact("b", 0)
        assert applied == [True]  # the second chunk was refused (raised, not applied)
        moved = await rows(pg_server, schema, log.log_id)
        assert moved["clean"] == 0 and moved["horizon"] is None  # the run never finished
        # What the first chunk left keeps each key's newest record.
        newest = {r.key: (r.offset, r.value) for r in await read_all(log)}
        assert newest == model
        await node.close()

    run(body)


def test_a_restarted_gateway_continues_from_the_persisted_state(
        pg_server: PostgresServer) -> None:
    schema = f"pgc_{uuid.uuid4().hex[:10]}"
    model: dict[bytes, tuple[int, bytes | None]] = {}

    async def first() -> int:
        node = await start(pg_server, schema)
        await node.create_topic("r", 1, EAGER)
        log = node.partition("r", 0)
        await write(log, rounds(8, 6), model)
        await write(log, [keyed_batch([(b"k2", None)]), keyed_batch([(b"last", b"x")])], model)
        assert await node.compact("r", 0) is not None
        assert as_model(await read_all(log)) == expected(model, tombstones=True)
        await node.close()
        return model[b"last"][0]

    async def second(last: int) -> None:
        # The cleaner on: its first pass finds the horizon passed and runs.
        node = await start(pg_server, schema, CleanerSettings(backoff_ms=50))
        log = node.partition("r", 0)
        compacted: PgCompactedLog = node.cleaner.compacted(log)
        deadline = time.monotonic() + 30
        while node.cleaner_stats().runs < 1:
            assert time.monotonic() < deadline, "the restarted cleaner never ran"
            await asyncio.sleep(0.05)
        assert compacted.clean_end == last
        assert as_model(await read_all(log)) == expected(model, tombstones=False)
        state = await rows(pg_server, schema, log.log_id)
        assert state["clean"] == last and state["horizon"] is None
        await node.close()

    last = run(first)
    run(lambda: second(last))


def test_reads_during_the_swaps_never_see_a_torn_log(pg_server: PostgresServer) -> None:
    schema = f"pgc_{uuid.uuid4().hex[:10]}"

    async def body() -> None:
        node = await start(pg_server, schema,
                           CleanerSettings(enable=False, io_buffer_bytes=1))
        await node.create_topic("c", 1, EAGER)
        log = node.partition("c", 0)
        model: dict[bytes, tuple[int, bytes | None]] = {}
        # Every batch keeps its own key and loses the shared one: one chunk
        # per batch rewritten.
        await write(log, [keyed_batch([(f"own-{n}".encode(), b"v" * 50),
                                       (b"shared", f"s{n}".encode())]) for n in range(40)],
                    model)
        want = {key: value for key, (_o, value) in model.items()}
        log.set_tail_budget(0)  # every read goes to PostgreSQL
        reads = 0

        async def check_read() -> None:
            nonlocal reads
            read = await log.read(0, 64 << 20)  # the whole log, in one query
            batches = [b for b in read.batches if isinstance(b, bytes)]
            bases = [batch_header.base_offset_of(b) for b in batches]
            assert bases == sorted(set(bases))
            seen = {r.key: r.value for r in records_of(batches)}
            assert seen == want  # every key's newest value, whatever chunk is in
            reads += 1

        # Around each swap: a read started with it (it runs while the swap
        # is written) and one after it.
        compacted = node.cleaner.compacted(log)
        apply = compacted.apply

        async def swapped_under_reads(chunk: Any, plan: Any) -> bool:
            during = asyncio.create_task(check_read())
            await asyncio.sleep(0)  # the read's query is sent first
            done = await apply(chunk, plan)
            await during
            await check_read()
            return done

        compacted.apply = swapped_under_reads  # type: ignore[method-assign]
        chunks = node.cleaner_stats().chunks
        assert await node.compact("c", 0) is not None
        swaps = node.cleaner_stats().chunks - chunks
        assert swaps > 10 and reads == 2 * swaps, (swaps, reads)
        # The last batch is the active segment: the map ends before it, so
        # the shared key's newest record before it stays too.
        assert [r.key for r in await read_all(log)] == [
            *(f"own-{n}".encode() for n in range(39)), b"shared", b"own-39", b"shared"]
        await rows(pg_server, schema, log.log_id)
        await node.close()

    run(body)


def test_a_swap_whose_outcome_is_unknown_stops_the_run_and_the_row_is_reread(
        pg_server: PostgresServer) -> None:
    schema = f"pgc_{uuid.uuid4().hex[:10]}"

    async def body() -> None:
        node = await start(pg_server, schema)
        await node.create_topic("c", 1, EAGER)
        log = node.partition("c", 0)
        model: dict[bytes, tuple[int, bytes | None]] = {}
        await write(log, rounds(8, 6), model)
        writer = node.writer
        commit = writer.commit
        lost = []

        async def landed_but_unknown(change: Any) -> None:
            await commit(change)  # PostgreSQL committed it; the client never heard
            lost.append(change)
            raise OutcomeUnknown("the connection broke while the commit was under way")

        writer.commit = landed_but_unknown  # type: ignore[method-assign]
        try:
            assert await node.compact("c", 0) is None  # the run stopped
        finally:
            writer.commit = commit  # type: ignore[method-assign]
        assert len(lost) == 1
        compacted = node.cleaner.compacted(log)
        assert compacted.status.failure is None  # not marked uncleanable
        deadline = time.monotonic() + 30
        while log.appends.in_doubt:  # the partition's row is reread
            assert time.monotonic() < deadline, "the row was never reread"
            await asyncio.sleep(0.01)
        state = await rows(pg_server, schema, log.log_id)
        assert log.size_bytes == state["size"]  # the size the swap that landed left
        # The next run goes on, from the persisted state.
        assert await node.compact("c", 0) is not None
        records = await read_all(log)
        assert {r.key: (r.offset, r.value) for r in records} == model
        assert len(records) < sum(len(decode(b)) for b in rounds(8, 6))
        state = await rows(pg_server, schema, log.log_id)
        assert log.size_bytes == state["size"]
        # The last batch (the active segment) is where the clean section ends.
        assert state["clean"] == log.high_watermark - len(decode(rounds(8, 6)[-1]))
        await node.close()

    run(body)
