"""Reads below the in-memory tail (issue 21, section 3): served on the event
loop from the index, one region per run of batches lying end to end in one
segment file, a committed transactional batch's patched header as bytes
before the rest of it; KIP-74's first whole batch; reads racing a compaction
swap (the index walked as it was, the file deleted under it) and a retention
that deletes a file after a region of it was handed out.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import os
import socket

from tablets import batch as batch_header
from tablets import keys, log_entry, segment_files
from tablets.seam import FileRegion
from testkit.batches import make_batch
from testkit.compaction import (
    EAGER,
    as_batches,
    decode,
    keyed_batch,
    now_ms,
    produce,
    run_engine,
)
from txn import TransactionCoordinator, TxnSettings

TOPIC = "t"
BATCH_RECORDS = 4


def batch(i: int) -> bytes:
    return make_batch([b"%04d-%d" % (i, n) + b"x" * 1000 for n in range(BATCH_RECORDS)])


def region_bytes(chunks: list[bytes | FileRegion]) -> bytes:
    return b"".join(c.read() if isinstance(c, FileRegion) else c for c in chunks)


def bases(chunks: list[bytes | FileRegion]) -> list[int]:
    return [batch_header.base_offset_of(b) for b in as_batches([region_bytes(chunks)])]


def entries(engine, tablet) -> list[tuple[bytes, bytes]]:
    floor = keys.LOG + tablet.prefix
    return list(engine.store.scan(floor, floor + b"\xff" * 8))


def test_a_read_is_one_region_per_run_of_batches_in_one_file(tmp_path, monkeypatch):
    """Batches end to end in one file are one region; a new file starts a
    new region; the bytes are the batches as stored, in order."""
    monkeypatch.setattr(segment_files, "FILE_MIN_BYTES", 0)

    async def scenario(engine):
        # About 4.1 KB a batch, files roll past 10 000 bytes: 3 batches a file.
        await engine.create_topic(TOPIC, 1, {"segment.bytes": "12500"})
        tablet = engine.partition(TOPIC, 0)
        tablet.set_tail_budget(0)  # every read below the tail
        await produce(tablet, [batch(i) for i in range(12)])
        files = [log_entry.locate(e)[0] for _k, e in entries(engine, tablet)]
        assert files == [f for f in sorted(set(files)) for _ in range(3)]  # the premise

        read = await tablet.read(0, 1 << 20)
        assert all(isinstance(c, FileRegion) for c in read.batches)
        assert len(read.batches) == 4  # one per file, three batches each
        assert bases(read.batches) == [i * BATCH_RECORDS for i in range(12)]
        stored = [tablet.read_entry(e) for _k, e in entries(engine, tablet)]
        assert region_bytes(read.batches) == b"".join(stored)

        # From the middle of a file's second batch: the run starts there.
        read = await tablet.read(5, 1 << 20)
        assert bases(read.batches)[0] == 4
        assert len(read.batches) == 4 and read.batches[0].length == 2 * len(stored[0])

    run_engine(scenario, tmp_path)


def test_max_bytes_and_kip_74(tmp_path):
    """max_bytes counts whole batches; the first one is returned whole even
    when larger (min_one), and not at all without min_one."""
    async def scenario(engine):
        await engine.create_topic(TOPIC, 1, {})
        tablet = engine.partition(TOPIC, 0)
        tablet.set_tail_budget(0)
        await produce(tablet, [batch(i) for i in range(8)])
        size = len(tablet.read_entry(entries(engine, tablet)[0][1]))

        one = await tablet.read(6, 1)
        assert bases(one.batches) == [4] and one.nbytes == size
        assert (await tablet.read(6, 1, min_one=False)).batches == []
        three = await tablet.read(0, 3 * size + size - 1)
        assert bases(three.batches) == [0, 4, 8] and three.nbytes == 3 * size
        assert len(three.batches) == 1  # one file: one region
        rest = await tablet.read(28, 1 << 20)
        assert bases(rest.batches) == [28]
        assert rest.high_watermark == 32

    run_engine(scenario, tmp_path)


def test_a_committed_transactional_batch_is_its_patched_header_then_a_region(tmp_path):
    """A committed transactional batch's file copy has base offset 0: its
    first bytes come patched, as bytes, and its region is not merged with the
    batch before it (the patched bytes lie between)."""
    async def scenario(engine):
        await engine.create_topic(TOPIC, 1, {})
        tablet = engine.partition(TOPIC, 0)
        tablet.set_tail_budget(0)
        txns = TransactionCoordinator(engine, TxnSettings(), now_ms)
        txns.load()
        await produce(tablet, [batch(0)])
        pid, epoch = await txns.init_producer_id("tid", 60_000)
        await txns.add_partitions("tid", pid, epoch, [(TOPIC, 0)], -1)
        sink = txns.sink_for("tid", pid, epoch, TOPIC, 0, -1)
        for seq in (0, 1):
            data = keyed_batch([(b"k", b"v%d" % seq)], producer_id=pid, producer_epoch=epoch,
                               base_sequence=seq, attributes=batch_header.ATTR_TRANSACTIONAL)
            await tablet.append(data, now_ms(), sink)
        await txns.end_txn("tid", pid, epoch, True, -1)
        await produce(tablet, [batch(1)])

        read = await tablet.read(0, 1 << 20)
        kinds = ["bytes" if isinstance(c, bytes) else "region" for c in read.batches]
        # plain batch | header, rest | header, rest + marker + plain batch
        assert kinds == ["region", "bytes", "region", "bytes", "region"]
        assert all(len(c) == log_entry.PREFIX_SIZE for c in read.batches if isinstance(c, bytes))
        assert bases(read.batches) == [0, 4, 5, 6, 7]  # 6: the COMMIT marker
        for data in as_batches([region_bytes(read.batches)]):
            [header] = batch_header.parse_batches(data)  # CRC-checked, offsets patched
            assert header.base_offset == batch_header.base_offset_of(data)

    run_engine(scenario, tmp_path)


def test_a_read_racing_a_compaction_swap_reads_the_replaced_entries_again(tmp_path,
                                                                           monkeypatch):
    """The index iterator was opened (its snapshot taken) before a compaction
    swap rewrote the batches into a new file and deleted the old ones: the
    read still walks the old entries, finds their files gone, reads those
    entries again as they are now, and answers the compacted log once."""
    monkeypatch.setattr(segment_files, "FILE_MIN_BYTES", 0)  # a file per batch

    async def scenario(engine):
        await engine.create_topic("c", 1, {**EAGER, "segment.bytes": "100"})
        tablet = engine.partition("c", 0)
        tablet.set_tail_budget(0)
        # The first batch loses a record (rewritten to a new file), the
        # second goes whole, the last two are kept as they are.
        await produce(tablet, [keyed_batch([(b"a", b"1"), (b"b", b"1")]),
                               keyed_batch([(b"c", b"1")]), keyed_batch([(b"a", b"2")]),
                               keyed_batch([(b"c", b"2")]), keyed_batch([(b"h", b"1")])])
        floor = keys.LOG + tablet.prefix
        end = keys.offset_key(keys.LOG, tablet.prefix, tablet.high_watermark)
        before = engine.store.scan_from_containing(floor, floor, end)
        first = next(before)  # the iterator is open: it sees the index as of now
        old_files = {log_entry.locate(e)[0] for _k, e in entries(engine, tablet)}

        await engine.compact("c", 0)
        now = {log_entry.locate(e)[0] for _k, e in entries(engine, tablet)}
        gone = old_files - set(tablet.files.files)
        assert gone and not os.path.exists(tablet.files._path(min(gone)))  # the premise

        misses, rewritten = [], []
        open_file = tablet.files.open_file

        def recording(no):
            found = open_file(no)
            if found is None:
                misses.append(no)
            elif misses and no not in old_files:
                rewritten.append(no)  # a stale entry read again names the new file
            return found

        monkeypatch.setattr(tablet.files, "open_file", recording)
        monkeypatch.setattr(engine.store, "scan_from_containing",
                            lambda *_args: itertools.chain([first], before))
        raced = await tablet.read(0, 1 << 20)
        # The race happened: stale entries met, one of them read again.
        assert misses and set(misses) <= gone and rewritten
        monkeypatch.undo()
        fresh = await tablet.read(0, 1 << 20)
        assert region_bytes(raced.batches) == region_bytes(fresh.batches)
        assert bases(fresh.batches) == [0, 3, 4, 5]  # batch 2 dropped whole
        assert [r.key for data in as_batches([region_bytes(fresh.batches)])
                for r in decode(data)] == [b"b", b"a", b"c", b"h"]
        assert now.isdisjoint(gone)

    run_engine(scenario, tmp_path)


def test_a_region_outlives_the_retention_that_deleted_its_file(tmp_path, monkeypatch):
    """A region handed out before retention deleted its file (durably, the
    file unlinked) still sends the batches it named: the file object it
    holds stays open; the engine never closes it."""
    monkeypatch.setattr(segment_files, "FILE_MIN_BYTES", 0)

    async def scenario(engine):
        await engine.create_topic(TOPIC, 1, {"segment.bytes": "5000"})
        tablet = engine.partition(TOPIC, 0)
        tablet.set_tail_budget(0)
        await produce(tablet, [batch(i) for i in range(6)])  # a file per batch
        read = await tablet.read(0, 1)
        [region] = read.batches
        assert isinstance(region, FileRegion)
        expected = tablet.read_entry(entries(engine, tablet)[0][1])
        path = tablet.files._path(log_entry.locate(entries(engine, tablet)[0][1])[0])

        assert await tablet.delete_records(12) == 12
        for _ in range(500):  # the unlink runs on the writer thread once durable
            if not os.path.exists(path):
                break
            await asyncio.sleep(0.01)
        assert not os.path.exists(path)  # the premise: the file is gone
        gc.collect()
        assert not region.file.closed
        assert region.read() == expected
        left, right = socket.socketpair()
        try:
            sent = os.sendfile(left.fileno(), region.file.fileno(), region.offset, region.length)
            assert sent == region.length
            assert right.recv(region.length, socket.MSG_WAITALL) == expected
        finally:
            left.close()
            right.close()

    run_engine(scenario, tmp_path)
