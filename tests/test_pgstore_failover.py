"""Failover of PostgreSQL itself, under load, on real servers
(docs/cluster-design.md, "Failover of PostgreSQL").

The gateway's side is one multi-host URL,
``postgresql://u@h1:p1,h2:p2/db?target_session_attrs=read-write``: asyncpg
(0.32) tries the hosts in order and keeps the first that accepts writes.
Three things run over it at once, for a bounded time: ``PgWriter`` group
commits from several tasks (one row per change, which also records the port
of the server that committed it), two partitions' fenced appends
(``BatchLog`` over a pool) and a ``LogNotices`` listener. Then:

- **the primary is SIGKILLed, the synchronous standby promoted** (by the
  test, as a failover manager would; ``synchronous_commit`` on and
  remote_apply): every change acknowledged before the kill is on the
  promoted standby, with its content; a change in flight at the kill failed
  with ``StoreUnavailable`` (and is absent) or ``OutcomeUnknown`` (either),
  never success without its row, never another error; the same writer, pool
  and listener write and hear again, on the promoted standby, by themselves.
  The time from the SIGKILL to the first write committed by the promoted
  standby is printed (``-s`` shows it);
- **PostgreSQL is restarted** (``pg_ctl stop -m fast``, start) mid-load: the
  same, and the listener resyncs after the restart;
- **without synchronous replication**, a change acknowledged while the
  standby was not receiving is lost by a failover; with it, no change is
  acknowledged while the standby is away (its commit waits, then fails in
  doubt when the primary dies). The standby is stopped rather than delayed,
  so what is lost is exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import pytest

from pgstore.batch_log import BatchLog
from pgstore.connect import HOST_TIMEOUT_SECONDS, per_host
from pgstore.connect import connect as connect_any
from pgstore.log_notices import LogEnd, LogNotices, announce_log_end
from pgstore.migrate import migrate
from pgstore.writer import OutcomeUnknown, PgWriter, StoreUnavailable
from testkit import pg_replication
from testkit.batches import decode_batches, make_batch
from testkit.pg_replication import ReplicatedPair, SyncLevel
from testkit.postgres import PostgresServer

SCHEMA = "failover"
TABLE = "failover_rows"
WORKERS = 6
LOAD_BEFORE_FAULT = 8.0  # seconds of load before the fault
LOAD_AFTER_RESUME = 6.0  # seconds of load after the first write past the fault
RESUME_WITHIN = 60.0  # the writer must write again within this after the fault
RETRY_PAUSE = 0.05  # a client's retry backoff after a failed change
NOTICE_LOG_ID = 424242

# What a fenced append over a lost connection raises (batch_log re-raises the
# driver's error; it rereads the partition before its next append).
APPEND_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError, OSError,
    asyncio.TimeoutError)

Key = tuple[int, int]
# The server that committed a change: its port and its postmaster's start
# (epoch seconds): a restarted server is another one on the same port.
Server = tuple[int, float]

pair_on = pg_replication.pair_fixture("on")
pair_remote_apply = pg_replication.pair_fixture("remote_apply")
pair_async = pg_replication.pair_fixture()


async def until(predicate: Callable[[], bool], what: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not within {seconds}s"
        await asyncio.sleep(0.02)


@dataclass
class Ledger:
    """What every attempt of the load was told."""

    acked: dict[Key, tuple[str, Server]] = field(default_factory=dict)
    acked_at: dict[Key, float] = field(default_factory=dict)
    unavailable: set[Key] = field(default_factory=set)
    unknown: set[Key] = field(default_factory=set)


@dataclass
class Appends:
    """One partition's appends: acknowledged (base offset → values) and failed."""

    log: BatchLog
    acked: dict[int, list[str]] = field(default_factory=dict)
    acked_at: list[float] = field(default_factory=list)
    failed: list[list[str]] = field(default_factory=list)
    errors: set[str] = field(default_factory=set)


class Heard:
    def __init__(self) -> None:
        self.ends: list[tuple[int, int]] = []
        self.resyncs = 0

    def log_end(self, notice: LogEnd) -> None:
        self.ends.append((notice.log_id, notice.end))

    async def resync(self) -> None:
        self.resyncs += 1


def servers_into(servers: list[Server]) -> Callable[[list[asyncpg.Record]], None]:
    def into(rows: list[asyncpg.Record]) -> None:
        servers.append((int(rows[0]["port"]), float(rows[0]["started"])))

    return into


class Load:
    """The writer's load, the appends and the listener, over one URL."""

    def __init__(self, dsn: str, *, appends: bool = True, group_timeout: float = 30.0,
                 ping: tuple[float, float] = (5.0, 10.0)) -> None:
        self.dsn = dsn
        self.ledger = Ledger()
        self.heard = Heard()
        self.stop = asyncio.Event()
        self.writer = PgWriter(dsn, group_timeout=group_timeout)
        self.notices = LogNotices(dsn, SCHEMA, self.heard.log_end, self.heard.resync,
                                  ping_seconds=ping[0], ping_timeout=ping[1])
        self.with_appends = appends
        self.appends: list[Appends] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.pool: asyncpg.Pool | None = None

    async def start(self) -> None:
        admin = await asyncpg.connect(self.dsn)
        try:
            await migrate(admin, SCHEMA)
            await admin.execute(f"CREATE TABLE {TABLE} (worker int, seq int, v text NOT NULL, "
                                "PRIMARY KEY (worker, seq))")
            log_ids = []
            for _ in range(2):
                topic_id = uuid.uuid4()
                await admin.execute(f"INSERT INTO {SCHEMA}.topics (topic_id, name, created_ms) "
                                    "VALUES ($1, $2, 0)", topic_id, f"t-{topic_id.hex[:8]}")
                log_ids.append(int(await admin.fetchval(
                    f"INSERT INTO {SCHEMA}.partitions (topic_id, partition, leader_epoch) "
                    "VALUES ($1, 0, 1) RETURNING log_id", topic_id)))
        finally:
            await admin.close()
        if self.with_appends:
            self.pool = await asyncpg.create_pool(self.dsn, min_size=1, max_size=2,
                                                  connect=connect_any)
            for log_id in log_ids:
                self.appends.append(Appends(await BatchLog.open(self.pool, SCHEMA, log_id)))
        await self.writer.start()
        await self.notices.start()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._work(w)) for w in range(WORKERS)]
        self._tasks += [loop.create_task(self._append(a, f"p{i}"))
                        for i, a in enumerate(self.appends)]

    async def _work(self, worker: int) -> None:
        seq = 0
        ledger = self.ledger
        while not self.stop.is_set():
            seq += 1
            key = (worker, seq)
            value = f"{worker}:{seq}:{os.urandom(6).hex()}"
            servers: list[Server] = []
            change = self.writer.begin()
            change.fetch(f"INSERT INTO {TABLE} (worker, seq, v) VALUES ($1, $2, $3) "
                         "RETURNING inet_server_port() AS port, "
                         "extract(epoch FROM pg_postmaster_start_time())::float8 AS started",
                         worker, seq, value, into=servers_into(servers))
            try:
                await self.writer.commit(change)
            except StoreUnavailable:
                ledger.unavailable.add(key)
                await asyncio.sleep(RETRY_PAUSE)
            except OutcomeUnknown:
                ledger.unknown.add(key)
                await asyncio.sleep(RETRY_PAUSE)
            else:  # any other error fails the task, and the test
                ledger.acked[key] = (value, servers[-1])
                ledger.acked_at[key] = time.monotonic()

    async def _append(self, appends: Appends, tag: str) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            values = [f"{tag}-{n}-{i}" for i in range(4)]
            try:
                bases = await asyncio.wait_for(
                    appends.log.append([make_batch([v.encode() for v in values])]), 30)
            except APPEND_ERRORS as exc:  # Fenced, or anything else, fails the test
                appends.failed.append(values)
                appends.errors.add(type(exc).__name__)
                await asyncio.sleep(RETRY_PAUSE)
            else:
                appends.acked[bases[0]] = values
                appends.acked_at.append(time.monotonic())

    async def finish(self) -> None:
        self.stop.set()
        await asyncio.gather(*self._tasks)  # raises what a task raised

    async def close(self) -> None:
        self.stop.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        # Bounded: after a failed check the writer may still be stuck on a
        # server that hangs, and the test must end all the same.
        for closing in (self.writer.close(), self.notices.close()):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(closing, 15)
        if self.pool is not None:
            self.pool.terminate()

    def acked_by(self, server: Callable[[Server], bool]) -> list[float]:
        """When the changes committed by the servers ``server`` picks were acknowledged."""
        ledger = self.ledger
        return sorted(ledger.acked_at[key] for key, (_, by) in ledger.acked.items()
                      if server(by))


async def check_nothing_acknowledged_lost(load: Load, dsn: str) -> dict[str, int]:
    """Every acknowledged change and append is in the server ``dsn`` reaches,
    with its content; nothing reported not written is; nothing else is but
    what was in doubt. Returns the counts."""
    ledger = load.ledger
    conn = await asyncpg.connect(dsn)
    try:
        rows = {(r["worker"], r["seq"]): r["v"]
                for r in await conn.fetch(f"SELECT worker, seq, v FROM {TABLE}")}
    finally:
        await conn.close()
    missing = [key for key, (value, _) in ledger.acked.items() if rows.get(key) != value]
    assert not missing, f"{len(missing)} acknowledged changes lost or changed: {missing[:10]}"
    wrongly_written = ledger.unavailable & rows.keys()
    assert not wrongly_written, f"reported not written, yet there: {sorted(wrongly_written)}"
    unexplained = rows.keys() - ledger.acked.keys() - ledger.unknown
    assert not unexplained, f"rows nobody was told about: {sorted(unexplained)}"
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1)
    appended = failed_there = 0
    try:
        for appends in load.appends:
            log = await BatchLog.open(pool, SCHEMA, appends.log.log_id)
            stored: dict[int, list[str]] = {}
            offset = 0
            while offset < log.log_end_offset:
                batches = await log.read(offset, 1 << 20, until=log.log_end_offset)
                assert batches, f"nothing readable at {offset} below {log.log_end_offset}"
                for data in batches:
                    (decoded,) = decode_batches(data)
                    assert decoded["base_offset"] == offset, "a gap or overlap in the log"
                    stored[offset] = [r["value"].decode() for r in decoded["records"]]
                    offset += decoded["last_offset_delta"] + 1
            lost = {base: values for base, values in appends.acked.items()
                    if stored.get(base) != values}
            assert not lost, f"acknowledged appends lost or moved: {lost}"
            doubted = {tuple(values) for values in appends.failed}
            extra = [values for base, values in stored.items() if base not in appends.acked]
            assert all(tuple(values) in doubted for values in extra), (
                f"batches nobody was told about: {extra}")
            appended += len(appends.acked)
            failed_there += len(extra)
    finally:
        await pool.close()
    return {"rows": len(rows), "acked": len(ledger.acked), "unavailable": len(ledger.unavailable),
            "unknown": len(ledger.unknown), "unknown_landed": len(rows.keys() & ledger.unknown),
            "appends_acked": appended, "appends_failed": sum(len(a.failed) for a in load.appends),
            "appends_in_doubt_landed": failed_there}


async def heard_again(load: Load, end: int) -> None:
    """A log end announced through the writer now reaches the listener."""
    change = load.writer.begin()
    announce_log_end(change, SCHEMA, LogEnd(NOTICE_LOG_ID, end - 1, end))
    await load.writer.commit(change)
    await until(lambda: (NOTICE_LOG_ID, end) in load.heard.ends, "the notice heard", 30)


Fault = Callable[["Load"], Awaitable[tuple[float, Callable[[Server], bool]]]]


async def under_load(dsn: str, fault: Fault, check_dsn: Callable[[], str],
                     load: Load | None = None) -> dict[str, float]:
    """Load, then ``fault`` (returns when it began, and which servers take
    writes after it), then load until the writer and both appenders wrote
    past it, and on for a while; then every check. Returns figures."""
    load = load or Load(dsn)
    try:
        await load.start()
        await heard_again(load, 1)
        await asyncio.sleep(LOAD_BEFORE_FAULT)
        before = len(load.ledger.acked)
        assert before > 0 and all(a.acked for a in load.appends), "the load never ran"
        assert len(load.appends) == (2 if load.with_appends else 0)
        began, after = await fault(load)
        await until(lambda: bool(load.acked_by(after))
                    and all(t > began for a in load.appends for t in a.acked_at[-1:]),
                    "writes after the fault", RESUME_WITHIN)
        first = load.acked_by(after)[0]
        # Nothing committed by the new server was acknowledged before the fault.
        assert first > began
        await asyncio.sleep(LOAD_AFTER_RESUME)
        await load.finish()
        ledger = load.ledger
        assert ledger.unavailable or ledger.unknown, "no change was failed by the fault"
        assert not load.appends or any(a.failed for a in load.appends), (
            "no append was failed by the fault")
        # The same writer, reconnected by itself; the listener too, resynced.
        assert load.writer.connects >= 2, load.writer.connects
        assert load.notices.connects >= 2 and load.heard.resyncs >= 2, (
            load.notices.connects, load.heard.resyncs)
        await heard_again(load, 2)
        await load.writer.close()
        counts = await check_nothing_acknowledged_lost(load, check_dsn())
        print(f"\n{counts}; first write {first - began:.3f}s after the fault")
        return {"first_write": first - began, **counts}
    finally:
        await load.close()


@pytest.mark.parametrize("level", ["on", "remote_apply"])
def test_a_killed_primary_loses_nothing_acknowledged_with_a_synchronous_standby(
        level: SyncLevel, request: pytest.FixtureRequest) -> None:
    pair: ReplicatedPair = request.getfixturevalue(f"pair_{level}")
    assert pair.replication_state() == ("streaming", "sync")
    timings: dict[str, float] = {}

    async def kill_and_promote(load: Load) -> tuple[float, Callable[[Server], bool]]:
        began = time.monotonic()
        await asyncio.to_thread(pair.primary.kill)  # asserts the postmaster is dead
        timings["killed"] = time.monotonic() - began
        await asyncio.to_thread(pair.standby.promote)
        timings["promoted"] = time.monotonic() - began
        return began, lambda server: server[0] == pair.standby.port

    async def main() -> dict[str, float]:
        figures = await under_load(pair.dsn, kill_and_promote, lambda: pair.standby.dsn)
        assert not pair.standby.in_recovery()
        return figures

    figures = asyncio.run(main())
    print(f"synchronous_commit={level}: SIGKILL to dead {timings['killed']:.3f}s, "
          f"to promoted {timings['promoted']:.3f}s, to first write "
          f"{figures['first_write']:.3f}s")


def test_a_restart_mid_load_loses_nothing_acknowledged_and_the_listener_resyncs() -> None:
    with PostgresServer() as pg:
        dsn = f"{pg.dsn}?target_session_attrs=read-write"

        async def restart(load: Load) -> tuple[float, Callable[[Server], bool]]:
            resyncs = load.heard.resyncs
            began, wall = time.monotonic(), time.time()
            await asyncio.to_thread(pg.restart)
            await until(lambda: load.heard.resyncs > resyncs, "a resync after the restart", 30)
            return began, lambda server: server[1] > wall

        figures = asyncio.run(under_load(dsn, restart, lambda: pg.dsn))
        print(f"restart: first write {figures['first_write']:.3f}s after pg_ctl stop began")


async def write_rows(writer: PgWriter, keys: range) -> None:
    for k in keys:
        change = writer.begin()
        change.execute(f"INSERT INTO {TABLE} (worker, seq, v) VALUES (0, $1, 'v')", k)
        await writer.commit(change)


async def stored_keys(dsn: str) -> list[int]:
    conn = await asyncpg.connect(dsn)
    try:
        return [r["seq"] for r in await conn.fetch(f"SELECT seq FROM {TABLE} ORDER BY seq")]
    finally:
        await conn.close()


async def fail_over_to_a_standby_that_was_away(pair: ReplicatedPair) -> None:
    await asyncio.to_thread(pair.primary.kill)
    await asyncio.to_thread(pair.standby.start_again)
    await asyncio.to_thread(pair.standby.promote)


def test_without_synchronous_replication_a_failover_loses_acknowledged_changes(
        pair_async: ReplicatedPair) -> None:
    pair = pair_async
    assert pair.replication_state() == ("streaming", "async")

    async def main() -> None:
        pair.primary.psql(f"CREATE TABLE {TABLE} (worker int, seq int, v text, "
                          "PRIMARY KEY (worker, seq))")
        writer = PgWriter(pair.dsn)
        await writer.start()
        try:
            await write_rows(writer, range(1, 21))
            await until(lambda: pair.standby.psql(f"SELECT count(*) FROM {TABLE}") == "20",
                        "the standby caught up", 30)
            await asyncio.to_thread(pair.standby.halt)  # the standby stops receiving
            await write_rows(writer, range(21, 41))  # acknowledged all the same
            assert await stored_keys(pair.primary.dsn) == list(range(1, 41))
            await fail_over_to_a_standby_that_was_away(pair)
            # The 20 changes acknowledged while the standby was away are gone.
            assert await stored_keys(pair.standby.dsn) == list(range(1, 21))
            await write_rows(writer, range(21, 22))  # the same writer, on the new primary
            assert await stored_keys(pair.standby.dsn) == list(range(1, 22))
        finally:
            await writer.close()

    asyncio.run(main())


def test_with_synchronous_replication_nothing_is_acknowledged_while_the_standby_is_away(
        pair_on: ReplicatedPair) -> None:
    pair = pair_on

    async def main() -> None:
        pair.primary.psql(f"CREATE TABLE {TABLE} (worker int, seq int, v text, "
                          "PRIMARY KEY (worker, seq))")
        writer = PgWriter(pair.dsn)
        await writer.start()
        try:
            await write_rows(writer, range(1, 21))
            await asyncio.to_thread(pair.standby.halt)
            waiting = asyncio.ensure_future(write_rows(writer, range(21, 22)))
            await until(lambda: pair.primary.psql(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'") == "1",
                "the commit waiting for the standby", 30)
            await asyncio.sleep(2.0)
            assert not waiting.done(), "acknowledged without the synchronous standby"
            await fail_over_to_a_standby_that_was_away(pair)
            with pytest.raises(OutcomeUnknown):
                await asyncio.wait_for(waiting, 30)
            # Committed on the dead primary alone, never acknowledged: not there.
            assert await stored_keys(pair.standby.dsn) == list(range(1, 21))
            await write_rows(writer, range(21, 22))
            assert await stored_keys(pair.standby.dsn) == list(range(1, 22))
        finally:
            with contextlib.suppress(Exception):
                await writer.close()

    asyncio.run(main())


def test_while_no_server_takes_writes_the_writer_and_the_listener_keep_trying() -> None:
    """A switchover's moment: every host answers, none accepts writes (here the
    one server made read-only): asyncpg raises TargetServerAttributeNotMatched.
    Changes fail as not written; the listener, whose connection was lost
    meanwhile, keeps trying; both resume once a server takes writes."""
    with PostgresServer() as pg:
        dsn = f"{pg.dsn}?target_session_attrs=read-write"

        async def main() -> None:
            heard = Heard()
            notices = LogNotices(dsn, SCHEMA, heard.log_end, heard.resync)
            await notices.start()
            writer = PgWriter(dsn)
            await writer.start()
            try:
                pg.psql("ALTER SYSTEM SET default_transaction_read_only = on")
                pg.psql("SELECT pg_reload_conf()")
                # End every session: the writer's and the listener's.
                pg.psql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()")
                with pytest.raises(asyncpg.TargetServerAttributeNotMatched):
                    await asyncpg.connect(dsn)  # the premise: no host matches
                change = writer.begin()
                announce_log_end(change, SCHEMA, LogEnd(NOTICE_LOG_ID, 0, 1))
                with pytest.raises(StoreUnavailable):
                    await writer.commit(change)
                await asyncio.sleep(3 * 2.0)  # several of the listener's attempts
                assert notices._task is not None and not notices._task.done(), (
                    "the listener gave up")
                pg.psql("ALTER SYSTEM RESET default_transaction_read_only")
                pg.psql("SELECT pg_reload_conf()")
                await until(lambda: heard.resyncs >= 2, "the listener back", 30)
                change = writer.begin()
                announce_log_end(change, SCHEMA, LogEnd(NOTICE_LOG_ID, 1, 2))
                await writer.commit(change)
                await until(lambda: (NOTICE_LOG_ID, 2) in heard.ends, "the notice heard", 30)
            finally:
                await writer.close()
                await notices.close()

        asyncio.run(main())


def test_a_frozen_primary_is_left_for_the_promoted_standby(pair_on: ReplicatedPair) -> None:
    """A primary that hangs rather than dies (every process SIGSTOPped: its
    kernel still completes TCP handshakes, nothing answers). asyncpg's own
    multi-host connect spends its whole timeout on it and never tries the
    promoted standby (the premise, checked); ``pgstore.connect`` gives each
    host its own limit, the writer gives up a group after ``group_timeout``,
    and the listener's ping finds its silent connection. Fenced appends are
    left out: ``batch_log`` appends on a pool with no time limit of their own
    (they are to become changes of the writer's groups)."""
    pair = pair_on
    timings: dict[str, float] = {}

    async def freeze_and_promote(load: Load) -> tuple[float, Callable[[Server], bool]]:
        began = time.monotonic()
        frozen = await asyncio.to_thread(pair.primary.freeze)
        assert frozen and all(
            Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
            for pid in frozen)
        await asyncio.to_thread(pair.standby.promote)
        timings["promoted"] = time.monotonic() - began
        with pytest.raises(TimeoutError):
            await asyncpg.connect(pair.dsn, timeout=2 * HOST_TIMEOUT_SECONDS)
        return began, lambda server: server[0] == pair.standby.port

    load = Load(pair.dsn, appends=False, group_timeout=2.0, ping=(0.5, 1.0))
    figures = asyncio.run(under_load(pair.dsn, freeze_and_promote, lambda: pair.standby.dsn,
                                     load))
    print(f"frozen primary: promoted {timings['promoted']:.3f}s, first write "
          f"{figures['first_write']:.3f}s after the freeze (group timeout 2 s, "
          f"{HOST_TIMEOUT_SECONDS} s per host)")


def test_a_multi_host_url_is_split_one_url_per_host() -> None:
    assert per_host("postgresql://u@h1:5432,h2:5433/db?target_session_attrs=read-write") == [
        "postgresql://u@h1:5432/db?target_session_attrs=read-write",
        "postgresql://u@h2:5433/db?target_session_attrs=read-write"]
    assert per_host("postgresql://u:p@h1,[::1]:5433/db") == [
        "postgresql://u:p@h1/db", "postgresql://u:p@[::1]:5433/db"]
    assert per_host("postgres://h1,h2?sslmode=disable") == [
        "postgres://h1?sslmode=disable", "postgres://h2?sslmode=disable"]
    one = "postgresql://u@h1:5432/db"
    assert per_host(one) == [one]
    assert per_host("host=h1 port=5432") == ["host=h1 port=5432"]
