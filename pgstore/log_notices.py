"""Commits that cross gateways: a change that moves a partition's log end
tells every gateway, through PostgreSQL's LISTEN/NOTIFY.

    announce_log_end(change, schema, LogEnd(log_id, base, end, nbytes, max_ts))
    notices = LogNotices(dsn, schema, on_log_end, on_resync)
    await notices.start()                                # one connection, LISTEN

docs/cluster-design.md, "Cross-gateway commits": a transaction committed
through one gateway publishes into partitions that other gateways lead, and
those leaders must learn of it at once, to move their high watermarks and
tail caches and wake their waiting long-polls. ``announce_log_end`` adds
``pg_notify`` to the writing change, so the notice is sent only if that
PostgreSQL transaction commits, and PostgreSQL delivers notices in commit
order. Each gateway listens on one dedicated connection (``LogNotices``) and
hands each notice to ``on_log_end(LogEnd)``: the partition's log ``log_id``
took the offsets [base, end), ``nbytes`` of batches whose largest timestamp
is ``max_timestamp`` (``PgPartitionLog.noticed`` says what its leader does).

A notice is a hint, never the truth: LISTEN does not survive a broken
connection, and notices sent while it was down are lost. So after every
reconnection (and the first connection) ``on_resync()`` runs, for the
gateway to reread the log ends of the partitions it leads. Reconnection is
retried, with a growing pause, until ``close``. A ping every ``ping_seconds``
finds a connection to a server that hangs, which is never reported lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg

from .connect import connect as connect_any
from .writer import PgChange

log = logging.getLogger(__name__)

RECONNECT_PAUSE_SECONDS = (0.05, 0.2, 1.0, 2.0)  # then 2 s each time
CONNECT_TIMEOUT_SECONDS = 10.0
# A connection to a server that hangs (its machine gone silent, a frozen
# primary after a failover) is never reported lost: no FIN, no RST, and its
# kernel may even answer TCP keepalives. So the listener pings every
# PING_SECONDS, and a ping unanswered after PING_TIMEOUT_SECONDS counts as a
# lost connection.
PING_SECONDS = 5.0
PING_TIMEOUT_SECONDS = 10.0
_LOST_ERRORS: tuple[type[BaseException], ...] = (
    TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError,
    # among them TargetServerAttributeNotMatched: every host of a multi-host
    # URL answered, none takes writes (a switchover under way)
    asyncpg.InternalClientError)


def channel(schema: str) -> str:
    """The channel of one schema's gateways (several clusters may share a
    database, each in its own schema)."""
    return f"{schema}_log"


@dataclass(frozen=True, slots=True)
class LogEnd:
    """What one change added to one partition's log: the offsets [base, end),
    ``nbytes`` of batches, the largest timestamp among them (-1: none)."""

    log_id: int
    base: int
    end: int
    nbytes: int = 0
    max_timestamp: int = -1

    def payload(self) -> str:
        return f"{self.log_id}:{self.base}:{self.end}:{self.nbytes}:{self.max_timestamp}"

    @classmethod
    def parse(cls, payload: str) -> LogEnd:
        """Raises ValueError for anything but five integers, or a range that
        is empty or reversed."""
        log_id, base, end, nbytes, max_ts = (int(part) for part in payload.split(":"))
        if not 0 <= base < end or nbytes < 0:
            raise ValueError(f"not a log end: {payload!r}")
        return cls(log_id, base, end, nbytes, max_ts)


# The notice of a change whose offsets PostgreSQL assigned (the statement
# that moved the row ran earlier in the same change): $1 log id, $2 the
# channel, $3 offsets taken, $4 bytes, $5 the largest timestamp.
ANNOUNCE_FROM_ROW = (
    "SELECT pg_notify($2, $1::bigint || ':' || (log_end_offset - $3::bigint) || ':' || "
    "log_end_offset || ':' || $4::bigint || ':' || $5::bigint) FROM {s}.partitions "
    "WHERE log_id = $1")


def announce_log_end(change: PgChange, schema: str, notice: LogEnd) -> None:
    """Tell every gateway, once ``change`` commits, what it added to a log."""
    change.execute("SELECT pg_notify($1, $2)", channel(schema), notice.payload())


class LogNotices:
    """One connection listening for log ends; delivers them on the event loop."""

    def __init__(self, dsn: str, schema: str, on_log_end: Callable[[LogEnd], None],
                 on_resync: Callable[[], Awaitable[None]], *,
                 connect: Callable[..., Any] = connect_any,
                 ping_seconds: float = PING_SECONDS,
                 ping_timeout: float = PING_TIMEOUT_SECONDS) -> None:
        self.dsn = dsn
        self._ping_seconds = ping_seconds
        self._ping_timeout = ping_timeout
        self.channel = channel(schema)
        self._on_log_end = on_log_end
        self._on_resync = on_resync
        self._connect = connect
        self._conn: asyncpg.Connection | None = None
        self._lost = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.connects = 0
        self.notices = 0
        self.malformed = 0

    async def start(self) -> None:
        """Listen (a wrong URL fails here, loudly), resync, and keep listening."""
        await self._listen()
        self._task = asyncio.get_running_loop().create_task(self._keep(), name="pg-log-notices")

    async def close(self) -> None:
        self._closing = True
        self._lost.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close(timeout=5)
            self._conn = None

    async def _listen(self) -> None:
        conn: asyncpg.Connection = await asyncio.wait_for(
            self._connect(self.dsn), CONNECT_TIMEOUT_SECONDS)
        self._lost.clear()
        conn.add_termination_listener(lambda _: self._lost.set())
        await conn.add_listener(self.channel, self._notice)
        self._conn = conn
        self.connects += 1
        # Whatever was announced before LISTEN took effect is read, not heard.
        await self._on_resync()

    async def _keep(self) -> None:
        while not self._closing:
            await self._watch()
            if self._closing:
                return
            log.warning("PostgreSQL log notices: connection lost; reconnecting")
            attempt = 0
            while not self._closing:
                pause = RECONNECT_PAUSE_SECONDS[min(attempt, len(RECONNECT_PAUSE_SECONDS) - 1)]
                await asyncio.sleep(pause)
                attempt += 1
                try:
                    await self._listen()
                    break
                except _LOST_ERRORS as exc:  # none may end the loop
                    log.warning("PostgreSQL log notices: reconnect failed: %s", exc)

    async def _watch(self) -> None:
        """Until the connection is lost, or fails to answer a ping in time."""
        while True:
            try:
                await asyncio.wait_for(self._lost.wait(), self._ping_seconds)
                return
            except TimeoutError:
                pass
            conn = self._conn
            if conn is None:
                return
            try:
                await asyncio.wait_for(conn.fetchval("SELECT 1"), self._ping_timeout)
            except _LOST_ERRORS as exc:
                log.warning("PostgreSQL log notices: no answer to a ping (%r)", exc)
                conn.terminate()
                self._lost.set()
                return

    def _notice(self, _conn: Any, _pid: int, _channel: str, payload: object, /) -> None:
        try:
            notice = LogEnd.parse(str(payload))
        except ValueError:
            self.malformed += 1
            log.warning("PostgreSQL log notices: malformed payload %r ignored", payload)
            return
        self.notices += 1
        self._on_log_end(notice)
