"""Record bytes in segment files (issue 21, section 2): written once, indexed
in RocksDB, read back as file regions; retention deletes whole files,
compaction writes new ones, aborted transactions' bytes are punched out;
start-up cuts what a crash left unindexed or torn; a data directory of
format 1 (batches in RocksDB) is migrated, a newer one refused.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time

import pytest

from tablets import batch as batch_header
from tablets import format as storage_format
from tablets import keys, log_entry, segment_files
from tablets.file_reaper import REAPER
from tablets.rocks_store import Ops, RocksStore
from tablets.seam import FileRegion
from testkit.batches import make_batch
from testkit.compaction import (
    as_batches,
    check_log,
    decode,
    now_ms,
    read_batches,
    run_engine,
)
from txn import TransactionCoordinator, TxnSettings

TOPIC = "t"


def values_of(n: int, size: int = 1000, tag: bytes = b"v") -> list[bytes]:
    return [tag + b"%06d" % i + b"x" * size for i in range(n)]


def log_entries(engine, tablet) -> list[tuple[bytes, bytes]]:
    floor = keys.LOG + tablet.prefix
    return list(engine.store.scan(floor, floor + b"\xff" * 8))


def files_on_disk(tablet) -> list[str]:
    return sorted(os.listdir(tablet.files.dir))


async def append_all(tablet, batches):
    return [(await tablet.append(b, now_ms())).base_offset for b in batches]


def test_batches_are_written_once_to_files_and_read_back_as_regions(tmp_path):
    """RocksDB holds small entries, the bytes are in the partition's file,
    and a read below the in-memory tail returns regions of it, whose bytes
    are the batches as produced (offsets stamped)."""
    batches = [make_batch(values_of(4, tag=b"%d" % i)) for i in range(20)]

    async def scenario(engine):
        await engine.create_topic(TOPIC, 1, {})
        tablet = engine.partition(TOPIC, 0)
        tablet.set_tail_budget(0)  # every read goes to the files
        assert await append_all(tablet, batches) == list(range(0, 80, 4))
        entries = log_entries(engine, tablet)
        assert len(entries) == 20
        assert all(log_entry.is_file(e) and len(e) < 100 for _k, e in entries)
        [file] = tablet.files.files.values()
        assert os.path.getsize(file.path) == sum(len(b) for b in batches) == file.live
        result = await tablet.read(0, 1 << 20)
        assert result.batches and all(isinstance(b, FileRegion) for b in result.batches)
        assert result.nbytes == file.live
        got = as_batches(result.batches)
        assert [batch_header.base_offset_of(b) for b in got] == list(range(0, 80, 4))
        for data, sent in zip(got, batches, strict=True):
            batch_header.parse_batches(data)  # the CRC holds
            assert data[batch_header.CRC_START:] == sent[batch_header.CRC_START:]
        check_log(tablet)

    run_engine(scenario, tmp_path)


def test_a_committed_transaction_is_references_to_its_produced_bytes(tmp_path):
    """A transactional batch is written when produced (base offset 0); its
    commit moves the small entry into the log without copying the bytes, and
    a read patches the first 16 bytes (bytes, then a region of the rest)."""

    async def scenario(engine):
        await engine.create_topic(TOPIC, 1, {})
        tablet = engine.partition(TOPIC, 0)
        tablet.set_tail_budget(0)
        txns = TransactionCoordinator(engine, TxnSettings(), now_ms)
        txns.load()
        await append_all(tablet, [make_batch([b"plain"])])
        pid, epoch = await txns.init_producer_id("tid", 60_000)
        await txns.add_partitions("tid", pid, epoch, [(TOPIC, 0)], -1)
        sink = txns.sink_for("tid", pid, epoch, TOPIC, 0, -1)
        sent = [make_batch(values_of(3, tag=b"t%d" % i), producer_id=pid, producer_epoch=epoch,
                           base_sequence=3 * i, attributes=batch_header.ATTR_TRANSACTIONAL)
                for i in range(2)]
        for data in sent:
            await tablet.append(data, now_ms(), sink)
        written = sum(f.size for f in tablet.files.files.values())
        await txns.end_txn("tid", pid, epoch, True, -1)
        assert tablet.pending == {}
        assert list(engine.store.scan(keys.TXN_BLOB, keys.prefix_end(keys.TXN_BLOB))) == []
        marker = tablet.high_watermark - 1
        # Only the COMMIT marker was written at commit time.
        assert sum(f.size for f in tablet.files.files.values()) == written + (
            log_entry.size(log_entries(engine, tablet)[-1][1]))
        result = await tablet.read(1, 1 << 20)
        assert isinstance(result.batches[0], bytes) and len(result.batches[0]) == 16
        assert isinstance(result.batches[1], FileRegion)
        got = as_batches(result.batches)
        assert [batch_header.base_offset_of(b) for b in got] == [1, 4, marker]
        for data, original in zip(got, sent, strict=False):
            assert data[batch_header.CRC_START:] == original[batch_header.CRC_START:]
            batch_header.parse_batches(data)
        check_log(tablet)

    run_engine(scenario, tmp_path)


@pytest.mark.parametrize(("batches", "records"), [(8, 64), (400, 1)])
def test_aborted_pending_bytes_are_punched_out_at_once(tmp_path, batches, records):
    """An abort deletes the pending entries and gives the bytes' blocks back
    to the file system as soon as the abort is durable, on the file reaper's
    thread (neighbouring small batches joined into one hole); nothing of it
    is in the log."""

    async def scenario(engine):
        await engine.create_topic(TOPIC, 1, {})
        tablet = engine.partition(TOPIC, 0)
        txns = TransactionCoordinator(engine, TxnSettings(), now_ms)
        txns.load()
        pid, epoch = await txns.init_producer_id("tid", 60_000)
        await txns.add_partitions("tid", pid, epoch, [(TOPIC, 0)], -1)
        sink = txns.sink_for("tid", pid, epoch, TOPIC, 0, -1)
        for i in range(batches):
            await tablet.append(make_batch(values_of(records, tag=b"a%d" % i), producer_id=pid,
                                           producer_epoch=epoch, base_sequence=records * i,
                                           attributes=batch_header.ATTR_TRANSACTIONAL),
                                now_ms(), sink)
        before = tablet.files.disk_bytes
        assert before >= batches * records * 1000
        punched = segment_files.RECLAIMED.bytes_punched
        await txns.end_txn("tid", pid, epoch, False, -1)
        assert tablet.pending == {}
        deadline = time.monotonic() + 10
        while REAPER.pending():
            assert time.monotonic() < deadline, "the reaper never punched the bytes out"
            await asyncio.sleep(0.01)
        after = tablet.files.disk_bytes
        # All but a few blocks: the ABORT marker's, and what the file system
        # keeps allocated around it (32 KiB measured on this machine).
        assert after <= before // 8, (before, after)
        assert segment_files.RECLAIMED.bytes_punched - punched >= batches * records * 1000
        # Nothing of an aborted transaction is ever in the log (no marker either).
        assert await read_batches(tablet) == [] and tablet.high_watermark == 0
        check_log(tablet)

    run_engine(scenario, tmp_path)


def test_retention_deletes_whole_files(tmp_path, monkeypatch):
    """DeleteRecords past a file's last batch deletes the file; a file still
    holding a live batch stays."""
    monkeypatch.setattr(segment_files, "FILE_MIN_BYTES", 0)
    batches = [make_batch(values_of(4, tag=b"%02d" % i)) for i in range(12)]
    size = len(batches[0])

    async def scenario(engine):
        await engine.create_topic(TOPIC, 1, {"segment.bytes": str(3 * size)})
        tablet = engine.partition(TOPIC, 0)
        await append_all(tablet, batches)
        assert len(files_on_disk(tablet)) == 4  # three batches a file
        await tablet.delete_records(4 * 6 + 1)  # inside the third file's first batch
        await asyncio.sleep(0.05)  # the unlinks follow the durable write
        assert files_on_disk(tablet) == ["0000000002.log", "0000000003.log"]
        await tablet.delete_records(4 * 8 + 3)  # the third file's last batch is still live
        await asyncio.sleep(0.05)
        assert len(files_on_disk(tablet)) == 2
        await tablet.delete_records(4 * 9)
        await asyncio.sleep(0.05)
        assert len(files_on_disk(tablet)) == 1
        assert [batch_header.base_offset_of(b) for b in await read_batches(tablet)] == [
            36, 40, 44]
        check_log(tablet)

    run_engine(scenario, tmp_path)


def test_compaction_writes_a_new_file_and_drops_the_old(tmp_path, monkeypatch):
    from testkit.compaction import EAGER, keyed_batch, newest, read_all

    monkeypatch.setattr(segment_files, "FILE_MIN_BYTES", 0)

    async def scenario(engine):
        await engine.create_topic(TOPIC, 1, dict(EAGER, **{"segment.bytes": "200"}))
        tablet = engine.partition(TOPIC, 0)
        # Each batch keeps its unique key: compaction re-encodes it without k*.
        sent = [keyed_batch([(b"k%d" % (i % 3), b"v%d" % i), (b"u%d" % i, b"w")])
                for i in range(30)]
        await append_all(tablet, sent)
        before = set(tablet.files.files)
        records = await read_all(tablet)
        stats = await engine.compact(TOPIC, 0)
        assert stats is not None and stats.bytes_reclaimed > 0
        await asyncio.sleep(0.05)
        after = set(tablet.files.files)
        assert after - before, "the cleaner wrote a new file"
        assert len(after) < len(before)
        kept = await read_all(tablet)
        assert newest(kept) == newest(records)
        check_log(tablet)

    run_engine(scenario, tmp_path)


# ------------------------------------------------------------------ crashes


def _produce_then_close(tmp_path, count: int = 10):
    batches = [make_batch(values_of(2, tag=b"%d" % i)) for i in range(count)]

    async def scenario(engine):
        # Small segments: a cut falls inside closed (virtual) segments too.
        await engine.create_topic(TOPIC, 1, {"segment.bytes": "3000"})
        tablet = engine.partition(TOPIC, 0)
        await append_all(tablet, batches)
        assert tablet.segments.closed  # the premise
        return tablet.files.dir, {no: f.path for no, f in tablet.files.files.items()}

    return batches, *run_engine(scenario, tmp_path)


def _reopen(tmp_path):
    async def scenario(engine):
        tablet = engine.partition(TOPIC, 0)
        read = await read_batches(tablet)
        check_log(tablet)
        return tablet.log_end_offset, read

    return run_engine(scenario, tmp_path)


def test_bytes_past_the_last_indexed_batch_are_cut(tmp_path, caplog):
    batches, directory, paths = _produce_then_close(tmp_path)
    [path] = paths.values()
    size = os.path.getsize(path)
    with open(path, "ab") as f:
        f.write(batches[0][:100])  # a torn append, never indexed
    with open(os.path.join(directory, "0000009999.log"), "wb") as f:
        f.write(b"never indexed")
    with caplog.at_level(logging.WARNING, "tablets.segment_files"):
        end, read = _reopen(tmp_path)
    assert end == 20 and len(read) == 10
    assert os.path.getsize(path) == size
    assert not os.path.exists(os.path.join(directory, "0000009999.log"))
    assert "cutting 100 bytes past the last indexed batch" in caplog.text
    assert "which no index entry names" in caplog.text


@pytest.mark.parametrize("damage", ["truncate", "corrupt"])
def test_an_entry_whose_bytes_are_lost_is_cut_with_everything_after(tmp_path, caplog, damage):
    batches, _directory, paths = _produce_then_close(tmp_path)
    [path] = paths.values()
    seventh = sum(len(b) for b in batches[:6])  # where the 7th batch (offset 12) starts
    if damage == "truncate":
        os.truncate(path, seventh + 30)
    else:
        with open(path, "r+b") as f:
            f.seek(seventh + 70)
            byte = f.read(1)
            f.seek(seventh + 70)
            f.write(bytes([byte[0] ^ 0xFF]))
    with caplog.at_level(logging.ERROR, "tablets.recovery"):
        end, read = _reopen(tmp_path)
    assert end == 12
    assert [batch_header.base_offset_of(b) for b in read] == list(range(0, 12, 2))
    for data in read:
        batch_header.parse_batches(data)
    assert "cut the log at offset 12 (8 records in 4 batches removed" in caplog.text, caplog.text
    assert ("missing from segment file" if damage == "truncate" else
            "fail the batch CRC") in caplog.text

    async def append_again(engine):  # the log goes on from the cut
        tablet = engine.partition(TOPIC, 0)
        assert (await tablet.append(make_batch([b"again"]), now_ms())).base_offset == 12
        return [batch_header.base_offset_of(b) for b in await read_batches(tablet)]

    assert run_engine(append_again, tmp_path)[-1] == 12


# ---------------------------------------------------------------- format 1


def _make_format_1(engine, tablet) -> None:
    """Turn a partition's format-2 layout into what today's code (format 1)
    writes: batches inline in the ``L`` keys (a committed transactional batch
    as a reference to a ``B`` blob, base offset 0), no segment files, no
    ``F`` or ``V`` key."""
    ops = Ops()
    for key, entry in log_entries(engine, tablet):
        batch = tablet.read_entry(entry)
        if log_entry.locate(entry)[3]:  # shifted: a committed transactional batch
            blob_key = keys.blob_key(tablet.prefix, 99, keys.offset_of_key(key))
            blob = batch_header.stamp(memoryview(batch), batch_header.parse_batches(batch)[0],
                                      0, 0)
            ops.put(blob_key, blob)
            ops.put(key, log_entry.reference(blob, keys.offset_of_key(key), 0, blob_key))
        else:
            ops.put(key, batch)
    for key, entry in tablet.pending.items():  # pending: the batch itself in its B key
        ops.put(key, tablet.read_entry(entry))
    floor = keys.FILE + tablet.prefix
    ops.delete_range(floor, floor + b"\xff" * 8)
    ops.delete(keys.FORMAT)
    engine.store.write_now(ops)


def test_a_format_1_data_directory_is_migrated(tmp_path, caplog):
    async def scenario(engine):
        await engine.create_topic(TOPIC, 1, {})
        tablet = engine.partition(TOPIC, 0)
        txns = TransactionCoordinator(engine, TxnSettings(), now_ms)
        txns.load()
        await append_all(tablet, [make_batch([b"a", b"b"]), make_batch([b"c"])])
        pid, epoch = await txns.init_producer_id("tid", 60_000)
        await txns.add_partitions("tid", pid, epoch, [(TOPIC, 0)], -1)
        await tablet.append(make_batch([b"t1", b"t2"], producer_id=pid, producer_epoch=epoch,
                                       base_sequence=0,
                                       attributes=batch_header.ATTR_TRANSACTIONAL),
                            now_ms(), txns.sink_for("tid", pid, epoch, TOPIC, 0, -1))
        await txns.end_txn("tid", pid, epoch, True, -1)
        # A transaction open across the migration, with one pending batch.
        pid2, epoch2 = await txns.init_producer_id("open", 60_000)
        await txns.add_partitions("open", pid2, epoch2, [(TOPIC, 0)], -1)
        await tablet.append(make_batch([b"pending"], producer_id=pid2, producer_epoch=epoch2,
                                       base_sequence=0,
                                       attributes=batch_header.ATTR_TRANSACTIONAL),
                            now_ms(), txns.sink_for("open", pid2, epoch2, TOPIC, 0, -1))
        expected = await read_batches(tablet)
        _make_format_1(engine, tablet)
        return expected, tablet.files.dir, (pid2, epoch2)

    expected, directory, (pid2, epoch2) = run_engine(scenario, tmp_path)
    shutil.rmtree(directory)
    store = RocksStore(str(tmp_path / "rocksdb"))  # the premise: format 1 only
    try:
        kinds = [e[16] for _k, e in store.scan(keys.LOG, keys.prefix_end(keys.LOG))]
        assert kinds == [2, 2, log_entry.REFERENCE_MAGIC, 2]
        pending = [v[16] for _k, v in store.scan(keys.TXN_BLOB, keys.prefix_end(keys.TXN_BLOB))]
        assert sorted(pending) == [2, 2]  # the committed batch's blob, the open one's
        assert store.get(keys.FORMAT) is None
    finally:
        store.close()
    with caplog.at_level(logging.WARNING, "tablets.format"):
        async def migrated(engine):
            tablet = engine.partition(TOPIC, 0)
            assert engine.store.get(keys.FORMAT) == b"2"
            entries = log_entries(engine, tablet)
            assert all(log_entry.is_file(e) for _k, e in entries) and len(entries) == 4
            [(_key, pending)] = engine.store.scan(keys.TXN_BLOB, keys.prefix_end(keys.TXN_BLOB))
            assert log_entry.is_file(pending)
            got = await read_batches(tablet)
            # The open transaction commits after the migration.
            txns = TransactionCoordinator(engine, TxnSettings(), now_ms, lambda: 0)
            txns.load()
            await txns.end_txn("open", pid2, epoch2, True, 1)  # a client's new connection
            committed = await read_batches(tablet, start=tablet.high_watermark - 2)
            check_log(tablet)
            return got, committed

        got, committed = run_engine(migrated, tmp_path)
    assert got == expected
    [batch, marker] = committed
    assert [r.value for r in decode(batch)] == [b"pending"]
    assert batch_header.parse_batches(marker)[0].is_control
    assert "migrated 5 batches from RocksDB into segment files" in caplog.text


def test_a_newer_format_is_refused_with_what_to_do(tmp_path):
    run_engine(lambda engine: engine.create_topic(TOPIC, 1, {}), tmp_path)
    store = RocksStore(str(tmp_path / "rocksdb"))
    ops = Ops()
    ops.put(keys.FORMAT, b"3")
    store.write_now(ops)
    store.close()
    with pytest.raises(storage_format.UnsupportedFormat,
                       match="storage format 3, written by a newer gateway"):
        run_engine(lambda engine: asyncio.sleep(0), tmp_path)


# ------------------------------------------------------------ fsync=always


def test_with_fsync_always_the_bytes_are_synced_before_their_index(tmp_path, monkeypatch):
    """gateway.fsync=always: each group's segment files are fdatasynced
    (with a new file's directory) before the RocksDB write indexing them."""
    events: list[str] = []
    fdatasync, fsync = os.fdatasync, os.fsync

    def record_fdatasync(fd: int) -> None:
        events.append("fdatasync")
        fdatasync(fd)

    def record_fsync(fd: int) -> None:
        events.append("fsync")
        fsync(fd)

    class RecordingDb:
        def __init__(self, db) -> None:
            self._db = db

        def write(self, batch, options) -> None:
            events.append("index" if options.sync else "index, not synced")
            self._db.write(batch, options)

        def __getattr__(self, name):
            return getattr(self._db, name)

    async def scenario(engine):
        await engine.create_topic(TOPIC, 1, {})
        tablet = engine.partition(TOPIC, 0)
        engine.store.db = RecordingDb(engine.store.db)
        monkeypatch.setattr(segment_files.os, "fdatasync", record_fdatasync)
        monkeypatch.setattr(segment_files.os, "fsync", record_fsync)
        await append_all(tablet, [make_batch([b"a"])])
        await append_all(tablet, [make_batch([b"b"])])
        engine.store.db = engine.store.db._db

    run_engine(scenario, tmp_path, fsync="always")
    # The first append creates the file: its directory entry is synced too.
    assert events == ["fdatasync", "fsync", "index", "fdatasync", "index"]
