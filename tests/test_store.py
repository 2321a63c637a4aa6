"""GroupCommitWriter: where each change is written (on the event loop when it
is small and the writer thread is idle, else on the thread), and the
guarantees that hold either way: submission order, one atomic write per
group, a failed write failing its callers and every later one, no fsync on
the loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable

import pytest

from tablets.errors import StorageError
from tablets.rocks_store import Ops, RocksStore
from tablets.store import INLINE_BYTES, GroupCommitWriter

LOOP_THREAD = "loop"


class RecordingStore(RocksStore):
    """A store that records each write (which thread, which keys) and fails
    the writes ``fail_at`` names (by their index, counting from 0)."""

    def __init__(self, path: str, fsync: str = "never") -> None:
        super().__init__(path, fsync)  # type: ignore[arg-type]
        self.writes: list[tuple[str, list[bytes]]] = []
        self.fail_at: set[int] = set()
        self.gate: threading.Event | None = None  # the thread's writes wait for it

    def _apply(self, changes: list[Ops]) -> None:
        on_loop = threading.current_thread() is threading.main_thread()
        index = len(self.writes)
        self.writes.append((LOOP_THREAD if on_loop else threading.current_thread().name,
                            [key for ops in changes for key, _ in ops.puts]))
        if not on_loop and self.gate is not None:
            assert self.gate.wait(30), "the test never opened the gate"
        if index in self.fail_at:
            raise OSError(f"injected failure of write {index}")
        super()._apply(changes)


def change(key: bytes, size: int = 10) -> Ops:
    ops = Ops()
    ops.put(key, b"v" * size)
    return ops


def run(tmp_path, scenario: Callable[[RecordingStore, GroupCommitWriter], Awaitable[None]],
        fsync: str = "never") -> RecordingStore:
    store = RecordingStore(str(tmp_path / "db"), fsync)

    async def main() -> None:
        writer = GroupCommitWriter(store, asyncio.get_running_loop())
        try:
            await scenario(store, writer)
        finally:
            writer.close()

    try:
        asyncio.run(main())
    finally:
        store.close()
    return store


def completion_order(futures: list[asyncio.Future[None]]) -> list[int]:
    done: list[int] = []
    for index, future in enumerate(futures):
        future.add_done_callback(lambda _f, i=index: done.append(i))
    return done


def test_small_changes_of_one_pass_are_one_write_on_the_loop(tmp_path):
    async def scenario(store, writer):
        futures = [writer.submit(change(b"k%d" % i)) for i in range(5)]
        assert store.writes == []  # written in the loop's next pass, not in submit
        await asyncio.gather(*futures)
        assert store.writes == [(LOOP_THREAD, [b"k0", b"k1", b"k2", b"k3", b"k4"])]
        assert store.stats.loop_writes == 1
        assert store.stats.writes == 1 and store.stats.changes == 5
        assert store.get(b"k4") == b"v" * 10

    run(tmp_path, scenario)


def test_a_pass_with_a_large_change_is_one_write_on_the_thread(tmp_path):
    async def scenario(store, writer):
        small = writer.submit(change(b"small"))
        large = writer.submit(change(b"large", INLINE_BYTES))
        after = writer.submit(change(b"after"))
        order = completion_order([small, large, after])
        await asyncio.gather(small, large, after)
        assert order == [0, 1, 2]
        assert store.writes == [("rocks-writer", [b"small", b"large", b"after"])]
        assert store.stats.loop_writes == 0
        assert store.get(b"after") == b"v" * 10

    run(tmp_path, scenario)


def test_changes_wait_for_the_threads_changes_before_them(tmp_path):
    async def scenario(store, writer):
        store.gate = threading.Event()  # hold the thread's write
        large = writer.submit(change(b"large", INLINE_BYTES + 1))
        for _ in range(3000):  # until the thread holds it (at most 30 s)
            if store.writes:
                break
            await asyncio.sleep(0.01)
        small = [writer.submit(change(b"s%d" % i)) for i in range(3)]
        await asyncio.sleep(0)  # their pass ends: they go to the thread, behind the large one
        more = writer.submit(change(b"s3"))
        order = completion_order([large, *small, more])
        await asyncio.sleep(0.05)
        assert not any(f.done() for f in (*small, more))  # not written ahead of the large one
        assert store.writes == [("rocks-writer", [b"large"])]
        store.gate.set()
        await asyncio.gather(large, *small, more)
        assert order == [0, 1, 2, 3, 4]
        assert [key for _, keys in store.writes for key in keys] == [
            b"large", b"s0", b"s1", b"s2", b"s3"]
        assert all(thread == "rocks-writer" for thread, _ in store.writes)
        # Once the thread's futures are resolved, small changes are the loop's again.
        await writer.submit(change(b"later"))
        assert store.writes[-1] == (LOOP_THREAD, [b"later"])

    run(tmp_path, scenario)


def test_the_loop_writes_no_more_than_inline_bytes(tmp_path):
    async def scenario(store, writer):
        size = INLINE_BYTES // 3
        futures = [writer.submit(change(b"k%d" % i, size)) for i in range(4)]
        order = completion_order(futures)
        await asyncio.gather(*futures)
        assert order == [0, 1, 2, 3]
        assert store.writes == [("rocks-writer", [b"k0", b"k1", b"k2", b"k3"])]
        three = [writer.submit(change(b"j%d" % i, size - 10)) for i in range(3)]
        await asyncio.gather(*three)
        assert store.writes[-1] == (LOOP_THREAD, [b"j0", b"j1", b"j2"])

    run(tmp_path, scenario)


def test_a_failed_write_on_the_loop_fails_its_callers_and_every_later_one(tmp_path):
    async def scenario(store, writer):
        store.fail_at = {0}
        first = [writer.submit(change(b"a")), writer.submit(change(b"b"))]
        results = await asyncio.gather(*first, return_exceptions=True)
        assert store.writes == [(LOOP_THREAD, [b"a", b"b"])]  # the fault landed there
        assert all(isinstance(r, StorageError) and "injected" in str(r) for r in results)
        assert isinstance(writer.failed, OSError)
        with pytest.raises(StorageError, match="failed earlier"):
            await writer.submit(change(b"c"))
        with pytest.raises(StorageError, match="failed earlier"):
            await writer.submit(change(b"d", INLINE_BYTES + 1))
        assert len(store.writes) == 1  # nothing written after the failure
        assert store.get(b"a") is None and store.get(b"c") is None

    run(tmp_path, scenario)


def test_a_failed_write_on_the_thread_fails_its_callers_and_every_later_one(tmp_path):
    async def scenario(store, writer):
        store.fail_at = {0}
        large = writer.submit(change(b"large", INLINE_BYTES + 1))
        also = writer.submit(change(b"also"))
        with pytest.raises(StorageError, match="injected"):
            await also
        with pytest.raises(StorageError, match="injected"):
            await large
        assert store.writes == [("rocks-writer", [b"large", b"also"])]
        with pytest.raises(StorageError, match="failed earlier"):
            await writer.submit(change(b"small"))
        assert len(store.writes) == 1

    run(tmp_path, scenario)


def test_a_change_with_clean_up_after_it_is_written_on_the_thread(tmp_path):
    ran_on: list[str] = []

    async def scenario(store, writer):
        small = writer.submit(change(b"small"))
        cleaning = change(b"cleaning")
        cleaning.after_write(lambda: ran_on.append(threading.current_thread().name))
        await asyncio.gather(small, writer.submit(cleaning))
        # Its whole pass goes to the thread, and the clean-up runs there, after the write.
        assert store.writes == [("rocks-writer", [b"small", b"cleaning"])]
        assert ran_on == ["rocks-writer"]
        assert store.stats.loop_writes == 0
        await writer.submit(change(b"next"))  # a later small pass is on the loop again
        assert store.writes[-1] == (LOOP_THREAD, [b"next"])

    run(tmp_path, scenario)


def test_with_fsync_always_nothing_is_written_on_the_loop(tmp_path):
    async def scenario(store, writer):
        futures = [writer.submit(change(b"k%d" % i)) for i in range(3)]
        await asyncio.gather(*futures)
        await writer.submit(change(b"later"))
        assert store.writes  # the premise: writes happened
        assert all(thread == "rocks-writer" for thread, _ in store.writes)
        assert store.stats.loop_writes == 0
        assert store.stats.fsyncs == store.stats.writes

    run(tmp_path, scenario, fsync="always")


def test_close_writes_what_the_loop_gathered(tmp_path):
    pending: list[asyncio.Future[None]] = []

    async def scenario(store, writer):
        pending.append(writer.submit(change(b"gathered")))
        # run() closes the writer before the loop's next pass could write it.

    store = RecordingStore(str(tmp_path / "db"))
    try:
        async def main() -> None:
            writer = GroupCommitWriter(store, asyncio.get_running_loop())
            await scenario(store, writer)
            writer.close()
            await asyncio.sleep(0.01)  # the thread's answer arrives
            assert pending[0].done() and pending[0].exception() is None

        asyncio.run(main())
        assert store.writes == [("rocks-writer", [b"gathered"])]
        assert store.get(b"gathered") == b"v" * 10
    finally:
        store.close()


def test_appends_through_both_paths_are_acknowledged_in_order(tmp_path):
    """A large batch goes to the writer thread, the small ones after it wait
    for it; the high watermark and the acknowledgements follow call order."""
    from tablets import EngineSettings, StorageEngine
    from testkit.batches import make_batch
    from testkit.compaction import as_batches

    async def main() -> None:
        engine = StorageEngine(str(tmp_path / "engine"), EngineSettings())
        engine.start(asyncio.get_running_loop())
        try:
            await engine.create_topic("t", 2, {})
            tablet, other = engine.partition("t", 0), engine.partition("t", 1)
            await tablet.append(make_batch([b"first"]), 0)
            loop_writes = engine.write_stats().loop_writes
            assert loop_writes >= 1  # the premise: a lone small append is written on the loop
            large = make_batch([b"x" * (INLINE_BYTES + 1)])
            appended = [tablet.append(large, 0), tablet.append(make_batch([b"a"]), 0),
                        other.append(make_batch([b"b"]), 0)]
            watermarks: list[int] = []
            for future in appended:
                future.add_done_callback(lambda _f: watermarks.append(tablet.high_watermark))
            order = completion_order(appended)  # type: ignore[arg-type]
            results = await asyncio.gather(*appended)
            assert [r.base_offset for r in results] == [1, 2, 0]
            assert order == [0, 1, 2]
            assert watermarks == sorted(watermarks) and tablet.high_watermark == 3
            assert engine.write_stats().loop_writes == loop_writes  # that pass went to the thread
            batches = as_batches((await tablet.read(0, 1 << 30)).batches)
            assert [len(b) for b in batches][1] == len(large)
        finally:
            engine.close()

    asyncio.run(main())


def test_during_a_write_stall_nothing_is_written_on_the_loop(tmp_path):
    class StalledStore(RecordingStore):
        def write_may_wait(self) -> bool:
            self.asked = True
            return True

    store = StalledStore(str(tmp_path / "db"))

    async def main() -> None:
        writer = GroupCommitWriter(store, asyncio.get_running_loop())
        try:
            await asyncio.gather(*(writer.submit(change(b"k%d" % i)) for i in range(3)))
        finally:
            writer.close()

    try:
        asyncio.run(main())
        assert store.asked  # the premise: the writer asked
        assert store.writes == [("rocks-writer", [b"k0", b"k1", b"k2"])]
        assert store.stats.loop_writes == 0
    finally:
        store.close()


def test_a_fresh_store_reports_no_write_stall(tmp_path):
    store = RocksStore(str(tmp_path / "db"))
    try:
        assert store.write_may_wait() is False
    finally:
        store.close()


def test_groups_queued_behind_a_failed_write_fail_unwritten(tmp_path):
    async def scenario(store, writer):
        store.gate = threading.Event()  # hold the thread's first write
        store.fail_at = {0}
        first = writer.submit(change(b"first", INLINE_BYTES + 1))
        for _ in range(3000):  # until the thread holds it (at most 30 s)
            if store.writes:
                break
            await asyncio.sleep(0.01)
        behind = writer.submit(change(b"behind"))
        await asyncio.sleep(0)  # its pass ends: queued behind the held write
        store.gate.set()
        for future in (first, behind):
            with pytest.raises(StorageError, match="injected"):
                await future
        assert store.writes == [("rocks-writer", [b"first"])]  # "behind" never written
        assert store.get(b"behind") is None

    run(tmp_path, scenario)
