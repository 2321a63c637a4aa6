"""The PostgreSQL engine in a cluster of gateways (``PgCluster``, held by
``PgNodeStorage`` once it joins): membership, leadership, the topic catalog
kept current, and the routing view the protocol layer reads (the seam's
``ClusterView``). docs/cluster.md says how to run it.

    cluster = PgCluster(storage, ClusterSettings(node_id=1, lease_seconds=9))
    await cluster.join([Listener("PLAINTEXT", "gw1", 9092)])
    ...
    await cluster.leave()       # a clean stop: gives up its rows, deregisters

This module owns the lifecycle (join, leave, rejoin), the reactions to a
``LeadershipChange`` and the topic catalog's rereads; the routing answers
are ``pgstore.cluster_view``'s (``PgCluster`` is that view), the opening of
what is gained ``pgstore.cluster_opening``'s and the topic notices
``pgstore.topic_notices``'s.

- **Joining** registers the gateway (``pgstore.membership``: node.id, its
  advertised listeners, a lease renewed every lease/3) and starts its
  ``pgstore.leadership`` passes. The catalog was loaded without claiming
  anything: every partition's log starts *closed* (``fenced``: appends
  answer NOT_LEADER_OR_FOLLOWER, reads are refused by ``leads``).
- **A partition gained** at an epoch is *opened*, **a partition lost**
  closed at once (``pgstore.cluster_opening``).
- **A coordinator slot gained** has its groups and transactional ids read
  again before ``coordinates`` says yes for its keys
  (``pgstore.cluster_opening``). **A slot lost** is forgotten at once, and
  the watchers (``watch_coordination``: the group coordinator) drop what
  they keep in memory for its keys, so gaining it back starts from storage.
- **Commits other gateways publish into partitions led here** reach their
  logs at once (``pgstore.log_catch_up``: LISTEN on ``<schema>_log``, and a
  resync of the led partitions' ends after every reconnection).
- **Topics made by any gateway are seen by all**: a topic change notifies
  the channel ``<schema>_topics`` inside its own transaction
  (``pgstore.topic_notices``); each gateway listens and rereads the catalog
  (``PgTopicCatalog.refresh``) and runs a pass (so it opens at once the new
  partitions it leads), also after its listening connection was lost, and
  when a pass hands it a partition of a topic it does not know yet.
- **New partitions have leaders from the start**, as Kafka's controller
  gives them: the gateway that makes them writes each row with a leader,
  the least loaded live node as of its last pass (``place_new``; ties: the
  lower node id), so Metadata names a leader as soon as the create is
  answered; the plan then moves none of them (counts stay within one).
- **Membership lost**: everything is closed at once. A lease that ran out
  (the process was paused or cut off) makes the gateway join again as a new
  incarnation; a newer process of the same node.id (``Superseded``) wins,
  and this one stays out (it leads nothing; a misconfiguration to fix).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import asyncpg

from .cluster_opening import Opening, close, logs_by_id
from .cluster_view import PgClusterView
from .consumer_offsets import PgConsumerOffsets
from .leadership import Leadership, LeadershipChange
from .log_catch_up import LogCatchUp
from .membership import (
    DEFAULT_LEASE_SECONDS,
    Listener,
    Membership,
    MembershipLost,
    Superseded,
)
from .membership import session_settings as session_settings
from .migrate import quoted
from .placement import coordinator_slot
from .topic_notices import TopicNotices

if TYPE_CHECKING:
    from .topics import PgTopicCatalog
    from .txn_storage import PgTransactionStorage

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    node_id: int = 0
    # broker.session.timeout.ms: a gateway that stops renewing is replaced
    # as leader within this, plus one pass period (lease/3).
    lease_seconds: float = DEFAULT_LEASE_SECONDS


class PgCluster(PgClusterView):
    """This gateway's part in the cluster (see the module's docstring)."""

    def __init__(self, dsn: str, schema: str, catalog: PgTopicCatalog,
                 settings: ClusterSettings, offsets: object | None = None,
                 txns: PgTransactionStorage | None = None) -> None:
        super().__init__(catalog, settings.node_id)
        self.dsn = dsn
        self.schema = schema
        self.settings = settings
        if isinstance(offsets, PgConsumerOffsets):
            offsets.slot_holder = self.slot_held  # its writes' coordinator fence
        self._txns = txns  # the transaction coordinator's storage (load_ids), or None
        if txns is not None:
            txns.slot_holder = self.slot_held  # its writes' coordinator fence
        self._pool: asyncpg.Pool | None = None  # opening logs, rereading topics and groups
        self._opening = Opening(self, lambda: self._pool, schema, offsets, txns)
        # The lease's renewals and the passes have their own connections, so
        # a burst of opening never makes a renewal wait past the lease.
        self._lease_pool: asyncpg.Pool | None = None
        self.membership: Membership | None = None
        self._listeners: tuple[Listener, ...] = ()
        self._notices: TopicNotices | None = None
        # Commits other gateways published into partitions led here.
        self.log_catch_up: LogCatchUp | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._refresh: asyncio.Task[None] | None = None
        self._refresh_again = False
        self._rereading = asyncio.Lock()
        self._leaving = False
        self.rejoins = 0
        catalog.place = self.place_new

    @property
    def opened(self) -> int:
        """Partitions opened so far (statistics, tests)."""
        return self._opening.opened

    # ------------------------------------------------------------ lifecycle
    async def join(self, listeners: Sequence[Listener]) -> None:
        self._listeners = tuple(listeners)
        settings = session_settings(self.settings.lease_seconds)
        self._lease_pool = await asyncpg.create_pool(self.dsn, min_size=2, max_size=2,
                                                     server_settings=settings)
        self._pool = await asyncpg.create_pool(self.dsn, min_size=1, max_size=2,
                                               server_settings=settings)
        self._notices = TopicNotices(self.dsn, self.schema, self.topics_changed,
                                     self._resync_topics)
        await self._notices.start()
        self.log_catch_up = LogCatchUp(self.dsn, self.schema, self.node_id, self.catalog,
                                       lambda: self._pool)
        await self.log_catch_up.start()
        await self._register()

    async def _register(self) -> None:
        assert self._lease_pool is not None
        membership = Membership(self._lease_pool, self.schema, self.node_id, self._listeners,
                                self.settings.lease_seconds, on_lost=self._lost)
        await membership.start()
        leadership = Leadership(membership, on_change=self._changed)
        self.membership, self.leadership = membership, leadership
        await leadership.start()
        # The first pass's partitions and slots are opened before the gateway
        # says it is ready (a restarted gateway leads at once what it led,
        # rather than answering NOT_LEADER_OR_FOLLOWER until its opens land).
        opening = [task for task in self._tasks if task.get_name().startswith("open ")]
        await asyncio.gather(*opening, return_exceptions=True)
        log.info("node %d joined the cluster (incarnation %d, lease %.1f s): leads %d "
                 "partitions, %d coordinator slots", self.node_id, membership.incarnation,
                 self.settings.lease_seconds, len(leadership.led_partitions),
                 len(leadership.led_slots))

    async def leave(self) -> None:
        """A clean stop: every row given up (the others take it at their next
        pass), the node deregistered."""
        self._leaving = True
        if self.leadership is not None:
            with contextlib.suppress(Exception):
                await self.leadership.stop(give_up=True)
        if self.membership is not None:
            with contextlib.suppress(Exception):
                await self.membership.stop()
        for task in list(self._tasks):
            task.cancel()
        if self._notices is not None:
            await self._notices.close()
        if self.log_catch_up is not None:
            await self.log_catch_up.close()
        for pool in (self._pool, self._lease_pool):
            if pool is not None:
                await pool.close()

    async def lead_new(self) -> None:
        """A pass now, and the partitions it gains opened (a topic was just
        made here: its partitions need leaders, and this gateway's share is
        writable when the create is answered). A failure is left to the
        next periodic pass."""
        if self.leadership is None or self._leaving:
            return
        try:
            await self.leadership.run_pass()
        except Exception as exc:
            log.warning("node %d: pass after a topic change failed: %r", self.node_id, exc)
            return
        opening = [t for t in self._tasks if t.get_name() == "open partitions"]
        if opening:
            await asyncio.wait(opening)

    async def place_new(self, count: int) -> list[int] | None:
        """Leaders for ``count`` new partitions: each to the live node leading
        the fewest partitions, counted in the database now (a view as of the
        last pass would still count deleted topics, and the plan would then
        move the new partitions at once). None: not joined, the passes place
        them."""
        if self.leadership is None or self._pool is None or self._leaving:
            return None
        s = quoted(self.schema)
        async with self._pool.acquire() as conn:
            rows = await conn.fetch(f"""
                SELECT n.node_id, count(p.log_id) AS led FROM {s}.nodes n
                  LEFT JOIN {s}.partitions p ON p.leader_node = n.node_id
                 WHERE n.lease_expires_at > now() GROUP BY n.node_id""")
        load = {int(r["node_id"]): int(r["led"]) for r in rows}
        if not load:
            return None
        leaders = []
        for _ in range(count):
            node = min(load, key=lambda n: (load[n], n))
            load[node] += 1
            leaders.append(node)
        return leaders

    def _lost(self, lost: MembershipLost) -> None:
        if isinstance(lost, Superseded):
            log.error("node %d: a newer process of this node.id registered (%s): this one "
                      "leads nothing from now on", self.node_id, lost)
            return
        log.error("node %d lost its membership (%s): it leads nothing now and joins again",
                  self.node_id, lost)
        if not self._leaving:
            self._spawn(self._rejoin(), "rejoin")

    async def _rejoin(self) -> None:
        old = self.leadership
        if old is not None:
            await old.stop(give_up=False)  # drops everything (on_change) if not done yet
        while not self._leaving:
            try:
                self.rejoins += 1
                await self._register()
                return
            except Exception as exc:
                log.warning("node %d: joining again failed (%r); retrying", self.node_id, exc)
                await asyncio.sleep(self.settings.lease_seconds / 3)

    def _spawn(self, work: Coroutine[object, object, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.warning("node %d: %s failed: %r", self.node_id, task.get_name(), exc)

    # ------------------------------------------------------------ leadership changes
    def _changed(self, change: LeadershipChange) -> None:
        by_id = logs_by_id(self.catalog)
        for log_id in change.partitions_lost:
            found = by_id.get(log_id)
            if found is not None:
                close(found)
        for slot in change.slots_lost:
            self.open_slots.discard(slot)
        if change.slots_lost:
            lost = frozenset(change.slots_lost)
            for watcher in self.lost_watchers:
                watcher(lambda key: coordinator_slot(key) in lost)
        if change.partitions_gained:
            self._spawn(self._opening.partitions(dict(change.partitions_gained)),
                        "open partitions")
        if change.slots_gained:
            self._spawn(self._opening.slots(set(change.slots_gained)), "open slots")

    def current(self) -> bool:
        """This process is the node's live incarnation, as last read (another
        process of the same node.id would lead the same rows)."""
        lead, member = self.leadership, self.membership
        return (lead is not None and member is not None and member.active
                and any(n.node_id == self.node_id and n.incarnation == member.incarnation
                        for n in lead.nodes))

    async def reload_coordinated(self, keep: Callable[[str], bool]) -> None:
        if self._txns is None or self._pool is None:
            return
        async with self._pool.acquire() as conn:
            await self._txns.load_ids(conn, keep)

    # ------------------------------------------------------------ topics
    def topics_changed(self) -> None:
        """A topic notice: reread the catalog (one reread at a time; a notice
        during one makes another follow)."""
        if self._refresh is not None and not self._refresh.done():
            self._refresh_again = True
            return
        self._refresh = asyncio.get_running_loop().create_task(self._refresh_loop(),
                                                               name="topic refresh")

    async def _refresh_loop(self) -> None:
        while True:
            self._refresh_again = False
            try:
                await self.refresh_topics()
            except Exception as exc:
                log.warning("node %d: topic catalog reread failed: %r", self.node_id, exc)
            else:
                # The new partitions it leads, opened now; in a task of its
                # own, so the next reread never waits for a pass.
                self._spawn(self.lead_new(), "pass after topics")
            if not self._refresh_again:
                return

    async def _resync_topics(self) -> None:
        if self._pool is not None and self.leadership is not None:
            await self.refresh_topics()

    async def refresh_topics(self) -> None:
        assert self._pool is not None
        # One reread at a time: an older snapshot applied after a newer one
        # would take configs back.
        async with self._rereading, self._pool.acquire() as conn:
            await self.catalog.refresh(conn)
        if self.leadership is not None:  # partitions led here whose log was not known yet
            by_id = logs_by_id(self.catalog)
            missing = {log_id: epoch for log_id, epoch in self.leadership.led_partitions.items()
                       if log_id in by_id and by_id[log_id].fenced}
            if missing:
                self._spawn(self._opening.partitions(missing), "open partitions")

    async def catch_up_topics(self) -> None:
        await self.refresh_topics()

