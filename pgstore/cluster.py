"""The PostgreSQL engine in a cluster of gateways (``PgCluster``, held by
``PgNodeStorage`` once it joins): membership, leadership, the topic catalog
kept current, and the routing view the protocol layer reads (the seam's
``ClusterView``). docs/cluster.md says how to run it.

    cluster = PgCluster(storage, ClusterSettings(node_id=1, lease_seconds=9))
    await cluster.join([Listener("PLAINTEXT", "gw1", 9092)])
    ...
    await cluster.leave()       # a clean stop: gives up its rows, deregisters

- **Joining** registers the gateway (``pgstore.membership``: node.id, its
  advertised listeners, a lease renewed every lease/3) and starts its
  ``pgstore.leadership`` passes. The catalog was loaded without claiming
  anything: every partition's log starts *closed* (``fenced``: appends
  answer NOT_LEADER_OR_FOLLOWER, reads are refused by ``leads``).
- **A partition gained** at an epoch is *opened*: its row and producers are
  read again (another gateway may have written since), the log takes that
  epoch and is unfenced. A partition *lost* is closed at once: its tail is
  dropped, its long-polls woken, its appends fenced (and in PostgreSQL the
  epoch already moved, so nothing of a write in flight lands).
- **A coordinator slot gained** has the committed offsets and generations
  of its groups read again (``load_group``) before ``coordinates`` says yes
  for its keys. **A slot lost** is forgotten at once, and the watchers
  (``watch_coordination``: the group coordinator) drop what they keep in
  memory for its keys, so gaining it back starts from storage. The offsets'
  writes are fenced by the slot's epoch (``PgConsumerOffsets.slot_holder``).
  The transactional ids of a slot gained are read again too
  (``PgTransactionStorage.load_ids``) and handed to the watchers' ``gained``
  (the transaction coordinator) before ``coordinates`` says yes; the
  coordinator's writes are fenced by the slot's epoch (``pgstore.txn_slots``).
- **Commits other gateways publish into partitions led here** reach their
  logs at once (``pgstore.log_catch_up``: LISTEN on ``<schema>_log``, and a
  resync of the led partitions' ends after every reconnection).
- **Topics made by any gateway are seen by all**: a topic change notifies
  the channel ``<schema>_topics`` inside its own transaction; each gateway
  listens and rereads the catalog (``PgTopicCatalog.refresh``) and runs a
  pass (so it opens at once the new partitions it leads), also after its
  listening connection was lost, and when a pass hands it a partition of a
  topic it does not know yet.
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
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import asyncpg

from tablets.in_memory_batches import InMemoryBatches
from tablets.seam import BrokerAddress, ClusterNode

from .consumer_offsets import PgConsumerOffsets
from .leadership import Leadership, LeadershipChange, coordinator_slot
from .log_catch_up import LogCatchUp
from .log_notices import LogNotices
from .log_sql import load_row
from .membership import (
    DEFAULT_LEASE_SECONDS,
    Listener,
    Membership,
    MembershipLost,
    Superseded,
)
from .membership import session_settings as session_settings
from .migrate import quoted
from .producer_rows import PgProducerRows

if TYPE_CHECKING:
    from .partition_log import PgPartitionLog
    from .topics import PgTopicCatalog
    from .txn_storage import PgTransactionStorage
    from .writer import PgChange

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    node_id: int = 0
    # broker.session.timeout.ms: a gateway that stops renewing is replaced
    # as leader within this, plus one pass period (lease/3).
    lease_seconds: float = DEFAULT_LEASE_SECONDS


def topics_channel(schema: str) -> str:
    return f"{schema}_topics"


def announce_topics(change: PgChange, schema: str, name: str) -> None:
    """Tell every gateway, once ``change`` commits, that topic ``name`` changed."""
    change.execute("SELECT pg_notify($1, $2)", topics_channel(schema), name)


class TopicNotices(LogNotices):
    """One connection listening on the topics' channel; any notice (and every
    reconnection) makes the gateway reread its catalog."""

    def __init__(self, dsn: str, schema: str, on_topics: Callable[[], None],
                 on_resync: Callable[[], Awaitable[None]]) -> None:
        super().__init__(dsn, schema, lambda _notice: None, on_resync)
        self.channel = topics_channel(schema)
        self._on_topics = on_topics

    def _notice(self, _conn: object, _pid: int, _channel: str, payload: object, /) -> None:
        self.notices += 1
        self._on_topics()


class PgCluster:
    """This gateway's part in the cluster (see the module's docstring)."""

    def __init__(self, dsn: str, schema: str, catalog: PgTopicCatalog,
                 settings: ClusterSettings, offsets: object | None = None,
                 txns: PgTransactionStorage | None = None) -> None:
        self.dsn = dsn
        self.schema = schema
        self.catalog = catalog
        self.settings = settings
        self.node_id = settings.node_id
        self._offsets = offsets  # PgConsumerOffsets (load_group), or None
        if isinstance(offsets, PgConsumerOffsets):
            offsets.slot_holder = self.slot_held  # its writes' coordinator fence
        self._watchers: list[Callable[[Callable[[str], bool]], None]] = []
        self._txns = txns  # the transaction coordinator's storage (load_ids), or None
        if txns is not None:
            txns.slot_holder = self.slot_held  # its writes' coordinator fence
        self._gained: list[Callable[[Callable[[str], bool]], None]] = []
        self._pool: asyncpg.Pool | None = None  # opening logs, rereading topics and groups
        # The lease's renewals and the passes have their own connections, so
        # a burst of opening never makes a renewal wait past the lease.
        self._lease_pool: asyncpg.Pool | None = None
        self.membership: Membership | None = None
        self.leadership: Leadership | None = None
        self._listeners: tuple[Listener, ...] = ()
        self._notices: TopicNotices | None = None
        # Commits other gateways published into partitions led here.
        self.log_catch_up: LogCatchUp | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._open_slots: set[int] = set()  # gained and loaded
        self._refresh: asyncio.Task[None] | None = None
        self._refresh_again = False
        self._rereading = asyncio.Lock()
        self._leaving = False
        self.opened = 0  # partitions opened so far (statistics, tests)
        self.rejoins = 0
        catalog.place = self.place_new

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
        by_id = self._logs_by_id()
        for log_id in change.partitions_lost:
            found = by_id.get(log_id)
            if found is not None:
                close(found)
        for slot in change.slots_lost:
            self._open_slots.discard(slot)
        if change.slots_lost:
            lost = frozenset(change.slots_lost)
            for watcher in self._watchers:
                watcher(lambda key: coordinator_slot(key) in lost)
        if change.partitions_gained:
            self._spawn(self._open_all(dict(change.partitions_gained)), "open partitions")
        if change.slots_gained:
            self._spawn(self._open_slots_of(set(change.slots_gained)), "open slots")

    def _logs_by_id(self) -> dict[int, PgPartitionLog]:
        return {p.log_id: p for p in self.catalog.logs()}

    def _current(self) -> bool:
        """This process is the node's live incarnation, as last read (another
        process of the same node.id would lead the same rows)."""
        lead, member = self.leadership, self.membership
        return (lead is not None and member is not None and member.active
                and any(n.node_id == self.node_id and n.incarnation == member.incarnation
                        for n in lead.nodes))

    async def _open_all(self, gained: dict[int, int]) -> None:
        assert self._pool is not None
        if not self._current():
            return
        by_id = self._logs_by_id()
        if any(log_id not in by_id for log_id in gained):
            await self.refresh_topics()  # a topic another gateway made
            by_id = self._logs_by_id()
        sql = self.catalog.context.sql
        async with self._pool.acquire() as conn:
            for log_id, epoch in sorted(gained.items()):
                partition = by_id.get(log_id)
                if partition is None or partition.deleted:
                    continue
                row = await load_row(conn, sql, log_id, partition.mean_batch_bytes)
                producers = await PgProducerRows.fetch(conn, sql, log_id)
                if (row is None or row.leader_epoch != epoch or not self._current()
                        or self.leadership is None
                        or self.leadership.partition_epoch(log_id) != epoch):
                    continue  # moved again meanwhile: the next change says so
                partition.leader_epoch = epoch
                partition.reset_from(row)
                partition.producer_rows.loaded = producers.loaded
                partition.producer_states.load()
                partition.fenced = False
                partition.catch_up()  # a commit noticed after the row was read
                self.opened += 1
        log.info("node %d opened %d partitions", self.node_id, len(gained))

    async def reload_coordinated(self, keep: Callable[[str], bool]) -> None:
        if self._txns is None or self._pool is None:
            return
        async with self._pool.acquire() as conn:
            await self._txns.load_ids(conn, keep)

    async def _open_slots_of(self, slots: set[int]) -> None:
        """Reread the committed offsets of the slots' groups and the slots'
        transactional ids (another coordinator may have written them), then
        coordinate them."""
        assert self._pool is not None
        load_group = getattr(self._offsets, "load_group", None)
        in_slots: Callable[[str], bool] = lambda key: coordinator_slot(key) in slots  # noqa: E731
        if self._txns is not None:
            async with self._pool.acquire() as conn:
                await self._txns.load_ids(conn, in_slots)
        if load_group is not None:
            async with self._pool.acquire() as conn:
                s = quoted(self.schema)
                groups = await conn.fetch(
                    f"SELECT group_id FROM {s}.consumer_offsets UNION "
                    f"SELECT group_id FROM {s}.group_generations")
                for row in groups:
                    if coordinator_slot(row["group_id"]) in slots:
                        await load_group(conn, row["group_id"])
        lead = self.leadership
        if lead is not None and self._current():
            opened = {s for s in slots if lead.slot_epoch(s) is not None}
            for gained in self._gained:  # in the same step as the slots open
                gained(lambda key: coordinator_slot(key) in opened)
            self._open_slots |= opened

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
            by_id = self._logs_by_id()
            missing = {log_id: epoch for log_id, epoch in self.leadership.led_partitions.items()
                       if log_id in by_id and by_id[log_id].fenced}
            if missing:
                self._spawn(self._open_all(missing), "open partitions")

    # ------------------------------------------------------------ the seam's ClusterView
    def brokers(self, listener: str) -> list[BrokerAddress]:
        lead = self.leadership
        if lead is None:
            return []
        out = []
        for node in lead.nodes:
            if not node.listeners:
                continue
            chosen = next((x for x in node.listeners if x.name == listener), node.listeners[0])
            out.append(BrokerAddress(node.node_id, chosen.host, chosen.port))
        return out

    def nodes(self, listener: str) -> list[ClusterNode]:
        lead = self.leadership
        if lead is None:
            return []
        partitions = Counter(x.leader_node for x in lead.partition_leaders.values())
        slots = Counter(x.leader_node for x in lead.slot_leaders.values())
        expiry = {node.node_id: node.lease_expires_at.timestamp() for node in lead.nodes}
        return [ClusterNode(address, expiry[address.node_id], partitions[address.node_id],
                            slots[address.node_id]) for address in self.brokers(listener)]

    def partition_leader(self, topic: str, index: int) -> int | None:
        lead = self.leadership
        if lead is None:
            return None
        found = lead.partition_leader(self.catalog.partition(topic, index).log_id)
        if found is None or found.leader_node is None or found.leader_node not in lead.live:
            return None
        return found.leader_node

    def leader_epoch(self, topic: str, index: int) -> int:
        partition = self.catalog.partition(topic, index)
        if not partition.fenced and not partition.deleted:
            return partition.leader_epoch
        lead = self.leadership
        found = None if lead is None else lead.partition_leader(partition.log_id)
        return -1 if found is None or found.leader_node is None else found.epoch

    def leads(self, topic: str, index: int) -> bool:
        partition = self.catalog.partition(topic, index)
        return not partition.fenced and not partition.deleted

    def coordinator(self, key: str) -> int | None:
        lead = self.leadership
        if lead is None:
            return None
        _, found = lead.coordinator(key)
        if found is None or found.leader_node is None or found.leader_node not in lead.live:
            return None
        return found.leader_node

    async def catch_up_topics(self) -> None:
        await self.refresh_topics()

    def coordinates(self, key: str) -> bool:
        return self.slot_held(key) is not None

    def slot_held(self, key: str) -> tuple[int, int, int] | None:
        """(slot, node id, epoch) of the key's slot when this gateway
        coordinates it (gained and loaded), else None: the coordinator's
        fence (``PgConsumerOffsets.fence_coordinator``)."""
        lead = self.leadership
        slot = coordinator_slot(key)
        if lead is None or slot not in self._open_slots:
            return None
        epoch = lead.slot_epoch(slot)
        return None if epoch is None else (slot, self.node_id, epoch)

    def watch_coordination(self, lost: Callable[[Callable[[str], bool]], None],
                           gained: Callable[[Callable[[str], bool]], None] | None = None,
                           ) -> None:
        self._watchers.append(lost)
        if gained is not None:
            self._gained.append(gained)


def close(partition: PgPartitionLog) -> None:
    """This gateway no longer leads the partition: refuse its writes, drop its
    tail, wake its long-polls (their next read is refused)."""
    partition.fenced = True
    partition.tail = InMemoryBatches()
    partition.wake_waiters()
