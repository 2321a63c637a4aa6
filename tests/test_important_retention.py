"""Important consumers in the storage engine: retention held at what named
groups have not committed (tablets/important.py), the ceiling, releases, the
config's validation. Real clients over the wire: compat_tests/test_important_consumers.py."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

import pytest

from kafka_gateway.groups import GroupCoordinator, GroupOffsets
from kafka_gateway.settings import GatewayConfig
from kafka_gateway.topic_configs import SOURCE_DEFAULT, SOURCE_DYNAMIC_TOPIC, topic_entries
from tablets import EngineSettings, StorageEngine, keys
from tablets.consumer_offsets import OffsetCommit
from tablets.important import ImportantConsumers
from tablets.rocks_store import Ops
from tablets.topic_config import InvalidConfig, validate, validate_all
from testkit.batches import make_batch

GROUPS = "gateway.important.consumer.groups"
MAX_BYTES = "gateway.important.consumer.max.bytes"


def run(coro_fn, data_dir):
    async def main():
        engine = StorageEngine(str(data_dir), EngineSettings())
        engine.start(asyncio.get_running_loop())
        try:
            return await coro_fn(engine)
        finally:
            engine.close()

    return asyncio.run(main())


async def fill(engine, topic, configs, timestamps=(100, 200, 5000, 6000)):
    """A one-partition topic of two-record batches (offsets 0-1, 2-3, ...)."""
    await engine.create_topic(topic, 1, configs)
    tablet = engine.partition(topic, 0)
    for ts in timestamps:
        await tablet.append(make_batch([b"r" * 50] * 2, key=b"k", base_timestamp=ts), 0)
    return tablet


async def commit(engine, group, topic, offset):
    await engine.consumer_offsets.commit(group, {(topic, 0): OffsetCommit(offset)}, 0)


def row(engine, group):
    (found,) = [r for r in engine.important.report_tablets(engine.tablets()) if r.group == group]
    return found


async def retain(engine, tablet, now):
    await engine.important.retain(tablet, now)
    return tablet.log_start_offset


def test_time_retention_waits_for_important_groups_not_others(tmp_path):
    async def scenario(engine):
        tablet = await fill(engine, "t", {"retention.ms": "1000", GROUPS: "billing,audit"})
        await commit(engine, "other", "t", 0)  # an ordinary group: its lag may fall off
        # Neither important group committed: both hold from the log start.
        assert await retain(engine, tablet, 5500) == 0
        billing = row(engine, "billing")
        assert (billing.committed, billing.lag, billing.released) == (None, 8, False)
        assert billing.held_bytes == tablet.size_bytes // 2  # the two expired batches
        assert billing.held_age_ms >= 5500 - 101 - 1
        await commit(engine, "billing", "t", 3)
        assert await retain(engine, tablet, 5500) == 0  # audit still holds offset 0
        await commit(engine, "audit", "t", 1)
        # Offset 1 is inside batch 0-1: that batch stays, as for DeleteRecords.
        assert await retain(engine, tablet, 5500) == 1
        assert row(engine, "audit").held_bytes > 0
        await commit(engine, "audit", "t", 6)
        assert await retain(engine, tablet, 5500) == 3  # billing at 3 now holds
        await commit(engine, "billing", "t", 8)
        assert await retain(engine, tablet, 5500) == 4  # retention caught up: due was 4
        assert row(engine, "billing").held_bytes == 0 and row(engine, "billing").lag == 0
        assert row(engine, "audit").lag == 2
        # The ordinary group's committed offset fell off the log.
        assert engine.consumer_offsets.committed("other", "t", 0).offset < tablet.log_start_offset

    run(scenario, tmp_path)


def test_size_retention_and_the_ceiling(tmp_path):
    async def scenario(engine):
        tablet = await fill(engine, "s", {"retention.bytes": "100", GROUPS: "billing"},
                            timestamps=(1, 2, 3, 4, 5, 6))
        await commit(engine, "billing", "s", 4)
        assert await retain(engine, tablet, 10) == 4  # size retention would go to 10
        assert row(engine, "billing").held_bytes == tablet.size_bytes - (
            tablet.size_bytes // 4)  # everything but the newest batch, which stays anyway
        held_bytes = tablet.size_bytes
        # A ceiling of 3 batches: retention passes the group down to it, and says so.
        batch = held_bytes // 4
        await engine.set_topic_configs("s", {"retention.bytes": "100", GROUPS: "billing",
                                             MAX_BYTES: str(3 * batch)})
        assert await retain(engine, tablet, 10) == 6
        assert tablet.size_bytes == 3 * batch
        billing = row(engine, "billing")
        assert (billing.passed, billing.records_passed) == (1, 2)
        # Under the ceiling now: no further pass.
        assert await retain(engine, tablet, 10) == 6
        assert row(engine, "billing").passed == 1
        # The ceiling never goes further than retention itself.
        await engine.set_topic_configs("s", {"retention.bytes": "-1", "retention.ms": "-1",
                                             GROUPS: "billing", MAX_BYTES: "0"})
        assert await retain(engine, tablet, 10) == 6

    run(scenario, tmp_path)


def test_ceiling_pass_is_logged(tmp_path, caplog):
    async def scenario(engine):
        tablet = await fill(engine, "c", {"retention.ms": "1000", GROUPS: "billing",
                                          MAX_BYTES: "0"})
        with caplog.at_level(logging.WARNING, logger="tablets.important"):
            assert await retain(engine, tablet, 5500) == 4
        assert "retention passed important consumer group billing on c-0: offsets 0..3" in (
            caplog.text)

    run(scenario, tmp_path)


def test_deleted_or_unnamed_groups_release_and_a_commit_holds_again(tmp_path):
    async def scenario(engine):
        tablet = await fill(engine, "d", {"retention.ms": "1000", GROUPS: "billing,audit"},
                            timestamps=(100, 200, 300, 5000))
        await commit(engine, "billing", "d", 0)
        assert await retain(engine, tablet, 5500) == 0
        await engine.consumer_offsets.delete("billing")  # DeleteGroups
        assert await retain(engine, tablet, 5500) == 0  # audit, never committed, holds
        assert row(engine, "billing").released
        await engine.set_topic_configs("d", {"retention.ms": "1000", GROUPS: "billing"})
        # audit is no longer named, deleted billing holds nothing: retention as due.
        assert await retain(engine, tablet, 5500) == 6

    run(scenario, tmp_path)

    async def after_restart(engine):
        tablet = engine.partition("d", 0)
        assert engine.consumer_offsets.is_released("billing", "d", 0)  # it was persisted
        # A commit makes billing hold again (at its offset), across restarts.
        await tablet.append(make_batch([b"n"] * 2, base_timestamp=5400), 0)
        await commit(engine, "billing", "d", 6)
        assert not engine.consumer_offsets.is_released("billing", "d", 0)
        assert await retain(engine, tablet, 7000) == 6

    run(after_restart, tmp_path)

    async def held_after_restart(engine):
        assert not engine.consumer_offsets.is_released("billing", "d", 0)
        assert await retain(engine, engine.partition("d", 0), 7000) == 6

    run(held_after_restart, tmp_path)


def test_offset_delete_releases_one_partition(tmp_path):
    async def scenario(engine):
        tablet = await fill(engine, "o", {"retention.ms": "1000", GROUPS: "billing"})
        await commit(engine, "billing", "o", 2)
        assert await retain(engine, tablet, 5500) == 2
        await engine.consumer_offsets.delete("billing", [("o", 0)])  # OffsetDelete
        assert await retain(engine, tablet, 5500) == 4

    run(scenario, tmp_path)


def test_transactional_commit_holds_once_committed(tmp_path):
    async def scenario(engine):
        tablet = await fill(engine, "x", {"retention.ms": "1000", GROUPS: "billing"})
        offsets = engine.consumer_offsets
        ops = Ops()
        staged = offsets.stage("billing", {("x", 0): OffsetCommit(2)}, 0, ops,
                               committer="txn-1")
        # Staged in an open transaction: not a commit yet, billing still at the start.
        assert await retain(engine, tablet, 5500) == 0
        await engine.writer.submit(ops)
        offsets.publish("billing", staged)
        assert await retain(engine, tablet, 5500) == 2

    run(scenario, tmp_path)


def test_delete_records_is_not_held(tmp_path):
    async def scenario(engine):
        tablet = await fill(engine, "r", {"retention.ms": "-1", GROUPS: "billing"})
        assert await tablet.delete_records(6) == 6
        assert await retain(engine, tablet, 5500) == 6
        assert row(engine, "billing").lag == 2  # held from the (new) log start

    run(scenario, tmp_path)


def test_compact_delete_topic_is_held_compact_only_has_no_retention(tmp_path):
    async def scenario(engine):
        both = await fill(engine, "cd", {"cleanup.policy": "compact,delete",
                                         "retention.ms": "1000", GROUPS: "billing"})
        assert await retain(engine, both, 5500) == 0
        await commit(engine, "billing", "cd", 2)
        assert await retain(engine, both, 5500) == 2
        compact = await fill(engine, "co", {"cleanup.policy": "compact",
                                            "retention.ms": "1000", GROUPS: "billing"})
        assert await retain(engine, compact, 5500) == 0
        assert engine.important.holds(engine.important.view(compact)) == {}

    run(scenario, tmp_path)


def test_offset_expiry_spares_important_groups(tmp_path):
    async def scenario(engine):
        await engine.create_topic("e", 1, {GROUPS: "billing"})
        await engine.create_topic("f", 1, {})
        offsets = engine.consumer_offsets
        assert offsets.is_important("billing", "e")
        assert not offsets.is_important("billing", "f") and not offsets.is_important("x", "e")
        clock = [time.time_ns() // 1_000_000]
        config = dataclasses.replace(GatewayConfig(), offsets_retention_minutes=1)
        coordinator = GroupCoordinator(config, offsets, lambda: clock[0])
        groups = GroupOffsets(config, coordinator, offsets, lambda: clock[0])
        try:
            for group in ("billing", "other"):
                await offsets.commit(group, {("e", 0): OffsetCommit(1), ("f", 0): OffsetCommit(1)},
                                     clock[0])
            clock[0] += 61_000
            # Everything expires (the groups have no members) but billing's offset of e.
            assert await groups.expire_offsets() == 3
            assert set(offsets.group_offsets("billing")) == {("e", 0)}
            assert not offsets.has_offsets("other")
            # Expiry is not an operator's deletion: it releases nothing.
            assert not offsets.is_released("billing", "f", 0)
            assert not offsets.is_released("other", "e", 0)
        finally:
            coordinator.stop()

    run(scenario, tmp_path)


@pytest.mark.parametrize("value, why", [
    ("billing,,audit", "cannot be empty"),
    ("billing,", "cannot be empty"),
    ("billing,billing", "named twice"),
    (",".join(f"g{i}" for i in range(101)), "at most 100"),
])
def test_malformed_group_lists_are_refused(value, why):
    with pytest.raises(InvalidConfig, match=why) as raised:
        validate(GROUPS, value)
    assert GROUPS in str(raised.value)


def test_valid_values_are_stored_as_kafka_shows_lists():
    assert validate(GROUPS, " billing , audit ") == "billing,audit"
    assert validate(GROUPS, "") == ""
    assert validate_all({MAX_BYTES: "-1"}) == {MAX_BYTES: "-1"}
    with pytest.raises(InvalidConfig, match="at least -1"):
        validate(MAX_BYTES, "-2")
    with pytest.raises(InvalidConfig, match="Not a number"):
        validate(MAX_BYTES, "lots")


def test_described_only_where_set_or_asked_for():
    plain = {e.name: e for e in topic_entries({}, {})}
    assert GROUPS not in plain and MAX_BYTES not in plain  # as on Kafka
    asked = {e.name: e for e in topic_entries({}, {}, named=(GROUPS, MAX_BYTES))}
    assert (asked[GROUPS].value, asked[GROUPS].source) == ("", SOURCE_DEFAULT)
    assert (asked[MAX_BYTES].value, asked[MAX_BYTES].source) == ("-1", SOURCE_DEFAULT)
    configured = {e.name: e for e in topic_entries({GROUPS: "billing"}, {})}
    assert (configured[GROUPS].value, configured[GROUPS].source) == ("billing",
                                                                     SOURCE_DYNAMIC_TOPIC)
    assert configured[GROUPS].synonyms == ((GROUPS, "billing", SOURCE_DYNAMIC_TOPIC),)
    assert MAX_BYTES not in configured


def test_a_deleted_topic_forgets_its_figures(tmp_path):
    async def scenario(engine):
        configs = {"retention.ms": "1000", GROUPS: "billing", MAX_BYTES: "0"}
        tablet = await fill(engine, "gone", configs)
        assert await retain(engine, tablet, 5500) == 4
        assert row(engine, "billing").passed == 1
        await engine.delete_topic("gone")
        await engine.create_topic("gone", 1, configs)
        again = row(engine, "billing")
        assert (again.passed, again.records_passed, again.held_bytes) == (0, 0, 0)

    run(scenario, tmp_path)


def test_held_figures_read_incrementally_match_a_fresh_read(tmp_path):
    """Passes read only the batches newly due; their figures equal what a
    first pass over the same log finds, through appends, commits, DeleteRecords
    and retention changes."""
    async def scenario(engine):
        configs = {"retention.ms": "1000", GROUPS: "billing,audit"}
        tablet = await fill(engine, "inc", configs, timestamps=range(100, 1100, 100))
        now = 1500  # batches up to ts 400 are due (offsets 0-9)
        steps = [
            lambda: commit(engine, "audit", "inc", 3),
            lambda: tablet.append(make_batch([b"n" * 30] * 3, key=b"k", base_timestamp=700), 0),
            lambda: commit(engine, "billing", "inc", 5),
            lambda: tablet.delete_records(4),
            lambda: commit(engine, "audit", "inc", 16),
            lambda: engine.set_topic_configs("inc", {**configs, "retention.ms": "1200"}),
            lambda: commit(engine, "billing", "inc", 12),
        ]
        for number, step in enumerate(steps):
            await step()
            now += 200
            fresh = ImportantConsumers(engine.consumer_offsets)
            # Either one truncates (reading past batches it deletes), then the other
            # finds the log start already there.
            order = (engine.important, fresh) if number % 2 else (fresh, engine.important)
            for important in order:
                await important.retain(tablet, now)
            for group in ("billing", "audit"):
                (mine,) = [r for r in engine.important.report_tablets([tablet]) if r.group == group]
                (theirs,) = [r for r in fresh.report_tablets([tablet]) if r.group == group]
                assert (mine.held_bytes, mine.held_age_ms) == (
                    theirs.held_bytes, theirs.held_age_ms), (group, now)
        assert tablet.log_start_offset == 12  # billing at 12 held the last pass
        assert row(engine, "billing").held_bytes > 0

    run(scenario, tmp_path)


def test_only_important_groups_leave_a_released_marker(tmp_path):
    async def scenario(engine):
        await fill(engine, "m", {GROUPS: "billing"})
        await engine.create_topic("n", 1, {})
        offsets = engine.consumer_offsets
        for group in ("billing", "other"):
            await offsets.commit(group, {("m", 0): OffsetCommit(1), ("n", 0): OffsetCommit(1)},
                                 0)
        await offsets.delete("billing", [("n", 0)])  # not important on n
        await offsets.delete("other")  # important nowhere
        await offsets.delete("ghost")  # no offsets, important nowhere: nothing at all
        assert list(engine.store.scan(keys.RELEASED, keys.RELEASED + b"\xff")) == []
        await offsets.delete("billing", [("m", 0)])
        assert [keys.parse_released_key(k) for k, _ in
                engine.store.scan(keys.RELEASED, keys.RELEASED + b"\xff")] == [("billing", "m", 0)]
        assert offsets.is_released("billing", "m", 0)
        assert not offsets.is_released("billing", "n", 0)
        assert not offsets.is_released("other", "m", 0)

    run(scenario, tmp_path)
