"""The last close of an unlinked segment file, which frees its blocks (slow
on a big file), happens on the reaper's thread: never on the writer thread,
whose produce acknowledgements would wait behind it, nor on the event loop
(tablets/file_reaper.py)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from io import FileIO

from tablets import file_reaper, segment_files
from testkit.batches import make_batch
from testkit.compaction import now_ms, run_engine

WAIT_S = 10.0


class RecordingFile(FileIO):
    """A FileIO that notes the thread of its (first) close."""

    closes: list[tuple[str, str]] = []

    def close(self) -> None:
        if not self.closed:
            RecordingFile.closes.append((self.name, threading.current_thread().name))
        super().close()


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {WAIT_S}s waiting for {what}"
        time.sleep(0.01)


def test_a_file_is_closed_once_nothing_else_holds_it(tmp_path):
    reaper = file_reaper.FileReaper(poll_s=0.01)
    path = tmp_path / "f.log"
    held = RecordingFile(str(path), "w+")
    os.unlink(path)
    reaper.adopt(held)
    reaper.adopt(held)  # once: a second reference of its own would keep it open
    time.sleep(0.1)  # several polls
    assert not held.closed and reaper.pending() == 1  # someone (this test) holds it
    RecordingFile.closes.clear()
    del held
    wait_until(lambda: reaper.pending() == 0, "the reaper to close the file")
    assert RecordingFile.closes == [(str(path), "file-reaper")]
    assert reaper.closed == 1


def test_a_deleted_topics_files_are_closed_by_the_reaper_not_the_writer(tmp_path, monkeypatch):
    """Batches big enough to go through the writer thread; the topic deleted;
    a produce to another topic then makes the writer write again. Every file
    of the deleted topic is closed on the reaper's thread (it used to be the
    writer's, at its next write, holding that produce behind the frees)."""
    monkeypatch.setattr(segment_files, "FileIO", RecordingFile)
    monkeypatch.setattr(segment_files, "FILE_MIN_BYTES", 0)
    RecordingFile.closes.clear()
    big = [make_batch([b"%d" % i + b"x" * (300 << 10)]) for i in range(6)]

    async def scenario(engine):
        await engine.create_topic("gone", 2, {"segment.bytes": str(len(big[0]) * 2)})
        await engine.create_topic("next", 1, {})
        for i, batch in enumerate(big):
            await engine.partition("gone", i % 2).append(batch, now_ms())
        dirs = [engine.partition("gone", p).files.dir for p in range(2)]
        paths = {os.path.join(d, name) for d in dirs for name in os.listdir(d)}
        assert len(paths) == 4  # two files a partition
        stats = engine.store.stats
        assert stats.writes - stats.loop_writes >= len(big)  # the writer thread wrote them
        await engine.delete_topic("gone")
        assert not any(os.path.exists(d) for d in dirs)
        await engine.partition("next", 0).append(big[0], now_ms())  # the writer again
        await asyncio.get_running_loop().run_in_executor(
            None, wait_until, lambda: paths <= {p for p, _ in RecordingFile.closes},
            "the deleted files to be closed")
        return paths

    paths = run_engine(scenario, tmp_path)
    threads = {thread for path, thread in RecordingFile.closes if path in paths}
    assert threads == {"file-reaper"}, RecordingFile.closes


def test_a_file_retention_deletes_is_closed_by_the_reaper(tmp_path, monkeypatch):
    """DeleteRecords past a whole file: the writer thread unlinks it once the
    change is durable and hands it to the reaper, which closes it."""
    monkeypatch.setattr(segment_files, "FileIO", RecordingFile)
    monkeypatch.setattr(segment_files, "FILE_MIN_BYTES", 0)
    RecordingFile.closes.clear()
    batches = [make_batch([b"%d" % i + b"x" * 1000]) for i in range(4)]

    async def scenario(engine):
        await engine.create_topic("t", 1, {"segment.bytes": str(len(batches[0]))})
        tablet = engine.partition("t", 0)
        for batch in batches:
            await tablet.append(batch, now_ms())
        first = tablet.files.files[0].path
        await tablet.delete_records(2)  # the first two files' batches
        await asyncio.get_running_loop().run_in_executor(
            None, wait_until, lambda: first in {p for p, _ in RecordingFile.closes},
            "the first file to be closed")
        assert not os.path.exists(first)
        return first

    first = run_engine(scenario, tmp_path)
    assert (first, "file-reaper") in RecordingFile.closes, RecordingFile.closes


def test_aborted_bytes_are_punched_out_on_the_reapers_thread(tmp_path, monkeypatch):
    """An aborted transaction's bytes are freed on the reaper's thread, after
    the abort is durable, never on the writer thread."""
    from tablets import batch as batch_header
    from txn import TransactionCoordinator, TxnSettings

    punched: list[str] = []
    punch_all = segment_files._punch_all

    def recording(file, spans):
        punched.append(threading.current_thread().name)
        punch_all(file, spans)

    monkeypatch.setattr(segment_files, "_punch_all", recording)

    async def scenario(engine):
        await engine.create_topic("t", 1, {})
        tablet = engine.partition("t", 0)
        txns = TransactionCoordinator(engine, TxnSettings(), now_ms)
        txns.load()
        pid, epoch = await txns.init_producer_id("tid", 60_000)
        await txns.add_partitions("tid", pid, epoch, [("t", 0)], -1)
        sink = txns.sink_for("tid", pid, epoch, "t", 0, -1)
        await tablet.append(make_batch([b"x" * (64 << 10)], producer_id=pid,
                                       producer_epoch=epoch, base_sequence=0,
                                       attributes=batch_header.ATTR_TRANSACTIONAL),
                            now_ms(), sink)
        await txns.end_txn("tid", pid, epoch, False, -1)
        await asyncio.get_running_loop().run_in_executor(
            None, wait_until, lambda: punched, "the aborted bytes to be punched out")

    run_engine(scenario, tmp_path)
    assert punched == ["file-reaper"]
