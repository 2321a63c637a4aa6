"""Who leads each partition and each coordinator slot, among the live gateways
(docs/cluster-design.md, "Leadership, fencing and leases").

    leadership = Leadership(membership, on_change=engine.leadership_changed)
    await leadership.start()            # a pass now, then one every lease/3
    epoch = leadership.partition_epoch(log_id)    # None: another gateway leads it
    slot, lead = leadership.coordinator("my-group")
    await leadership.stop()             # a clean stop: gives up what it leads

Every change of a leader is a compare-and-set on the row's epoch, and bumps
it (the epoch grows on every change):

    UPDATE partitions SET leader_node = $me, leader_epoch = leader_epoch + 1
     WHERE log_id = $1 AND leader_epoch = $seen

so of several gateways changing one row, exactly one wins; the others' rows
no longer match and they learn the winner at their next read. The same holds
for ``coordinator_slots``. Appends and commits are fenced by that epoch in
their own transaction (``pgstore.batch_log``); the lease only decides when a
row may be taken.

**A pass** (``run_pass``, every ``membership.renew_interval``) reads, in one
snapshot, the live nodes (lease alive by the database's clock), every
partition's and slot's leader and epoch, then computes ``plan``: the same
answer on every gateway that read the same rows. A gateway carries out only
its own part of it:

- it *takes* the rows the plan gives it whose leader is none or not live
  (the taking statement checks again, by the database's clock, that the old
  leader's lease is over and that this gateway's own lease is alive);
- it *releases* to a live node the rows the plan moves away from it, which
  happens only when counts differ by more than one: when a node joins (the
  newcomer gets its share from the others), or when deleted topics left the
  counts uneven. A dead node's rows go to the least loaded, so a death moves
  nothing else.

After a pass of every live gateway on the same view, the count of rows per
node differs by at most one (partitions and slots each). A dead gateway's
rows are led again within its lease plus one pass period of the survivors.

What a gateway leads is what the database says: the rows whose
``leader_node`` is its node id, at their epochs (a new incarnation bumped
the epochs of everything the node led, ``pgstore.membership``). When its
membership is lost, it gives up everything at once (``on_change`` reports
all of it lost) and stops; its writes are fenced anyway.

**Coordinator slots.** A group or transactional id is placed by
``coordinator_slot``: Java's ``String.hashCode`` of the id, made
non-negative as Kafka's ``Utils.abs`` does, modulo ``COORDINATOR_SLOTS``
(50). That is how Kafka picks the partition of ``__consumer_offsets`` (and
of ``__transaction_state``) for a key, so the slot number is the partition
Kafka would use. The hash is stable: fixed by Java's definition, the same
in every process and version (unlike Python's ``hash``). Groups and
transactional ids share the one set of slots.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import asyncpg

from .membership import LiveNode, Membership
from .migrate import Connection, quoted
from .schema import COORDINATOR_SLOTS

log = logging.getLogger(__name__)
_INT32 = 1 << 32


# ---------------------------------------------------------------- placement by key
def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode``: s[0]*31^(n-1) + ... + s[n-1] over UTF-16
    code units, in 32-bit two's complement."""
    h = 0
    units = text.encode("utf-16-be")
    for i in range(0, len(units), 2):
        h = (31 * h + (units[i] << 8 | units[i + 1])) % _INT32
    return h - _INT32 if h >= 1 << 31 else h


def coordinator_slot(key: str, slots: int = COORDINATOR_SLOTS) -> int:
    """The slot of a group or transactional id: Kafka's
    ``Utils.abs(key.hashCode) % slots`` (``abs`` of Integer.MIN_VALUE is 0)."""
    h = java_string_hash(key)
    return (0 if h == -(1 << 31) else abs(h)) % slots


# ---------------------------------------------------------------- the plan
@dataclass(frozen=True, slots=True)
class Lead:
    leader_node: int | None  # None: no leader
    epoch: int


@dataclass(frozen=True, slots=True)
class Move:
    key: int
    from_node: int | None  # None, a node not live (a take), or a live node (a release)
    to_node: int


def plan(live: Sequence[int], leaders: Mapping[int, int | None]) -> list[Move]:
    """The moves that balance ``leaders`` (key -> leading node) over ``live``:
    every key whose leader is not live goes to a live node; keys move
    between live nodes only while counts differ by more than one. The same
    input gives the same moves on every gateway.

    Each node's quota is len(keys) // len(live), plus one for the
    len(keys) % len(live) nodes that hold the most now (ties: lower node id),
    so the fewest keys move. Nodes over quota give up their highest keys;
    nodes under it get the orphans (lowest key first), then the keys given
    up, one at a time in node id order, round after round."""
    nodes = sorted(set(live))
    if not nodes:
        return []
    held: dict[int, list[int]] = {n: [] for n in nodes}
    orphans: list[int] = []
    for key in sorted(leaders):
        leader = leaders[key]
        if leader is not None and leader in held:
            held[leader].append(key)
        else:
            orphans.append(key)
    base, extra = divmod(len(leaders), len(nodes))
    by_load = sorted(nodes, key=lambda n: (-len(held[n]), n))
    quota = {n: base + (1 if i < extra else 0) for i, n in enumerate(by_load)}
    supply: list[tuple[int, int | None]] = [(key, leaders[key]) for key in orphans]
    for n in nodes:
        excess = len(held[n]) - quota[n]
        if excess > 0:
            supply += [(key, n) for key in held[n][-excess:]]
    # One key per node under quota in turn (not each node's whole deficit at
    # once), so that a newcomer does not get every partition of a topic
    # created at the same time.
    deficit = {n: quota[n] - len(held[n]) for n in nodes if quota[n] > len(held[n])}
    moves: list[Move] = []
    given = iter(supply)
    while deficit:
        for n in list(deficit):
            key, source = next(given)
            moves.append(Move(key, source, n))
            deficit[n] -= 1
            if not deficit[n]:
                del deficit[n]
    return moves


# ---------------------------------------------------------------- one table's rows
@dataclass(frozen=True, slots=True)
class LeadershipChange:
    """What a pass changed for this gateway: rows it leads now (at these
    epochs; also a row it kept at a new epoch) and rows it no longer leads."""

    partitions_gained: Mapping[int, int] = field(default_factory=dict)
    partitions_lost: frozenset[int] = frozenset()
    slots_gained: Mapping[int, int] = field(default_factory=dict)
    slots_lost: frozenset[int] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.partitions_gained or self.partitions_lost or self.slots_gained
                    or self.slots_lost)


class _Rows:
    """The leader rows of one table (``partitions`` by log id, or
    ``coordinator_slots`` by slot) as last read, and the statements that move them."""

    def __init__(self, schema: str, table: str, key: str, key_type: str) -> None:
        s = quoted(schema)
        self.name = table
        self.view: dict[int, Lead] = {}
        self.read_sql = f"SELECT {key} AS key, leader_node, leader_epoch FROM {s}.{table}"
        me_alive = (f"EXISTS (SELECT 1 FROM {s}.nodes me WHERE me.node_id = $1 "
                    f"AND me.incarnation = $2 AND me.lease_expires_at > now())")
        # Orphans only: no leader, or one whose lease is over by the database's clock.
        self.take_sql = f"""
            UPDATE {s}.{table} t SET leader_node = $1, leader_epoch = t.leader_epoch + 1
              FROM unnest($3::{key_type}[], $4::integer[]) AS c(key, seen)
             WHERE t.{key} = c.key AND t.leader_epoch = c.seen AND {me_alive}
               AND (t.leader_node IS NULL OR NOT EXISTS (
                    SELECT 1 FROM {s}.nodes n
                     WHERE n.node_id = t.leader_node AND n.lease_expires_at > now()))
            RETURNING t.{key} AS key, t.leader_node, t.leader_epoch"""
        # To a live node, from this one.
        self.release_sql = f"""
            UPDATE {s}.{table} t SET leader_node = c.target,
                   leader_epoch = t.leader_epoch + 1
              FROM unnest($3::{key_type}[], $4::integer[], $5::integer[]) AS c(key, seen, target)
             WHERE t.{key} = c.key AND t.leader_epoch = c.seen AND t.leader_node = $1
               AND {me_alive}
               AND EXISTS (SELECT 1 FROM {s}.nodes n
                            WHERE n.node_id = c.target AND n.lease_expires_at > now())
            RETURNING t.{key} AS key, t.leader_node, t.leader_epoch"""
        # A clean stop: everything this incarnation leads goes back to no leader.
        self.give_up_sql = f"""
            UPDATE {s}.{table} t SET leader_node = NULL, leader_epoch = t.leader_epoch + 1
             WHERE t.leader_node = $1 AND EXISTS (
                   SELECT 1 FROM {s}.nodes me WHERE me.node_id = $1 AND me.incarnation = $2)
            RETURNING t.{key} AS key, t.leader_node, t.leader_epoch"""

    def load(self, rows: Sequence[asyncpg.Record]) -> None:
        self.view = {int(r["key"]): _lead(r) for r in rows}

    def apply(self, rows: Sequence[asyncpg.Record]) -> None:
        for r in rows:
            self.view[int(r["key"])] = _lead(r)

    def led_by(self, node_id: int) -> dict[int, int]:
        return {key: lead.epoch for key, lead in self.view.items()
                if lead.leader_node == node_id}


def _lead(row: asyncpg.Record) -> Lead:
    node = row["leader_node"]
    return Lead(None if node is None else int(node), int(row["leader_epoch"]))


def _diff(before: Mapping[int, int], after: Mapping[int, int]
          ) -> tuple[dict[int, int], frozenset[int]]:
    gained = {key: epoch for key, epoch in after.items() if before.get(key) != epoch}
    return gained, frozenset(key for key in before if key not in after)


# ---------------------------------------------------------------- the gateway's part
class Leadership:
    """This gateway's share of the partitions and coordinator slots (see the
    module's docstring). ``on_change`` is called after each pass that changed
    what it leads, and once with everything lost when the membership is lost;
    a row given up or taken away makes that row's writes fail as fenced
    (map them to NOT_LEADER_OR_FOLLOWER / NOT_COORDINATOR)."""

    def __init__(self, membership: Membership,
                 on_change: Callable[[LeadershipChange], None] | None = None,
                 lock_timeout: float | None = None) -> None:
        self.membership = membership
        self.pool = membership.pool
        self.node_id = membership.node_id
        self.on_change = on_change
        # A row locked by a paused leader's transaction must not hold a pass
        # up: the statement gives up and the next pass tries again.
        self.lock_timeout = membership.renew_interval if lock_timeout is None else lock_timeout
        self._partitions = _Rows(membership.schema, "partitions", "log_id", "bigint")
        self._slots = _Rows(membership.schema, "coordinator_slots", "slot", "integer")
        # As of the last pass: the live nodes (with their listeners, for
        # Metadata and FindCoordinator) and their ids.
        self.nodes: tuple[LiveNode, ...] = ()
        self.live: tuple[int, ...] = ()
        self._led_partitions: dict[int, int] = {}
        self._led_slots: dict[int, int] = {}
        self._task: asyncio.Task[None] | None = None
        self._passing = asyncio.Lock()
        self._gone = False  # gave up for good (lost or stopped)

    # ------------------------------------------------------------ what this gateway leads
    @property
    def led_partitions(self) -> dict[int, int]:
        """log id -> leader epoch, for the partitions this gateway leads."""
        return dict(self._led_partitions)

    @property
    def led_slots(self) -> dict[int, int]:
        """slot -> epoch, for the coordinator slots this gateway leads."""
        return dict(self._led_slots)

    def partition_epoch(self, log_id: int) -> int | None:
        """The epoch this gateway leads ``log_id`` at (None: it does not)."""
        return self._led_partitions.get(log_id)

    def slot_epoch(self, slot: int) -> int | None:
        return self._led_slots.get(slot)

    # ------------------------------------------------------------ the cluster's view
    def partition_leader(self, log_id: int) -> Lead | None:
        """The partition's leader and epoch as of the last pass (None: unknown row)."""
        return self._partitions.view.get(log_id)

    def coordinator(self, key: str) -> tuple[int, Lead | None]:
        """The slot of a group or transactional id, and its leader as of the last pass."""
        slot = coordinator_slot(key)
        return slot, self._slots.view.get(slot)

    @property
    def partition_leaders(self) -> dict[int, Lead]:
        return dict(self._partitions.view)

    @property
    def slot_leaders(self) -> dict[int, Lead]:
        return dict(self._slots.view)

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """A first pass now, then one every renewal period until stopped or lost."""
        if self._task is not None or self._gone:
            raise RuntimeError(f"node {self.node_id}: leadership starts once")
        await self.run_pass()
        self._task = asyncio.create_task(self._loop(), name=f"leadership of node {self.node_id}")

    async def stop(self, give_up: bool = True) -> None:
        """Stop the passes; with ``give_up`` (a clean stop) every row this
        incarnation leads goes back to no leader (epoch bumped), so the others
        take it at their next pass instead of after the lease."""
        await self._cancel()
        async with self._passing:
            if give_up and not self._gone and self.membership.lost is None:
                inc = self.membership.incarnation
                async with self.pool.acquire() as conn:
                    for rows in (self._partitions, self._slots):
                        rows.apply(await conn.fetch(rows.give_up_sql, self.node_id, inc))
            self._drop_all()

    async def _cancel(self) -> None:
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _loop(self) -> None:
        lost = asyncio.ensure_future(self.membership.wait_lost())
        try:
            while True:
                done, _ = await asyncio.wait({lost}, timeout=self.membership.renew_interval)
                if done:
                    async with self._passing:
                        self._drop_all()
                    return
                try:
                    await self.run_pass()
                except Exception as exc:
                    # The loop must outlive a failed pass (a lost connection,
                    # asyncpg's state clash after a terminated backend): what
                    # the gateway leads is only ever what the database says,
                    # and the next pass reads it again.
                    log.warning("node %d: leadership pass failed (%r); next in %.2f s",
                                self.node_id, exc, self.membership.renew_interval)
        finally:
            lost.cancel()

    def _drop_all(self) -> None:
        """Lead nothing from now on, and say so."""
        self._gone = True
        change = LeadershipChange(partitions_lost=frozenset(self._led_partitions),
                                  slots_lost=frozenset(self._led_slots))
        self._led_partitions, self._led_slots = {}, {}
        if change and self.on_change is not None:
            self.on_change(change)

    async def take(self, table: Literal["partitions", "slots"],
                   seen: Mapping[int, int]) -> dict[int, int]:
        """Take the rows of ``seen`` (key -> the epoch the caller read) that are
        still at that epoch and have no live leader: the compare-and-set a
        pass makes for its orphans. The rows won, at their new epochs; of
        several gateways taking one row, exactly one wins it."""
        rows = self._partitions if table == "partitions" else self._slots
        keys = sorted(seen)
        async with self._passing, self.pool.acquire() as conn:
            if self._gone or not self.membership.active:
                return {}
            won = await self._cas(conn, rows, rows.take_sql, self.node_id,
                                  self.membership.incarnation, keys, [seen[k] for k in keys])
            self.nodes = tuple(await self.membership.live_nodes(conn))
            self.live = tuple(n.node_id for n in self.nodes)
            self._learn()
        return {int(r["key"]): int(r["leader_epoch"]) for r in won}

    # ------------------------------------------------------------ a pass
    async def run_pass(self) -> LeadershipChange:
        """Read the cluster, carry out this gateway's part of the plan, learn
        what it leads; what changed (also given to ``on_change``)."""
        async with self._passing:
            if self._gone or not self.membership.active:
                return LeadershipChange()
            me, inc = self.node_id, self.membership.incarnation
            async with self.pool.acquire() as conn:
                async with conn.transaction(isolation="repeatable_read", readonly=True):
                    nodes = tuple(await self.membership.live_nodes(conn))
                    for rows in (self._partitions, self._slots):
                        rows.load(await conn.fetch(rows.read_sql))
                live = tuple(n.node_id for n in nodes)
                self.nodes, self.live = nodes, live
                if me in live:  # else this gateway's own lease is over: it moves nothing
                    for rows in (self._partitions, self._slots):
                        await self._carry_out(conn, rows, live, me, inc)
            return self._learn()

    def _learn(self) -> LeadershipChange:
        """What this gateway leads, from the rows as last read or changed
        (nothing while its own lease is over); tells ``on_change``."""
        me = self.node_id
        partitions = self._partitions.led_by(me) if me in self.live else {}
        slots = self._slots.led_by(me) if me in self.live else {}
        p_gained, p_lost = _diff(self._led_partitions, partitions)
        s_gained, s_lost = _diff(self._led_slots, slots)
        self._led_partitions, self._led_slots = partitions, slots
        change = LeadershipChange(p_gained, p_lost, s_gained, s_lost)
        if change and self.on_change is not None:
            self.on_change(change)
        return change

    async def _carry_out(self, conn: Connection, rows: _Rows, live: Sequence[int],
                         me: int, inc: int) -> None:
        moves = plan(live, {key: lead.leader_node for key, lead in rows.view.items()})
        takes = [m for m in moves if m.to_node == me and m.from_node not in live]
        gives = [m for m in moves if m.from_node == me]
        if takes:
            await self._cas(conn, rows, rows.take_sql, me, inc,
                            [m.key for m in takes],
                            [rows.view[m.key].epoch for m in takes])
        if gives:
            await self._cas(conn, rows, rows.release_sql, me, inc,
                            [m.key for m in gives],
                            [rows.view[m.key].epoch for m in gives],
                            [m.to_node for m in gives])

    async def _cas(self, conn: Connection, rows: _Rows, sql: str, me: int, inc: int,
                   *arrays: list[int]) -> list[asyncpg.Record]:
        try:
            async with conn.transaction():
                await conn.execute(
                    f"SET LOCAL lock_timeout = '{max(1, int(self.lock_timeout * 1000))}ms'")
                changed = await conn.fetch(sql, me, inc, *arrays)
        except asyncpg.LockNotAvailableError:
            log.info("node %d: %s rows locked by another transaction; next pass",
                     self.node_id, rows.name)
            return []
        rows.apply(changed)
        return changed
