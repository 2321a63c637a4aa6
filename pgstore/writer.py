"""Group commit over PostgreSQL: the changes queued while the last write ran
are written as one transaction on one connection.

    writer = PgWriter(dsn)
    await writer.start()
    change = writer.begin()
    change.fence("UPDATE … WHERE log_id = $1 AND leader_epoch = $2 RETURNING 1",
                 log_id, epoch, refused=lambda: NotLeader(...))
    change.execute("INSERT INTO …", …)
    change.on_durable(publish)
    await writer.commit(change)          # resolves once PostgreSQL committed it

The PostgreSQL engine's counterpart of ``tablets.store.GroupCommitWriter``
(docs/cluster-design.md, "What one PostgreSQL transaction is"): every change
that is one RocksDB WriteBatch in the embedded engine is one ``PgChange``
here, and a group of them is one PostgreSQL transaction, so that one WAL flush
(a few hundred microseconds to milliseconds) serves every request that came in
meanwhile. A lone change per transaction costs 11 to 19 s of server CPU per
GiB; a group of 4 MiB costs 3 (the measurements in cluster-design.md).

A change is refused alone, never its group:

- **A fence** (``PgChange.fence``) is a statement that must return a row: the
  leader-epoch check of an append, a coordinator's epoch, a compare-and-set.
  When the change's *first* step is a fence that returns no row, nothing of
  the change ran, so it is skipped and the group goes on (no round trip
  lost). A fence that fails later in a change, or any statement that raises
  (a constraint, a deadlock), rolls the group back; that change is failed
  with its error and the rest of the group is written again without it. A
  savepoint per change would cost a round trip each on the common path, for
  this rare case.
- **A serialisation failure or deadlock** rolls the group back and writes it
  again, whole, up to ``RETRIES`` times, then fails it.

When the connection breaks, the outcome of the group is known only if it
broke before the COMMIT was sent (nothing was written): the group's changes
fail with ``StoreUnavailable``. When it broke after, PostgreSQL may or may not
have committed: they fail with ``OutcomeUnknown``, and a caller that keeps
state in memory (a partition's log end) rereads it before writing again. The
next group opens a new connection (a multi-host URL with
``target_session_attrs=read-write`` finds a promoted standby, each host tried
within its own time limit: ``pgstore.connect``), so the writer itself never
stays failed. A group not finished within ``group_timeout`` (a server that
hangs) has its connection terminated, and fails the same way. Both errors
are ``StorageError``s: clients retry.

Futures resolve in submission order, after the ``on_durable`` callbacks of
every change of the group ran (in the same order), so a change made visible
by its callback (a high watermark) is visible before its producer hears back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from tablets.errors import StorageError
from tablets.seam import AtomicChange, WriteStats

from .connect import connect as connect_any

log = logging.getLogger(__name__)

# A group takes at most this many changes (a backlog is written in several).
MAX_GROUP_CHANGES = 1024
# Whole-group rewrites after a serialisation failure or a deadlock.
RETRIES = 3
CONNECT_TIMEOUT_SECONDS = 10.0
# A group's transaction that has not finished after this is given up: its
# connection is terminated and its changes fail as any lost connection's do.
# A server that hangs (a machine gone silent) would otherwise hold the writer,
# and every change queued behind it, until TCP gives up (many minutes).
# Kafka's request.timeout.ms is 30 s: the producer has given up by then.
GROUP_TIMEOUT_SECONDS = 30.0


class StoreUnavailable(StorageError):
    """PostgreSQL could not be reached or dropped the connection before the
    commit was sent: nothing of the change was written."""


class OutcomeUnknown(StorageError):
    """The connection broke while the commit was under way: PostgreSQL may or
    may not have written the change."""


# What a broken or unusable connection raises: the group's outcome is decided
# by whether the COMMIT was sent.
_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    asyncio.TimeoutError,
    asyncpg.InterfaceError,  # among them ConnectionDoesNotExistError
    # A connection whose backend was terminated between two statements may
    # report the protocol's state clash instead of the lost connection.
    asyncpg.InternalClientError,
    asyncpg.PostgresConnectionError,  # SQLSTATE class 08
    asyncpg.exceptions.OperatorInterventionError,  # class 57: shutdown, restart
    asyncpg.exceptions.ReadOnlySQLTransactionError,  # a standby: reconnect finds the primary
)
# Worth writing the whole group again.
_RETRY_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.SerializationError,
    asyncpg.exceptions.DeadlockDetectedError,
)


@dataclass(frozen=True, slots=True)
class _Step:
    kind: str  # "execute", "many", "fence", "fetch"
    sql: str
    args: Sequence[Any]
    # fence: the error when no row comes back; fetch: the rows' consumer.
    then: Callable[..., Any] | None = None


class PgChange(AtomicChange):
    """One atomic change: statements run in order inside the group's
    transaction. Made by ``PgWriter.begin``, filled by the engine, written by
    ``PgWriter.commit``."""

    __slots__ = ("_durable", "_steps", "nbytes")

    def __init__(self) -> None:
        self._steps: list[_Step] = []
        self._durable: list[Callable[[], None]] = []
        self.nbytes = 0  # record bytes it carries, for the write statistics

    def execute(self, sql: str, *args: Any) -> None:
        self._steps.append(_Step("execute", sql, args))

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """One prepared statement over many rows (asyncpg pipelines them)."""
        rows = list(rows)
        if rows:
            self._steps.append(_Step("many", sql, rows))

    def fence(self, sql: str, *args: Any, refused: Callable[[], BaseException]) -> None:
        """A statement that must return a row; when it returns none, the
        change is refused with ``refused()`` and nothing of it is written."""
        self._steps.append(_Step("fence", sql, args, refused))

    def fetch(self, sql: str, *args: Any, into: Callable[[list[asyncpg.Record]], None]) -> None:
        """A statement whose rows ``into`` receives inside the transaction
        (ids handed out by a sequence, a row's value before the change). It
        may be called again if the group is written again."""
        self._steps.append(_Step("fetch", sql, args, into))

    def on_durable(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once the change is committed, before its future
        resolves (never when it fails)."""
        self._durable.append(callback)

    def __len__(self) -> int:
        return len(self._steps)


class _Refused(Exception):
    """A change of the group failed alone (carries which, and its error)."""

    def __init__(self, index: int, error: BaseException) -> None:
        super().__init__(str(error))
        self.index = index
        self.error = error


# Raised through a change's steps to the group's handling.
_PASS_THROUGH: tuple[type[BaseException], ...] = (_Refused, *_CONNECTION_ERRORS, *_RETRY_ERRORS)

_Pending = tuple[PgChange, "asyncio.Future[None]"]


class PgWriter:
    """One connection, one writer task, one transaction per group."""

    def __init__(self, dsn: str, *, connect: Callable[..., Any] = connect_any,
                 max_group_changes: int = MAX_GROUP_CHANGES,
                 group_timeout: float = GROUP_TIMEOUT_SECONDS) -> None:
        self.dsn = dsn
        self._connect = connect
        self._max_group = max_group_changes
        self._group_timeout = group_timeout
        self._conn: asyncpg.Connection | None = None
        self._queue: list[_Pending] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.stats = WriteStats()
        self.connects = 0  # connections opened (the first, then reconnects)

    # The seam's ChangeWriter.
    def begin(self) -> PgChange:
        return PgChange()

    def commit(self, change: AtomicChange) -> asyncio.Future[None]:
        """Queue ``change``; the future resolves once PostgreSQL committed it,
        or fails with the change's own error, ``StoreUnavailable`` or
        ``OutcomeUnknown``."""
        assert isinstance(change, PgChange), "a change made by another engine"
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._closing:
            future.set_exception(StoreUnavailable("the PostgreSQL writer is closed"))
            return future
        self._queue.append((change, future))
        self.stats.changes += 1
        self._wake.set()
        return future

    async def start(self) -> None:
        """Connect (so a wrong URL fails at start-up, loudly) and start writing."""
        await self._reconnect()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="pg-writer")

    async def close(self) -> None:
        """Write everything queued, then close the connection."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close(timeout=5)
            self._conn = None

    # ------------------------------------------------------------- internals
    async def _reconnect(self) -> asyncpg.Connection:
        if self._conn is not None and not self._conn.is_closed():
            return self._conn
        if self._conn is not None:
            self._conn.terminate()
        self._conn = None
        conn: asyncpg.Connection = await asyncio.wait_for(
            self._connect(self.dsn), CONNECT_TIMEOUT_SECONDS)
        self.connects += 1
        self._conn = conn
        return conn

    async def _run(self) -> None:
        while True:
            if not self._queue:
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            group = self._queue[:self._max_group]
            del self._queue[:len(group)]
            await self._write_group(group)

    async def _write_group(self, group: list[_Pending]) -> None:
        started = time.perf_counter()
        pending = [(change, future) for change, future in group if not future.cancelled()]
        failed: dict[asyncio.Future[None], BaseException] = {}
        retries = 0
        while pending:
            committing = False
            try:
                conn = await self._reconnect()
                # Terminating the connection fails whatever awaits it at once
                # (the statement, the COMMIT, the rollback on the way out).
                watchdog = asyncio.get_running_loop().call_later(
                    self._group_timeout, conn.terminate)
                try:
                    async with conn.transaction():
                        written = await self._run_steps(conn, pending, failed)
                        committing = True  # leaving the block sends COMMIT
                finally:
                    watchdog.cancel()
            except _Refused as refused:  # rolled back: write the rest again without it
                failed[pending[refused.index][1]] = refused.error
            except _RETRY_ERRORS as exc:
                retries += 1
                if retries > RETRIES:
                    self._fail(pending, failed, StoreUnavailable(str(exc)))
                else:
                    log.info("PostgreSQL group of %d changes written again: %s",
                             len(pending), exc)
            except _CONNECTION_ERRORS as exc:
                log.warning("PostgreSQL connection lost (%s): %d changes %s", exc, len(pending),
                            "in doubt" if committing else "not written")
                self._drop_connection()
                kind = OutcomeUnknown if committing else StoreUnavailable
                self._fail(pending, failed, kind(f"PostgreSQL: {exc}"))
            except Exception as exc:  # at COMMIT (a deferred constraint), or a bug
                log.exception("PostgreSQL group of %d changes failed", len(pending))
                self._drop_connection()  # its state is unknown: the next group opens another
                self._fail(pending, failed, StorageError(f"PostgreSQL: {exc}"))
            else:
                self._written(written, started)
                break
            pending = [(change, future) for change, future in pending if future not in failed]
        for future, error in failed.items():
            if not future.done():
                future.set_exception(error)

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.terminate()
            self._conn = None

    @staticmethod
    def _fail(pending: list[_Pending], failed: dict[asyncio.Future[None], BaseException],
              error: BaseException) -> None:
        for _, future in pending:
            failed.setdefault(future, error)

    async def _run_steps(self, conn: asyncpg.Connection, pending: list[_Pending],
                         failed: dict[asyncio.Future[None], BaseException]) -> list[_Pending]:
        """Run every change's steps; return the changes written. A change
        refused by its first step ran nothing: it is failed and skipped, and
        the group goes on without a rollback."""
        kept: list[_Pending] = []
        for index, (change, future) in enumerate(pending):
            for number, step in enumerate(change._steps):
                try:
                    if step.kind == "execute":
                        await conn.execute(step.sql, *step.args)
                    elif step.kind == "many":
                        await conn.executemany(step.sql, step.args)
                    elif step.kind == "fetch":
                        assert step.then is not None
                        step.then(await conn.fetch(step.sql, *step.args))
                    elif await conn.fetchrow(step.sql, *step.args) is None:  # a fence
                        assert step.then is not None
                        if number:
                            raise _Refused(index, step.then())
                        failed[future] = step.then()
                        break
                except _PASS_THROUGH:
                    raise
                except asyncpg.PostgresError as exc:  # this change's fault alone
                    refused = StorageError(f"PostgreSQL refused a change: {exc}")
                    refused.__cause__ = exc  # what the caller may tell apart (a duplicate)
                    raise _Refused(index, refused) from exc
            else:
                kept.append((change, future))
        return kept

    def _written(self, group: list[_Pending], started: float) -> None:
        elapsed = time.perf_counter() - started
        stats = self.stats
        stats.writes += 1
        stats.bytes += sum(change.nbytes for change, _ in group)
        stats.write_seconds += elapsed
        stats.write_latency.observe(elapsed)
        stats.group_sizes.observe(len(group))
        for change, _ in group:
            for callback in change._durable:
                try:
                    callback()
                except Exception:  # one caller's bug must not strand the others
                    log.exception("a PostgreSQL change's on_durable callback failed")
        for _, future in group:
            if not future.done():
                future.set_result(None)
