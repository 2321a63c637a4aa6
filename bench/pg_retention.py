"""Retention at steady state over pgstore's schema: measured (docs/cluster-design.md,
"Retention, compaction and bloat").

    python3 -m bench.pg_retention [--seconds 150] [--mib-s 24] [--retained-mib 48]
                                  [--phases defaults,migration3,naptime10s] [--json out.json]

Each phase runs on a fresh throwaway server (testkit/postgres.py, PostgreSQL's
default settings, fsync on, but for what the phase names) with the schema
migrated as the engine does:

- several partitions are appended to continuously through
  ``pgstore.batch_log`` (real v2 batches of 16 records of random bytes,
  flagged zstd: incompressible), half with batches of 16 KiB (64 per append),
  half of 1 MiB (4 per append), at a fixed total rate;
- every ``--every`` seconds a retention pass moves each partition's log start
  to where Kafka's retention.bytes rule puts it for ``--retained-mib``
  (``pgstore.retention_sql.start_for_size``) and deletes what is below it
  (``pgstore.retention_sql.delete_below``: the statement the engine uses);
- every 2 s a sample: the sizes of ``batch_data`` (its heap, its TOAST table
  and TOAST index, its index) and of ``batches`` (heap, indexes), the dead
  tuples and autovacuum runs of each (``pg_stat_all_tables``, TOAST
  included), the data retained (the partitions' ``size_bytes``), the WAL
  written and the server's CPU (the postmaster and its children).

The phases:

- ``defaults``: autovacuum as PostgreSQL ships it (migration 3's per-table
  settings reset): a pass at most every ``autovacuum_naptime`` (1 min), when
  dead tuples pass 50 + 20 % of the table, throttled by the cost limit;
- ``migration3``: the schema as migrated (``pgstore/schema.py``, migration 3's
  per-table settings on ``batches`` and ``batch_data`` and their TOAST);
- ``naptime10s``: migration 3 with the server's ``autovacuum_naptime`` at 10 s
  (a server setting: no table can ask for it);
- ``vacuum``: migration 3, and the engine runs ``VACUUM`` on both tables
  itself (``pgstore.retention_sql.vacuum``, on a connection of its own, beside the
  passes) each time retention has deleted a quarter of the data retained;
- ``append_only`` (not run unless named): the appends alone, no retention:
  what the appends cost by themselves, the same way.

The table printed: per phase, when the deleted space became reusable (the
end of the first vacuum of the TOAST table), the size from then on (mean,
largest) against the data retained and how much it still grew (zero: vacuum
keeps up), how often vacuum passed each relation and how long a TOAST pass
took, the retention pass's time, WAL and server CPU per GiB written, and the
load of the rest of the machine (it is shared).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path

import asyncpg

from bench.pg_batches import server_cpu
from pgstore.batch_log import BatchLog
from pgstore.migrate import migrate
from pgstore.retention_sql import delete_below, start_for_size, vacuum
from pgstore.schema import TABLE_STORAGE_PARAMETERS
from testkit.batches import with_payload
from testkit.postgres import PostgresServer

SCHEMA = "bench_retention"
SAMPLE_EVERY = 2.0
# name -> the server's settings
PHASES: dict[str, dict[str, str]] = {
    "defaults": {},
    "migration3": {},
    "naptime10s": {"autovacuum_naptime": "10s"},
    "vacuum": {},
    "append_only": {},
}
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Sample:
    t: float  # seconds since the phase's writes began
    retained: int  # sum of the partitions' size_bytes
    data_heap: int  # batch_data's main fork (+ fsm, vm)
    data_toast: int  # its TOAST table
    data_toast_index: int
    data_index: int
    batches_heap: int
    batches_indexes: int
    dead_data: int  # n_dead_tup of batch_data, its TOAST, batches
    dead_toast: int
    dead_batches: int
    autovacuums: tuple[int, int, int]  # vacuums (auto or not): batch_data, TOAST, batches
    vacuuming: str  # the relations a vacuum is working on now

    @property
    def total(self) -> int:
        return (self.data_heap + self.data_toast + self.data_toast_index + self.data_index
                + self.batches_heap + self.batches_indexes)


@dataclass
class Phase:
    name: str
    seconds: float
    written: int = 0  # bytes appended
    deleted: int = 0  # bytes retention deleted
    retention_passes: int = 0
    retention_ms: float = 0.0  # mean time of one pass (all partitions)
    wal: int = 0
    server_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    outside_cpu_s: float = 0.0  # the rest of the machine's busy CPU over the phase
    load: tuple[float, float] = (0.0, 0.0)  # 1-minute load average at start, end
    toast_vacuum_s: list[float] = field(default_factory=list)  # each TOAST pass seen
    samples: list[Sample] = field(default_factory=list)


def _machine_busy() -> float:
    """CPU seconds the whole machine has been busy (all but idle and iowait)."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / _TICK


def _load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


_SAMPLE_SQL = f"""
    WITH rel AS (
        SELECT c.oid, c.relname, c.reltoastrelid
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = '{SCHEMA}' AND c.relname IN ('batch_data', 'batches')
    ), d AS (SELECT * FROM rel WHERE relname = 'batch_data'),
       b AS (SELECT * FROM rel WHERE relname = 'batches')
    SELECT (SELECT coalesce(sum(size_bytes), 0) FROM {SCHEMA}.partitions) AS retained,
           pg_table_size(d.oid) - pg_table_size(d.reltoastrelid) AS data_heap,
           pg_relation_size(d.reltoastrelid) AS data_toast,
           pg_indexes_size(d.reltoastrelid) AS data_toast_index,
           pg_indexes_size(d.oid) AS data_index,
           pg_table_size(b.oid) AS batches_heap,
           pg_indexes_size(b.oid) AS batches_indexes,
           sd.n_dead_tup AS dead_data, st.n_dead_tup AS dead_toast,
           sb.n_dead_tup AS dead_batches,
           sd.autovacuum_count + sd.vacuum_count AS av_data,
           st.autovacuum_count + st.vacuum_count AS av_toast,
           sb.autovacuum_count + sb.vacuum_count AS av_batches,
           (SELECT coalesce(string_agg(c.relname || ':' || p.phase, ','), '')
              FROM pg_stat_progress_vacuum p JOIN pg_class c ON c.oid = p.relid
             WHERE p.relid IN (d.oid, d.reltoastrelid, b.oid)) AS vacuuming
      FROM d, b,
           pg_stat_all_tables sd, pg_stat_all_tables st, pg_stat_all_tables sb
     WHERE sd.relid = d.oid AND st.relid = d.reltoastrelid AND sb.relid = b.oid"""


async def _sample(conn: asyncpg.Connection, t: float) -> Sample:
    r = await conn.fetchrow(_SAMPLE_SQL)
    assert r is not None, "the tables to sample are missing"
    return Sample(t, int(r["retained"]), int(r["data_heap"]), int(r["data_toast"]),
                  int(r["data_toast_index"]), int(r["data_index"]), int(r["batches_heap"]),
                  int(r["batches_indexes"]), int(r["dead_data"]), int(r["dead_toast"]),
                  int(r["dead_batches"]),
                  (int(r["av_data"]), int(r["av_toast"]), int(r["av_batches"])),
                  str(r["vacuuming"]))


async def _new_log(pool: asyncpg.Pool, name: str) -> BatchLog:
    async with pool.acquire() as conn:
        log_id = await conn.fetchval(
            f"WITH t AS (INSERT INTO {SCHEMA}.topics (topic_id, name, created_ms) "
            "VALUES (gen_random_uuid(), $1, 0) RETURNING topic_id) "
            f"INSERT INTO {SCHEMA}.partitions (topic_id, partition) "
            "SELECT topic_id, 0 FROM t RETURNING log_id", name)
    return await BatchLog.open(pool, SCHEMA, int(log_id))


async def _phase(pg: PostgresServer, name: str, args: argparse.Namespace) -> Phase:
    assert pg.pid is not None
    pool = await asyncpg.create_pool(pg.dsn, min_size=2, max_size=args.partitions + 3)
    phase = Phase(name, args.seconds)
    try:
        async with pool.acquire() as conn:
            await migrate(conn, SCHEMA)
            if name == "defaults":
                for table, settings in TABLE_STORAGE_PARAMETERS.items():
                    await conn.execute(f"ALTER TABLE {SCHEMA}.{table} RESET "
                                       f"({', '.join(settings)})")
        sizes = [16 << 10 if i % 2 == 0 else 1 << 20 for i in range(args.partitions)]
        logs = [await _new_log(pool, f"p{i}") for i in range(args.partitions)]
        payloads = {size: [with_payload(4, os.urandom(size - 61), record_count=16)
                           for _ in range(16)] for size in set(sizes)}
        per_append = {16 << 10: 64, 1 << 20: 4}
        rate = args.mib_s * (1 << 20) / args.partitions  # bytes/s per partition
        retained = args.retained_mib << 20
        stop = asyncio.Event()
        started = time.monotonic()

        async def writer(log: BatchLog, size: int) -> None:
            group = per_append[size]
            rng = random.Random(log.log_id)
            due = time.monotonic()
            while not stop.is_set():
                await log.append([rng.choice(payloads[size]) for _ in range(group)])
                phase.written += group * size
                due += group * size / rate  # paced: a slow moment is caught up
                await asyncio.sleep(max(0.0, due - time.monotonic()))

        due_vacuum = asyncio.Event()  # "vacuum" phase: a quarter of the retained deleted

        async def retention() -> None:
            vacuumed = 0  # bytes deleted when the last VACUUM was asked for
            while name != "append_only" and not stop.is_set():
                await asyncio.sleep(args.every)
                began = time.monotonic()
                async with pool.acquire() as conn:
                    for log in logs:
                        start = await start_for_size(conn, SCHEMA, log.log_id, retained)
                        done = await delete_below(conn, SCHEMA, log.log_id, log.leader_epoch,
                                                  start)
                        phase.deleted += done.bytes
                phase.retention_passes += 1
                phase.retention_ms += (time.monotonic() - began) * 1000
                if phase.deleted - vacuumed > retained * len(logs) // 4:
                    vacuumed = phase.deleted
                    due_vacuum.set()

        async def vacuumer() -> None:
            # Beside the retention passes, on its own connection: a pass never
            # waits for a VACUUM, and one VACUUM runs at a time.
            while name == "vacuum" and not stop.is_set():
                waits = [asyncio.create_task(due_vacuum.wait()),
                         asyncio.create_task(stop.wait())]
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                for task in waits:
                    task.cancel()
                if stop.is_set():
                    break
                due_vacuum.clear()
                async with pool.acquire() as conn:
                    await vacuum(conn, SCHEMA)

        async def sampler() -> None:
            async with pool.acquire() as conn:
                vacuuming_since: float | None = None
                while not stop.is_set():
                    s = await _sample(conn, time.monotonic() - started)
                    phase.samples.append(s)
                    toast_busy = "pg_toast" in s.vacuuming
                    if toast_busy and vacuuming_since is None:
                        vacuuming_since = s.t
                    elif not toast_busy and vacuuming_since is not None:
                        phase.toast_vacuum_s.append(s.t - vacuuming_since)
                        vacuuming_since = None
                    await asyncio.sleep(SAMPLE_EVERY)

        async with pool.acquire() as conn:
            wal_start = await conn.fetchval("SELECT pg_current_wal_insert_lsn()")
        cpu, client, busy = server_cpu(pg.pid), time.process_time(), _machine_busy()
        load_start = _load()
        tasks = [asyncio.create_task(writer(log, size)) for log, size in zip(logs, sizes,
                                                                             strict=True)]
        tasks += [asyncio.create_task(retention()), asyncio.create_task(sampler()),
                  asyncio.create_task(vacuumer())]
        await asyncio.sleep(args.seconds)
        stop.set()
        await asyncio.gather(*tasks)
        phase.server_cpu_s = server_cpu(pg.pid) - cpu
        phase.client_cpu_s = time.process_time() - client
        phase.outside_cpu_s = (_machine_busy() - busy - phase.server_cpu_s
                               - phase.client_cpu_s)
        phase.load = (load_start, _load())
        async with pool.acquire() as conn:
            phase.wal = int(await conn.fetchval(
                "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1)", wal_start))
        if phase.retention_passes:
            phase.retention_ms /= phase.retention_passes
        return phase
    finally:
        await pool.close()


@dataclass
class Summary:
    phase: str
    written_gib: float
    retained_mib: float  # data retained (size_bytes), mean over the window
    first_reuse_s: float  # when the first TOAST autovacuum ended (-1: none did)
    window_s: float  # the window: from then to the end (none: the second half)
    steady_mib: float  # both tables' total size, mean over the window
    window_max_mib: float
    max_mib: float  # over the whole phase
    steady_ratio: float  # steady size / data retained
    overhead_mib: float  # size - data retained: dead or free space, mean over the window
    overhead_max_mib: float
    overhead_s: float  # the mean overhead in seconds of appends at the phase's rate
    growth_mib_min: float  # over the window: ~0 when vacuum keeps up
    toast_mib: float  # TOAST table + its index, mean over the window
    data_heap_index_mib: float  # batch_data's heap and index
    batches_mib: float  # batches' heap and indexes
    dead_toast_max: int
    autovacuums: tuple[int, int, int]  # over the phase: batch_data, TOAST, batches
    toast_vacuum_every_s: float  # mean interval between TOAST autovacuums (0: < 2)
    toast_vacuum_s: float  # mean duration of a TOAST pass seen by the sampler
    retention_ms: float
    delete_mib_s: float  # bytes deleted per second of retention pass
    wal_per_written: float
    server_cpu_s_per_gib: float
    outside_cores: float  # the rest of the machine's busy CPU, in cores
    load: tuple[float, float]


def summarise(p: Phase) -> Summary:
    """The steady state is what follows the first TOAST autovacuum: before
    it, nothing deleted is reusable yet and the tables only grow."""
    toast_done = [s.t for prev, s in pairwise(p.samples)
                  if s.autovacuums[1] > prev.autovacuums[1]]
    first = toast_done[0] if toast_done else -1.0
    window = ([s for s in p.samples if s.t >= first] if toast_done else
              [s for s in p.samples if s.t >= p.seconds / 2])
    if len(window) < 2:
        raise RuntimeError(f"{p.name}: {len(window)} samples after the first TOAST "
                           "autovacuum: too short a run")
    mib = float(1 << 20)
    retained = sum(s.retained for s in window) / len(window)
    steady = sum(s.total for s in window) / len(window)
    span = window[-1].t - window[0].t
    growth = (window[-1].total - window[0].total) / mib / (span / 60)
    runs = tuple(b - a for a, b in zip(p.samples[0].autovacuums, p.samples[-1].autovacuums,
                                       strict=True))
    every = ((toast_done[-1] - toast_done[0]) / (len(toast_done) - 1)
             if len(toast_done) > 1 else 0.0)
    gib = p.written / 2**30
    overhead = [s.total - s.retained for s in window]
    rate = p.written / p.seconds
    busy = p.retention_ms / 1000 * p.retention_passes
    return Summary(
        p.name, gib, retained / mib, first, span, steady / mib,
        max(s.total for s in window) / mib, max(s.total for s in p.samples) / mib,
        steady / retained, sum(overhead) / len(overhead) / mib, max(overhead) / mib,
        sum(overhead) / len(overhead) / rate, growth,
        sum(s.data_toast + s.data_toast_index for s in window) / len(window) / mib,
        sum(s.data_heap + s.data_index for s in window) / len(window) / mib,
        sum(s.batches_heap + s.batches_indexes for s in window) / len(window) / mib,
        max(s.dead_toast for s in p.samples), (runs[0], runs[1], runs[2]), every,
        sum(p.toast_vacuum_s) / len(p.toast_vacuum_s) if p.toast_vacuum_s else 0.0,
        p.retention_ms, p.deleted / mib / busy if busy else 0.0, p.wal / p.written,
        p.server_cpu_s / gib, p.outside_cpu_s / p.seconds, p.load)


def _line(s: Summary) -> str:
    reuse = (f"space reusable from {s.first_reuse_s:4.0f} s" if s.first_reuse_s >= 0 else
             "no TOAST autovacuum finished")
    return (f"{s.phase:11} wrote {s.written_gib:5.2f} GiB  {reuse}; over the last "
            f"{s.window_s:4.0f} s: retained {s.retained_mib:6.1f} MiB, size {s.steady_mib:7.1f} "
            f"MiB ({s.steady_ratio:5.2f}x) max {s.window_max_mib:7.1f}, over the retained "
            f"{s.overhead_mib:6.1f} MiB = {s.overhead_s:4.0f} s of appends (max "
            f"{s.overhead_max_mib:6.1f}), growth "
            f"{s.growth_mib_min:+7.1f} MiB/min (TOAST {s.toast_mib:7.1f}, data heap+index "
            f"{s.data_heap_index_mib:5.2f}, batches {s.batches_mib:5.2f} MiB)  largest "
            f"{s.max_mib:7.1f} MiB  dead TOAST max {s.dead_toast_max:7}  autovacuums "
            f"data/TOAST/batches {s.autovacuums[0]}/{s.autovacuums[1]}/{s.autovacuums[2]} "
            f"(TOAST every {s.toast_vacuum_every_s:4.0f} s, pass {s.toast_vacuum_s:4.1f} s)  "
            f"retention pass {s.retention_ms:5.0f} ms ({s.delete_mib_s:5.1f} MiB/s deleted)  "
            f"WAL {s.wal_per_written:5.3f}x  server "
            f"CPU {s.server_cpu_s_per_gib:4.1f} s/GiB  outside {s.outside_cores:4.2f} cores, "
            f"load {s.load[0]:.1f}->{s.load[1]:.1f}")


def _trace(p: Phase) -> str:
    """One line per ~10 s: the sizes and dead tuples over time."""
    out = [f"-- {p.name}: t(s) retained/TOAST/total MiB, dead TOAST, autovacuums, vacuuming"]
    step = max(1, int(10 / SAMPLE_EVERY))
    for s in p.samples[::step]:
        out.append(f"   {s.t:5.0f} {s.retained / 2**20:7.1f} {s.data_toast / 2**20:7.1f} "
                   f"{s.total / 2**20:7.1f}  {s.dead_toast:7}  {s.autovacuums}  {s.vacuuming}")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=150, help="per phase")
    parser.add_argument("--mib-s", type=float, default=24, help="total append rate")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--retained-mib", type=int, default=48, help="per partition")
    parser.add_argument("--every", type=float, default=3, help="seconds between passes")
    parser.add_argument("--phases", default="defaults,migration3,naptime10s,vacuum")
    parser.add_argument("--trace", action="store_true", help="print sizes over time too")
    parser.add_argument("--json", help="write the samples and summaries here too")
    args = parser.parse_args()
    names = args.phases.split(",")
    unknown = set(names) - set(PHASES)
    if unknown:
        parser.error(f"unknown phases {sorted(unknown)}: choose from {sorted(PHASES)}")
    phases = []
    for name in names:
        with PostgresServer(PHASES[name]) as pg:
            phase = asyncio.run(_phase(pg, name, args))
        phases.append(phase)
        if args.trace:
            print(_trace(phase), flush=True)
        print(_line(summarise(phase)), flush=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump([{"summary": asdict(summarise(p)), "phase": asdict(p)} for p in phases],
                      out, indent=1)


if __name__ == "__main__":
    main()
