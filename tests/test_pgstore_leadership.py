"""pgstore.leadership: the plan alone, then gateways in one process over a
throwaway PostgreSQL with 2 s leases:

- the coordinator slot of a key is Kafka's (Java's String.hashCode, Utils.abs);
- the plan: every key on a live node, counts within one, moves only where
  counts differ by more than one; a death moves only the dead node's keys;
- three gateways share 12 partitions and the 50 slots evenly; each learns
  what it leads at the database's epochs; one stops renewing (a crash): its
  partitions and slots are led by the others within its lease plus one
  renewal period (measured); a newcomer gets its share from the others;
  a clean stop gives its rows up at once; a watcher reading the rows all
  along sees every epoch only grow, and grow on every change of leader;
- two gateways taking the same rows at once: each row is won by exactly one;
- a gateway whose membership is lost (a newer process of its node) gives up
  everything at once, and the newer process leads the node's rows at new epochs.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import asyncpg

from pgstore.leadership import (
    Lead,
    Leadership,
    LeadershipChange,
    coordinator_slot,
    java_string_hash,
    plan,
)
from pgstore.membership import Listener, Membership, session_settings
from pgstore.migrate import migrate
from pgstore.schema import COORDINATOR_SLOTS
from testkit import postgres
from testkit.postgres import PostgresServer

pg_server = postgres.server_fixture("module")
LEASE = 2.0
PERIOD = LEASE / 3
T = TypeVar("T")


# ---------------------------------------------------------------- placement by key
def test_coordinator_slots_are_kafkas() -> None:
    # Values of Java's "...".hashCode().
    assert java_string_hash("") == 0
    assert java_string_hash("abc") == 96354
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == -(1 << 31)  # Integer.MIN_VALUE
    assert java_string_hash("\U0001F600") == 0xD83D * 31 + 0xDE00  # two UTF-16 units
    assert coordinator_slot("polygenelubricants") == 0  # Utils.abs(MIN_VALUE) is 0
    assert coordinator_slot("abc") == 96354 % 50
    # The definition, computed another way: sum of s[i]*31^(n-1-i) over UTF-16
    # units, taken as a signed 32-bit number.
    rng = random.Random(447)
    for _ in range(200):
        text = "".join(chr(rng.choice([rng.randint(32, 126), rng.randint(0x100, 0xD7FF)]))
                       for _ in range(rng.randint(0, 30)))
        units = [int.from_bytes(text.encode("utf-16-be")[i:i + 2], "big")
                 for i in range(0, 2 * len(text), 2)]
        value = sum(u * 31 ** (len(units) - 1 - i) for i, u in enumerate(units)) % (1 << 32)
        assert java_string_hash(text) == (value if value < 1 << 31 else value - (1 << 32))
    negative = next(t for t in (f"group-{i}" * 3 for i in range(100))
                    if java_string_hash(t) < 0)
    assert coordinator_slot(negative) == abs(java_string_hash(negative)) % 50
    assert {coordinator_slot(f"group-{i}") for i in range(2000)} == set(range(50))


# ---------------------------------------------------------------- the plan
def apply(leaders: dict[int, int | None], live: list[int]) -> tuple[dict[int, int | None], int]:
    """The leaders after the plan's moves, and how many moved between live nodes."""
    after = dict(leaders)
    between = 0
    for move in plan(live, leaders):
        assert after[move.key] == move.from_node
        between += move.from_node in live
        after[move.key] = move.to_node
    return after, between


def test_the_plan_balances_and_moves_little() -> None:
    rng = random.Random(22)
    for _ in range(400):
        live = rng.sample(range(1, 9), rng.randint(1, 5))
        keys = rng.randint(0, 60)
        leaders: dict[int, int | None] = {
            k: rng.choice([None, *range(1, 10)]) for k in rng.sample(range(1000), keys)}
        after, _ = apply(leaders, live)
        counts = Counter(after.values())
        assert set(counts) <= set(live)
        assert max(counts[n] for n in live) - min(counts[n] for n in live) <= 1
        assert plan(live, after) == []  # balanced: nothing more to do
        assert plan(list(reversed(live)), leaders) == plan(live, leaders)  # deterministic
        # Keys already on live nodes move only as far as balance needs.
        held = Counter(v for v in leaders.values() if v in live)
        base = keys // len(live)
        needed = sum(max(0, held[n] - (base + 1)) for n in live)
        moved = sum(1 for k in leaders if leaders[k] in live and after[k] != leaders[k])
        assert moved <= needed + len(live), (moved, needed)


def test_a_death_moves_only_the_dead_nodes_keys_and_a_join_takes_a_share() -> None:
    leaders: dict[int, int | None] = {k: None for k in range(12)}
    leaders, _ = apply(leaders, [1, 2, 3])
    assert sorted(Counter(leaders.values()).values()) == [4, 4, 4]
    after, between = apply(leaders, [1, 2])  # node 3 died
    assert between == 0
    assert all(after[k] == leaders[k] for k in leaders if leaders[k] != 3)
    assert sorted(Counter(after.values()).values()) == [6, 6]
    joined, between = apply(after, [1, 2, 4])  # node 4 joins: it gets 2 from each
    assert between == 4 and Counter(joined.values()) == {1: 4, 2: 4, 4: 4}
    assert apply({k: 1 for k in range(7)}, [1])[1] == 0
    # Two nodes join as a topic of 4 partitions is created: the newcomers
    # take the new partitions in turn, two each, not three and one.
    before: dict[int, int | None] = {k: 1 + k % 2 for k in range(8)}
    before.update({k: None for k in range(100, 104)})
    after, between = apply(before, [1, 2, 3, 4])
    assert between == 2 and Counter(after.values()) == {1: 3, 2: 3, 3: 3, 4: 3}
    assert Counter(after[k] for k in range(100, 104)) == {3: 2, 4: 2}


# ---------------------------------------------------------------- gateways in one process
@dataclass
class Node:
    membership: Membership
    leadership: Leadership
    changes: list[LeadershipChange] = field(default_factory=list)


async def start_node(pool: asyncpg.Pool, schema: str, node_id: int) -> Node:
    changes: list[LeadershipChange] = []
    membership = Membership(pool, schema, node_id, [Listener("PLAINTEXT", "127.0.0.1",
                                                             9000 + node_id)],
                            lease_seconds=LEASE)
    await membership.start()
    leadership = Leadership(membership, on_change=changes.append)
    await leadership.start()
    return Node(membership, leadership, changes)


async def stop_node(node: Node) -> None:
    await node.leadership.stop()
    await node.membership.stop()


async def crash_node(node: Node) -> None:
    """What the others see of a crash: no renewals, nothing given up, no row deleted."""
    await node.leadership.stop(give_up=False)
    await node.membership.halt()


def run(pg: PostgresServer, body: Callable[[asyncpg.Pool, str], Awaitable[T]]) -> T:
    schema = f"leaders_{uuid.uuid4().hex[:8]}"

    async def main() -> T:
        pool = await asyncpg.create_pool(pg.dsn, min_size=2, max_size=12,
                                         server_settings=session_settings(LEASE))
        try:
            async with pool.acquire() as conn:
                await migrate(conn, schema)
            return await asyncio.wait_for(body(pool, schema), timeout=120)
        finally:
            await pool.close()

    return asyncio.run(main())


async def new_topic(pool: asyncpg.Pool, schema: str, partitions: int,
                    leader: int | None = None) -> list[int]:
    async with pool.acquire() as conn:
        topic = uuid.uuid4()
        await conn.execute(f"INSERT INTO {schema}.topics (topic_id, name, created_ms) "
                           "VALUES ($1, $2, 0)", topic, f"t-{topic.hex[:8]}")
        rows = await conn.fetch(
            f"INSERT INTO {schema}.partitions (topic_id, partition, leader_node) "
            "SELECT $1, p, $3 FROM generate_series(0, $2 - 1) p RETURNING log_id",
            topic, partitions, leader)
        return sorted(int(r["log_id"]) for r in rows)


async def leaders(pool: asyncpg.Pool, schema: str) -> tuple[dict[int, Lead], dict[int, Lead]]:
    """(partitions, slots): key -> leader and epoch, as the database has them."""
    async with pool.acquire() as conn:
        parts = await conn.fetch(f"SELECT log_id, leader_node, leader_epoch "
                                 f"FROM {schema}.partitions")
        slots = await conn.fetch(f"SELECT slot, leader_node, leader_epoch "
                                 f"FROM {schema}.coordinator_slots")
    return ({int(r[0]): Lead(r[1], int(r[2])) for r in parts},
            {int(r[0]): Lead(r[1], int(r[2])) for r in slots})


class EpochWatch:
    """Reads every leader row every 20 ms and records any epoch that went
    back, or a leader that changed without a new epoch."""

    def __init__(self, pool: asyncpg.Pool, schema: str) -> None:
        self.pool, self.schema = pool, schema
        self.seen: dict[tuple[str, int], Lead] = {}
        self.violations: list[str] = []
        self.reads = 0
        self.changes = 0
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            parts, slots = await leaders(self.pool, self.schema)
            self.reads += 1
            for kind, rows in (("partition", parts), ("slot", slots)):
                for key, lead in rows.items():
                    before = self.seen.get((kind, key))
                    if before is not None and before != lead:
                        self.changes += 1
                        if lead.epoch < before.epoch:
                            self.violations.append(f"{kind} {key}: {before} -> {lead}")
                        elif lead.leader_node != before.leader_node and \
                                lead.epoch == before.epoch:
                            self.violations.append(f"{kind} {key}: leader changed at one "
                                                   f"epoch: {before} -> {lead}")
                    self.seen[(kind, key)] = lead
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task  # a failed watch raises here


async def until(check: Callable[[], Awaitable[bool]], what: str, within: float) -> float:
    """Seconds until ``check`` holds; fails after ``within`` seconds."""
    started = time.monotonic()
    while not await check():
        assert time.monotonic() - started < within, f"not within {within} s: {what}"
        await asyncio.sleep(0.02)
    return time.monotonic() - started


def balanced(nodes: list[Node], parts: dict[int, Lead], slots: dict[int, Lead]) -> bool:
    """Every row led by one of ``nodes``, counts within one, and each node
    knows exactly the rows (and epochs) the database says it leads."""
    ids = [n.membership.node_id for n in nodes]
    for rows, total in ((parts, len(parts)), (slots, COORDINATOR_SLOTS)):
        counts = Counter(lead.leader_node for lead in rows.values())
        if set(counts) != set(ids) or sum(counts.values()) != total:
            return False
        if max(counts.values()) - min(counts.values()) > 1:
            return False
    for node in nodes:
        me = node.membership.node_id
        if node.leadership.led_partitions != {k: v.epoch for k, v in parts.items()
                                              if v.leader_node == me}:
            return False
        if node.leadership.led_slots != {k: v.epoch for k, v in slots.items()
                                         if v.leader_node == me}:
            return False
    return True


def test_three_gateways_share_fail_over_and_rebalance(pg_server: PostgresServer) -> None:
    async def body(pool: asyncpg.Pool, schema: str) -> None:
        log_ids = await new_topic(pool, schema, 12)
        watch = EpochWatch(pool, schema)
        nodes = [await start_node(pool, schema, 1)]
        # Alone, the first takes everything at its first pass.
        parts, slots = await leaders(pool, schema)
        assert {lead.leader_node for lead in parts.values()} == {1}
        assert nodes[0].leadership.led_partitions == {k: 1 for k in log_ids}
        assert len(nodes[0].leadership.led_slots) == COORDINATOR_SLOTS
        nodes += [await start_node(pool, schema, 2), await start_node(pool, schema, 3)]

        async def settled() -> bool:
            return balanced(nodes, *await leaders(pool, schema))

        took = await until(settled, "three nodes balanced", within=10 * PERIOD + 10)
        print(f"three gateways balanced {took:.2f} s after the last joined")
        parts, slots = await leaders(pool, schema)
        assert sorted(Counter(v.leader_node for v in parts.values()).values()) == [4, 4, 4]
        assert sorted(Counter(v.leader_node for v in slots.values()).values()) == [16, 17, 17]
        # What each learned through on_change adds up to what it leads.
        for node in nodes:
            led: dict[int, int] = {}
            for change in node.changes:
                led.update(change.partitions_gained)
                for key in change.partitions_lost:
                    led.pop(key, None)
            assert led == node.leadership.led_partitions
        # Every gateway knows the live nodes and their listeners.
        assert [(n.node_id, n.listeners[0].port) for n in nodes[1].leadership.nodes] == [
            (1, 9001), (2, 9002), (3, 9003)]
        # Where a key's coordinator is.
        slot, lead = nodes[0].leadership.coordinator("my-group")
        assert slot == coordinator_slot("my-group") and lead == slots[slot]

        # Node 3 crashes: its rows are led by 1 and 2 within its lease plus a period.
        victim = nodes.pop()
        held = {k for k, v in parts.items() if v.leader_node == 3}
        held_slots = {k for k, v in slots.items() if v.leader_node == 3}
        assert held and held_slots
        crashed_at = time.monotonic()
        await crash_node(victim)
        failover = await until(settled, "node 3's rows led by the survivors",
                               within=3 * (LEASE + PERIOD) + 10)
        bound = LEASE + PERIOD
        print(f"failover: node 3's {len(held)} partitions and {len(held_slots)} slots were "
              f"led again {failover:.2f} s after it stopped renewing (lease {LEASE} s + "
              f"period {PERIOD:.2f} s = {bound:.2f} s)")
        # Generous: the machine is shared; the figure is in the message.
        assert failover <= bound + 2.0, f"failover took {failover:.2f} s, bound {bound:.2f} s"
        assert time.monotonic() - crashed_at >= 0.8 * LEASE - PERIOD  # not before the lease
        after, after_slots = await leaders(pool, schema)
        # Nothing but node 3's rows moved, each at a higher epoch.
        for key, lead in parts.items():
            if key in held:
                assert after[key].leader_node in (1, 2) and after[key].epoch > lead.epoch
            else:
                assert after[key] == lead
        assert all(after_slots[k].epoch > slots[k].epoch for k in held_slots)

        # A newcomer gets its share from the others.
        nodes.append(await start_node(pool, schema, 4))
        took = await until(settled, "node 4 got its share", within=10 * PERIOD + 10)
        print(f"a joining gateway had its share {took:.2f} s after it started")
        parts, slots = await leaders(pool, schema)
        assert Counter(v.leader_node for v in parts.values()) == {1: 4, 2: 4, 4: 4}

        # A clean stop gives everything up at once; the others take it at their next pass.
        leaving = nodes.pop(0)
        stopped_at = time.monotonic()
        await stop_node(leaving)
        assert leaving.leadership.led_partitions == {}
        gone = await until(settled, "node 1's rows taken after its clean stop",
                           within=3 * PERIOD + 10)
        print(f"a clean stop's rows were led again after {gone:.2f} s "
              f"(period {PERIOD:.2f} s)")
        assert time.monotonic() - stopped_at <= LEASE + 2.0  # well before its lease would end

        await watch.stop()
        assert watch.violations == [], watch.violations[:5]
        assert watch.reads > 50 and watch.changes > 0  # it really watched the moves
        for node in nodes:
            await stop_node(node)

    run(pg_server, body)


def test_two_gateways_taking_the_same_rows_each_row_has_one_winner(
        pg_server: PostgresServer) -> None:
    async def body(pool: asyncpg.Pool, schema: str) -> None:
        # Led by node 99, which never registered: orphans, which no pass touches
        # here (the gateways run no passes: only the compare-and-set races).
        log_ids = await new_topic(pool, schema, 40, leader=99)
        one = Membership(pool, schema, 1, [], lease_seconds=LEASE)
        two = Membership(pool, schema, 2, [], lease_seconds=LEASE)
        await one.start()
        await two.start()
        first, second = Leadership(one), Leadership(two)
        for round_ in range(5):
            parts, _ = await leaders(pool, schema)
            seen = {k: parts[k].epoch for k in log_ids}
            won_one, won_two = await asyncio.gather(first.take("partitions", seen),
                                                    second.take("partitions", seen))
            assert set(won_one).isdisjoint(won_two), round_
            assert set(won_one) | set(won_two) == set(log_ids), round_
            after, _ = await leaders(pool, schema)
            for key in log_ids:
                winner = 1 if key in won_one else 2
                assert after[key] == Lead(winner, seen[key] + 1)
            # Each learns what it won (rows changed behind its back by this
            # test are corrected at its next pass, which this test never runs).
            for node, won in ((first, won_one), (second, won_two)):
                assert {k: node.partition_epoch(k) for k in won} == won
            # A stale epoch wins nothing, even for a row with no live leader.
            async with pool.acquire() as conn:
                await conn.execute(f"UPDATE {schema}.partitions SET leader_node = 99")
            assert await first.take("partitions", seen) == {}
        # And a row whose leader is alive is never taken.
        parts, _ = await leaders(pool, schema)
        async with pool.acquire() as conn:
            await conn.execute(f"UPDATE {schema}.partitions SET leader_node = 2")
        assert await first.take("partitions", {k: parts[k].epoch for k in log_ids}) == {}
        # Slots the same way.
        _, slots = await leaders(pool, schema)
        seen = {k: v.epoch for k, v in slots.items()}
        won_one, won_two = await asyncio.gather(first.take("slots", seen),
                                                second.take("slots", seen))
        assert sorted([*won_one, *won_two]) == list(range(COORDINATOR_SLOTS))
        await one.stop()
        await two.stop()

    run(pg_server, body)


def test_a_lost_membership_gives_everything_up(pg_server: PostgresServer) -> None:
    async def body(pool: asyncpg.Pool, schema: str) -> None:
        log_ids = await new_topic(pool, schema, 6)
        old = await start_node(pool, schema, 7)
        assert set(old.leadership.led_partitions) == set(log_ids)
        before, _ = await leaders(pool, schema)
        # A newer process of node 7: the old one's next renewal loses the
        # membership; its leadership drops everything at once.
        new = await start_node(pool, schema, 7)
        await asyncio.wait_for(old.membership.wait_lost(), timeout=5 * LEASE)

        async def dropped() -> bool:
            return old.leadership.led_partitions == {} and old.leadership.led_slots == {}

        await until(dropped, "the superseded gateway gives up", within=PERIOD + 5)
        last = old.changes[-1]
        assert last.partitions_lost == frozenset(log_ids)
        assert len(last.slots_lost) == COORDINATOR_SLOTS
        assert await old.leadership.run_pass() == LeadershipChange()  # it acts no more
        # The newer process leads the node's rows, at epochs the old one never had.
        parts, _ = await leaders(pool, schema)
        assert new.leadership.led_partitions == {k: parts[k].epoch for k in log_ids}
        assert all(parts[k].epoch > before[k].epoch for k in log_ids)
        await old.leadership.stop()  # gives nothing up: the rows are the new one's
        assert (await leaders(pool, schema))[0] == parts
        await stop_node(new)

    run(pg_server, body)
