"""Cluster membership: each gateway's row in ``nodes``, held by a lease
(docs/cluster-design.md, "Leadership, fencing and leases").

    membership = Membership(pool, schema, node_id=1,
                            listeners=[Listener("PLAINTEXT", "gw1", 9092)])
    await membership.start()          # registers: a new incarnation; renews from then on
    nodes = await membership.live_nodes()
    ...
    await membership.stop()           # a clean stop: deregisters

- **Register.** ``start`` writes the node's row with its advertised listeners
  and a new *incarnation*, taken from the ``node_incarnations`` sequence, so
  it is never reused, not even after a deregistration deleted the row. A
  process that finds a row for its ``node.id`` takes it over (the newest
  start wins, as a restarted broker does); in the same transaction every
  partition and coordinator slot the node leads gets a new leader epoch, so
  whatever an older process of this node still has in flight is fenced.
- **Renew.** A task renews the lease every ``lease_seconds / 3``: the
  row's ``lease_expires_at`` becomes the database's ``now()`` plus the
  lease. Only the database's clock counts, never the gateway's.
- **Live nodes** are those whose ``lease_expires_at`` is after the
  database's ``now()``; Metadata lists them.
- **Lost.** A renewal that finds the row taken over by a newer incarnation
  (``Superseded``), or its lease already run out (``LeaseExpired``: the
  process was paused or cut off for longer than the lease, and others may
  have taken its partitions), stops renewing for good and reports it
  (``lost``, ``wait_lost``, the ``on_lost`` callback). An incarnation whose
  lease ran out never comes back: the process must stop acting as this node
  (``pgstore.leadership`` gives up everything it led); starting again means
  a new ``Membership``, which is a new incarnation. A renewal that fails for
  another reason (the connection lost) is retried at the next period: the
  lease covers about three of them.
- **Deregister.** ``stop`` ends the renewals and deletes the row (only this
  incarnation's: never a newer one's), so the node leaves the live set at
  once instead of after its lease.

The lease (``lease_seconds``, default ``DEFAULT_LEASE_SECONDS`` = 10 s)
bounds how long a dead gateway's partitions stay leaderless: its lease plus
one renewal period of the survivors (``pgstore.leadership``). Correctness
never rests on it: every write is fenced by an epoch in its own transaction.
A connection of a paused gateway that sits inside a transaction still holds
its row locks; ``session_settings`` gives the settings that make PostgreSQL
end such a transaction well within the lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from .migrate import Connection, quoted

DEFAULT_LEASE_SECONDS = 10.0
log = logging.getLogger(__name__)


class MembershipLost(Exception):
    """This process no longer holds its node's lease: it must stop acting as the node."""

    def __init__(self, message: str, node_id: int, incarnation: int) -> None:
        super().__init__(message)
        self.node_id = node_id
        self.incarnation = incarnation


class Superseded(MembershipLost):
    """A newer process of the same node.id registered: this one is stale."""


class LeaseExpired(MembershipLost):
    """The lease ran out before this process renewed it (paused, or cut off)."""


@dataclass(frozen=True, slots=True)
class Listener:
    """An advertised listener, as Kafka's ``advertised.listeners`` names one."""

    name: str
    host: str
    port: int
    security_protocol: str = "PLAINTEXT"


@dataclass(frozen=True, slots=True)
class LiveNode:
    node_id: int
    incarnation: int
    listeners: tuple[Listener, ...]
    lease_expires_at: datetime  # by the database's clock


def session_settings(lease_seconds: float = DEFAULT_LEASE_SECONDS) -> dict[str, str]:
    """PostgreSQL settings for every connection of a gateway in a cluster:
    its pools (``asyncpg.create_pool(..., server_settings=session_settings(lease))``)
    and its group-commit writer, which runs the fenced appends
    (``pgstore.node``).

    A gateway paused (SIGSTOP, a long stall) in the middle of a transaction
    keeps its row locks: a partition row locked by its fenced append would
    hold up the successor's takeover. ``idle_in_transaction_session_timeout``
    makes the server end such a session after a quarter of the lease (never
    under 200 ms), so the locks are gone before the lease is. Nothing of the
    ended transaction lands; the paused gateway finds out when it wakes.
    """
    idle_ms = max(200, int(lease_seconds * 1000 / 4))
    return {"idle_in_transaction_session_timeout": str(idle_ms)}


def _listeners_json(listeners: Sequence[Listener]) -> str:
    return json.dumps([{"name": x.name, "host": x.host, "port": x.port,
                        "security_protocol": x.security_protocol} for x in listeners])


def _listeners_of(raw: str) -> tuple[Listener, ...]:
    items: list[dict[str, Any]] = json.loads(raw)
    return tuple(Listener(str(i["name"]), str(i["host"]), int(i["port"]),
                          str(i.get("security_protocol", "PLAINTEXT"))) for i in items)


class Membership:
    """This gateway's registration in the cluster (see the module's docstring)."""

    def __init__(self, pool: asyncpg.Pool, schema: str, node_id: int,
                 listeners: Sequence[Listener],
                 lease_seconds: float = DEFAULT_LEASE_SECONDS,
                 on_lost: Callable[[MembershipLost], None] | None = None) -> None:
        if node_id < 0:
            raise ValueError(f"node.id must be 0 or more, not {node_id}")
        if lease_seconds <= 0:
            raise ValueError(f"the lease must be positive, not {lease_seconds} s")
        self.pool = pool
        self.schema = schema
        self.node_id = node_id
        self.listeners = tuple(listeners)
        self.lease_seconds = lease_seconds
        self.renew_interval = lease_seconds / 3
        self.on_lost = on_lost
        self._incarnation: int | None = None
        self.lease_expires_at: datetime | None = None  # as last renewed
        self.lost: MembershipLost | None = None
        self._lost_event = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        s = quoted(schema)
        self._s = s
        self._register_sql = f"""
            INSERT INTO {s}.nodes (node_id, listeners, incarnation, lease_expires_at)
            VALUES ($1, $2::jsonb, nextval('{s}.node_incarnations'),
                    now() + make_interval(secs => $3))
            ON CONFLICT (node_id) DO UPDATE
               SET listeners = EXCLUDED.listeners, incarnation = EXCLUDED.incarnation,
                   registered_at = now(), lease_expires_at = EXCLUDED.lease_expires_at
            RETURNING incarnation, lease_expires_at"""
        # Whatever an older process of this node leads, it leads no more.
        self._fence_old_sql = [
            f"UPDATE {s}.{table} SET leader_epoch = leader_epoch + 1 WHERE leader_node = $1"
            for table in ("partitions", "coordinator_slots")]
        self._renew_sql = f"""
            UPDATE {s}.nodes SET lease_expires_at = now() + make_interval(secs => $3)
             WHERE node_id = $1 AND incarnation = $2 AND lease_expires_at > now()
            RETURNING lease_expires_at"""
        self._why_sql = (f"SELECT incarnation, lease_expires_at, now() AS now "
                         f"FROM {s}.nodes WHERE node_id = $1")
        self._deregister_sql = f"DELETE FROM {s}.nodes WHERE node_id = $1 AND incarnation = $2"
        self._live_sql = (f"SELECT node_id, incarnation, listeners::text AS listeners, "
                          f"lease_expires_at FROM {s}.nodes WHERE lease_expires_at > now() "
                          f"ORDER BY node_id")

    # ------------------------------------------------------------ state
    @property
    def incarnation(self) -> int:
        if self._incarnation is None:
            raise RuntimeError(f"node {self.node_id} is not registered (call start)")
        return self._incarnation

    @property
    def active(self) -> bool:
        """Registered, renewing, not lost, not stopped."""
        return self._incarnation is not None and self.lost is None and not self._stopped

    async def wait_lost(self) -> MembershipLost:
        """Returns once the membership is lost (``Superseded``/``LeaseExpired``)."""
        await self._lost_event.wait()
        assert self.lost is not None
        return self.lost

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> int:
        """Register (a new incarnation, which fences the node's older ones) and
        start renewing; the incarnation."""
        if self._incarnation is not None:
            raise RuntimeError(f"node {self.node_id}: a Membership starts once; "
                               "a restart is a new Membership (a new incarnation)")
        async with self.pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(self._register_sql, self.node_id,
                                      _listeners_json(self.listeners), self.lease_seconds)
            assert row is not None
            for sql in self._fence_old_sql:
                await conn.execute(sql, self.node_id)
        self._incarnation = int(row["incarnation"])
        self.lease_expires_at = row["lease_expires_at"]
        self._task = asyncio.create_task(self._renew_loop(),
                                         name=f"lease renewal of node {self.node_id}")
        return self._incarnation

    async def stop(self) -> None:
        """A clean stop: no more renewals; the row is deleted (when still this
        incarnation's), so the node leaves the live set now."""
        if self._stopped:
            return
        self._stopped = True
        await self._cancel_task()
        if self._incarnation is not None and self.lost is None:
            async with self.pool.acquire() as conn:
                await conn.execute(self._deregister_sql, self.node_id, self._incarnation)

    async def halt(self) -> None:
        """Stop renewing without deregistering: what a crash looks like to the
        others (the row stays until its lease runs out). For tests, and for a
        process that must stop acting at once."""
        self._stopped = True
        await self._cancel_task()

    async def _cancel_task(self) -> None:
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # ------------------------------------------------------------ renewal
    async def renew(self) -> datetime:
        """Renew the lease once; its new end (the database's clock). Raises
        ``Superseded`` or ``LeaseExpired`` (and records it) when the row is no
        longer this incarnation's to renew."""
        if self.lost is not None:
            raise self.lost
        incarnation = self.incarnation
        found: asyncpg.Record | None = None
        async with self.pool.acquire() as conn:
            expires = await conn.fetchval(self._renew_sql, self.node_id, incarnation,
                                          self.lease_seconds)
            if expires is None:
                found = await conn.fetchrow(self._why_sql, self.node_id)
        if expires is not None:
            self.lease_expires_at = expires
            return expires  # type: ignore[no-any-return]
        lost: MembershipLost
        if found is not None and int(found["incarnation"]) != incarnation:
            lost = Superseded(
                f"node {self.node_id}: incarnation {incarnation} was taken over by a newer "
                f"process (incarnation {found['incarnation']}); this one stops acting",
                self.node_id, incarnation)
        elif found is None:
            lost = LeaseExpired(
                f"node {self.node_id}: incarnation {incarnation} has no row any more "
                "(deregistered); this process stops acting", self.node_id, incarnation)
        else:
            late = (found["now"] - found["lease_expires_at"]).total_seconds()
            lost = LeaseExpired(
                f"node {self.node_id}: the lease of incarnation {incarnation} ran out "
                f"{late:.3f} s ago (lease {self.lease_seconds:g} s): others may lead its "
                "partitions now; this process stops acting", self.node_id, incarnation)
        self._lose(lost)
        raise lost

    def _lose(self, lost: MembershipLost) -> None:
        if self.lost is not None:
            return
        self.lost = lost
        self._lost_event.set()
        log.error("%s", lost)
        if self.on_lost is not None:
            self.on_lost(lost)

    async def _renew_loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time() + self.renew_interval
        while True:
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            next_at = loop.time() + self.renew_interval
            try:
                await self.renew()
            except MembershipLost:
                return
            except Exception as exc:
                # Whatever failed (a lost connection, asyncpg's state clash
                # after a terminated backend), the task must not die silently
                # while the node believes it renews: the next period tries
                # again (the lease covers about three), and the database
                # decides whether the lease is still this incarnation's.
                log.warning("node %d: lease renewal failed (%r); retrying in %.2f s",
                            self.node_id, exc, self.renew_interval)

    # ------------------------------------------------------------ the cluster
    async def live_nodes(self, conn: Connection | None = None) -> list[LiveNode]:
        """The nodes whose lease is alive by the database's clock, by node id
        (on ``conn`` when given: inside the caller's snapshot)."""
        if conn is None:
            async with self.pool.acquire() as own:
                rows = await own.fetch(self._live_sql)
        else:
            rows = await conn.fetch(self._live_sql)
        return [LiveNode(int(r["node_id"]), int(r["incarnation"]),
                         _listeners_of(r["listeners"]), r["lease_expires_at"]) for r in rows]
