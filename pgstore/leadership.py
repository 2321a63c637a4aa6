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

This module owns the passes and what this gateway leads. The placement is
computed without I/O in ``pgstore.placement`` (``coordinator_slot``:
Kafka's placement of a group or transactional id in one of the 50
coordinator slots; ``plan``); the rows as read and the statements that move
them are ``pgstore.leader_rows``. The names of both stay importable from
here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import asyncpg

from .leader_rows import Lead as Lead
from .leader_rows import LeaderRows
from .membership import LiveNode, Membership
from .migrate import Connection
from .placement import coordinator_slot as coordinator_slot
from .placement import java_string_hash as java_string_hash
from .placement import plan as plan

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- what changed
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
        self._partitions = LeaderRows(membership.schema, "partitions", "log_id", "bigint")
        self._slots = LeaderRows(membership.schema, "coordinator_slots", "slot", "integer")
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

    async def _carry_out(self, conn: Connection, rows: LeaderRows, live: Sequence[int],
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

    async def _cas(self, conn: Connection, rows: LeaderRows, sql: str, me: int, inc: int,
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
