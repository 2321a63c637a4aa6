"""Committed consumer offsets in the store: durability, versions, deletion."""

from __future__ import annotations

import asyncio

from tablets import EngineSettings, StorageEngine
from tablets.consumer_offsets import ConsumerOffsets, OffsetCommit
from tablets.rocks_store import Ops


def run(coro_fn, data_dir):
    """Run ``coro_fn(engine, offsets)`` against an engine on ``data_dir``, then close it."""

    async def main():
        engine = StorageEngine(str(data_dir), EngineSettings())
        engine.start(asyncio.get_running_loop())
        try:
            assert engine.consumer_offsets is not None
            return await coro_fn(engine, engine.consumer_offsets)
        finally:
            engine.close()

    return asyncio.run(main())


def test_commits_survive_a_restart_with_every_field(tmp_path):
    async def write(engine, offsets: ConsumerOffsets):
        await offsets.commit("g", {("t", 0): OffsetCommit(10, 3, "meta-é"),
                                   ("t", 1): OffsetCommit(20)}, now_ms=1234)
        await offsets.commit("other", {("u", 5): OffsetCommit(7)}, now_ms=99)
        return offsets.group_offsets("g")

    before = run(write, tmp_path)

    async def reread(engine, offsets: ConsumerOffsets):
        assert offsets.group_offsets("g") == before
        first = offsets.committed("g", "t", 0)
        assert (first.offset, first.leader_epoch, first.metadata, first.commit_timestamp) == (
            10, 3, "meta-é", 1234)
        assert offsets.committed("g", "t", 1).metadata == ""
        assert sorted(offsets.groups()) == ["g", "other"]
        assert offsets.committed("g", "t", 2) is None
        assert offsets.version("g", "t", 2) == 0

    run(reread, tmp_path)


def test_versions_grow_with_every_commit_and_are_never_reused(tmp_path):
    async def first(engine, offsets: ConsumerOffsets):
        seen = []
        for offset in range(3):
            await offsets.commit("g", {("t", 0): OffsetCommit(offset)}, now_ms=0)
            seen.append(offsets.version("g", "t", 0))
        assert seen == sorted(set(seen)) and seen[0] > 0
        await offsets.delete("g")
        assert offsets.version("g", "t", 0) == 0
        return seen[-1]

    last = run(first, tmp_path)

    async def after_restart(engine, offsets: ConsumerOffsets):
        await offsets.commit("g", {("t", 0): OffsetCommit(0)}, now_ms=0)
        assert offsets.version("g", "t", 0) > last

    run(after_restart, tmp_path)


def test_a_commit_becomes_visible_once_durable_and_newest_wins(tmp_path):
    async def test(engine, offsets: ConsumerOffsets):
        older = asyncio.ensure_future(offsets.commit("g", {("t", 0): OffsetCommit(1)}, 0))
        newer = asyncio.ensure_future(offsets.commit("g", {("t", 0): OffsetCommit(2)}, 0))
        await asyncio.sleep(0)  # both staged, neither written yet
        assert offsets.committed("g", "t", 0) is None
        await asyncio.gather(older, newer)
        assert offsets.committed("g", "t", 0).offset == 2
        # Published out of order (e.g. by a transaction), the later stage still wins.
        first_ops, second_ops = Ops(), Ops()
        first = offsets.stage("g", {("t", 0): OffsetCommit(5)}, 0, first_ops)
        second = offsets.stage("g", {("t", 0): OffsetCommit(6)}, 0, second_ops)
        await engine.writer.submit(first_ops)
        await engine.writer.submit(second_ops)
        offsets.publish("g", second)
        offsets.publish("g", first)
        assert offsets.committed("g", "t", 0).offset == 6

    run(test, tmp_path)


def test_delete_orders_with_commits_in_flight(tmp_path):
    async def test(engine, offsets: ConsumerOffsets):
        await offsets.commit("g", {("t", 0): OffsetCommit(1), ("t", 1): OffsetCommit(1)}, 0)
        before = asyncio.ensure_future(offsets.commit("g", {("t", 0): OffsetCommit(2)}, 0))
        await asyncio.sleep(0)
        deleting = asyncio.ensure_future(offsets.delete("g"))
        await asyncio.sleep(0)
        after = asyncio.ensure_future(offsets.commit("g", {("t", 1): OffsetCommit(3)}, 0))
        await asyncio.gather(before, deleting, after)
        # The commit staged before the deletion is gone; the one after it stays.
        assert offsets.group_offsets("g").keys() == {("t", 1)}
        assert offsets.committed("g", "t", 1).offset == 3
        assert await offsets.delete("g", [("t", 9)]) == 0

    run(test, tmp_path)

    async def reread(engine, offsets: ConsumerOffsets):
        assert offsets.group_offsets("g").keys() == {("t", 1)}

    run(reread, tmp_path)


def test_deleting_a_topic_drops_its_offsets_in_every_group(tmp_path):
    async def test(engine, offsets: ConsumerOffsets):
        await engine.create_topic("doomed", 1, {})
        await engine.create_topic("kept", 1, {})
        for group in ("a", "b"):
            await offsets.commit(group, {("doomed", 0): OffsetCommit(5),
                                         ("kept", 0): OffsetCommit(6)}, 0)
        await offsets.commit("only-doomed", {("doomed", 0): OffsetCommit(1)}, 0)
        await engine.delete_topic("doomed")
        assert {g: set(offsets.group_offsets(g)) for g in offsets.groups()} == {
            "a": {("kept", 0)}, "b": {("kept", 0)}}

    run(test, tmp_path)

    async def reread(engine, offsets: ConsumerOffsets):
        assert sorted(offsets.groups()) == ["a", "b"]
        assert offsets.committed("a", "doomed", 0) is None

    run(reread, tmp_path)


def test_a_commit_whose_caller_is_cancelled_is_still_published(tmp_path):
    """The writer writes a submitted change whatever becomes of its caller, so
    the offset must become visible when it lands, not only if the caller
    lived to see it (a connection closed mid-OffsetCommit)."""
    async def body(engine, offsets: ConsumerOffsets):
        task = asyncio.ensure_future(offsets.commit("g", {("t", 0): OffsetCommit(42)}, now_ms=1))
        await asyncio.sleep(0)  # submitted, not yet written
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        else:
            raise AssertionError("the commit was not cancelled: the premise failed")
        for _ in range(100):
            if offsets.committed("g", "t", 0) is not None:
                break
            await asyncio.sleep(0.01)
        committed = offsets.committed("g", "t", 0)
        assert committed is not None and committed.offset == 42
        assert offsets.latest("g", "t", 0) is committed

    run(body, tmp_path)


def test_deleting_a_group_removes_a_commit_published_meanwhile(tmp_path):
    """A commit staged before a whole-group deletion lands first and is deleted
    by it (the same range): memory must not keep it."""
    async def body(engine, offsets: ConsumerOffsets):
        await offsets.commit("g", {("t", 0): OffsetCommit(1)}, now_ms=1)
        racing = asyncio.ensure_future(offsets.commit("g", {("t", 1): OffsetCommit(2)},
                                                      now_ms=2))
        await asyncio.sleep(0)  # staged (version taken) before the deletion
        assert offsets.latest("g", "t", 1) is not None
        await offsets.delete("g")
        await racing
        assert offsets.group_offsets("g") == {}
        assert not offsets.has_offsets("g")

    run(body, tmp_path)
