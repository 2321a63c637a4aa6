"""How to store record batches in PostgreSQL: measured (docs/cluster-design.md).

    python3 -m bench.pg_batches [--mib 64] [--json out.json]

On a throwaway server (testkit/postgres.py, default settings, fsync on), for
batches of 16 KiB and 1 MiB of random bytes (incompressible, as a compressed
batch is):

- where the bytes go: a ``bytea`` column with the default ``STORAGE EXTENDED``
  (TOAST tries to compress, then stores out of line), with ``STORAGE
  EXTERNAL`` (out of line, never compressed), or a large object
  (``lo_from_bytea``; the row keeps its oid);
- how they are sent: ``executemany`` of an INSERT, or binary ``COPY``
  (asyncpg's ``copy_records_to_table``); and psycopg 3's async binary COPY
  and ``executemany`` for the same table, to choose the client;
- each write transaction carries 4 MiB of batches (a group commit), and one
  case commits each 16 KiB batch alone (the cost of one durable commit);
- the CPU of the writes, PostgreSQL's (all its processes) and the client's,
  per GiB written: less noisy than rates on a shared machine;
- reads: every batch back, by offset range, 4 MiB per query;
- the engine's own path, ``pgstore.batch_log``: real v2 batches (16 records
  of random bytes, flagged zstd), each group one statement with the leader
  epoch check, read back with its read query;
- the table's size afterwards (TOAST and indexes included) and the WAL the
  writes made, against the bytes written: stored once, uncompressed (and
  written twice to disk: WAL, then the table).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from dataclasses import asdict, dataclass

import asyncpg
import psycopg

from bench.meter import sample_tree
from pgstore.batch_log import BatchLog
from pgstore.migrate import migrate
from testkit.batches import with_payload
from testkit.postgres import PostgresServer

GROUP_BYTES = 4 << 20


def server_cpu(postmaster: int) -> float:
    """CPU seconds used so far by the server: the postmaster and its descendants
    (backends, WAL writer, checkpointer...; a child that exited is counted in the
    postmaster's children times): bench.meter.sample_tree."""
    return sample_tree(postmaster).cpu_s


@dataclass
class Result:
    client: str
    storage: str
    method: str
    batch_bytes: int
    batches_per_txn: int
    batches: int
    write_mib_s: float
    write_txn_ms: float  # mean time of one write transaction
    read_mib_s: float
    table_bytes: int  # pg_total_relation_size, large objects included
    written_bytes: int
    wal_bytes: int = -1  # WAL written by the write transactions (asyncpg cases)
    server_cpu_s_per_gib: float = 0.0  # PostgreSQL's CPU for the writes, per GiB written
    client_cpu_s_per_gib: float = 0.0  # this process's, likewise


def _table_sql(name: str, storage: str) -> list[str]:
    column = "data_oid oid NOT NULL" if storage == "large_object" else "data bytea NOT NULL"
    sql = [f"DROP TABLE IF EXISTS {name}",
           f"CREATE TABLE {name} (partition_id bigint NOT NULL, base_offset bigint NOT NULL, "
           f"{column}, PRIMARY KEY (partition_id, base_offset))"]
    if storage == "external":
        sql.append(f"ALTER TABLE {name} ALTER COLUMN data SET STORAGE EXTERNAL")
    return sql


async def _size(conn: asyncpg.Connection, table: str, storage: str) -> int:
    size = int(await conn.fetchval("SELECT pg_total_relation_size($1)", table))
    if storage == "large_object":
        size += int(await conn.fetchval("SELECT pg_total_relation_size('pg_largeobject')"))
    return size


@dataclass(frozen=True)
class Case:
    client: str  # asyncpg or psycopg
    storage: str  # extended, external or large_object
    method: str  # executemany or copy
    batch_bytes: int
    batches_per_txn: int
    total_bytes: int


class _Meter:
    """Wall time, this process's CPU and the server's CPU over one phase."""

    def __init__(self, postmaster: int) -> None:
        self.postmaster = postmaster

    def __enter__(self) -> _Meter:
        self.wall = time.perf_counter()
        self.client = time.process_time()
        self.server = server_cpu(self.postmaster)
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.client = time.process_time() - self.client
        self.server = server_cpu(self.postmaster) - self.server


async def _asyncpg_case(dsn: str, postmaster: int, case: Case) -> Result:
    conn = await asyncpg.connect(dsn)
    table, size, storage = "b", case.batch_bytes, case.storage
    try:
        for sql in _table_sql(table, storage):
            await conn.execute(sql)
        if storage == "large_object":
            await conn.execute("SELECT lo_unlink(oid) FROM pg_largeobject_metadata")
            # Empty pages at the end are cut off: the previous case's size is not counted.
            await conn.execute("VACUUM pg_largeobject")
        count = case.total_bytes // size
        payloads = [os.urandom(size) for _ in range(min(count, 64))]
        rows = [(1, i, payloads[i % len(payloads)]) for i in range(count)]
        txns = 0
        wal_start = await conn.fetchval("SELECT pg_current_wal_insert_lsn()")
        with _Meter(postmaster) as writing:
            for at in range(0, count, case.batches_per_txn):
                chunk = rows[at:at + case.batches_per_txn]
                async with conn.transaction():
                    if storage == "large_object":
                        await conn.executemany(
                            f"INSERT INTO {table} VALUES ($1, $2, lo_from_bytea(0, $3))", chunk)
                    elif case.method == "copy":
                        await conn.copy_records_to_table(table, records=chunk)
                    else:
                        await conn.executemany(f"INSERT INTO {table} VALUES ($1, $2, $3)",
                                               chunk)
                txns += 1
        wal = int(await conn.fetchval(
            "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1)", wal_start))
        column = "lo_get(data_oid)" if storage == "large_object" else "data"
        per_read = max(1, GROUP_BYTES // size)
        read = 0
        offset = 0
        with _Meter(postmaster) as reading:
            while offset < count:
                got = await conn.fetch(
                    f"SELECT base_offset, {column} AS data FROM {table} WHERE partition_id = 1 "
                    f"AND base_offset >= $1 ORDER BY base_offset LIMIT $2", offset, per_read)
                read += sum(len(r["data"]) for r in got)
                offset = got[-1]["base_offset"] + 1
        assert read == count * size, (read, count * size)
        return _result(case, count, txns, writing, reading,
                       await _size(conn, table, storage), wal)
    finally:
        await conn.close()


async def _psycopg_case(dsn: str, postmaster: int, case: Case) -> Result:
    table, size = "b", case.batch_bytes
    conn = await psycopg.AsyncConnection.connect(dsn)
    try:
        for sql in _table_sql(table, case.storage):
            await conn.execute(sql)
        await conn.commit()
        count = case.total_bytes // size
        payloads = [os.urandom(size) for _ in range(min(count, 64))]
        rows = [(1, i, payloads[i % len(payloads)]) for i in range(count)]
        txns = 0
        async with conn.cursor() as cur:
            await cur.execute("SELECT pg_current_wal_insert_lsn()::text")
            fetched = await cur.fetchone()
            assert fetched is not None
            wal_start = fetched[0]
        await conn.commit()
        with _Meter(postmaster) as writing:
            for at in range(0, count, case.batches_per_txn):
                chunk = rows[at:at + case.batches_per_txn]
                async with conn.transaction(), conn.cursor() as cur:
                    if case.method == "copy":
                        async with cur.copy(f"COPY {table} FROM STDIN (FORMAT BINARY)") as copy:
                            copy.set_types(["int8", "int8", "bytea"])
                            for row in chunk:
                                await copy.write_row(row)
                    else:
                        await cur.executemany(f"INSERT INTO {table} VALUES (%s, %s, %b)",
                                              chunk)
                txns += 1
        per_read = max(1, GROUP_BYTES // size)
        read = 0
        offset = 0
        with _Meter(postmaster) as reading:
            async with conn.cursor(binary=True) as cur:
                while offset < count:
                    await cur.execute(
                        f"SELECT base_offset, data FROM {table} WHERE partition_id = 1 "
                        "AND base_offset >= %s ORDER BY base_offset LIMIT %s",
                        (offset, per_read))
                    got = await cur.fetchall()
                    read += sum(len(r[1]) for r in got)
                    offset = got[-1][0] + 1
            await conn.commit()
        assert read == count * size, (read, count * size)
        async with conn.cursor() as cur:
            await cur.execute(
                "SELECT pg_total_relation_size(%s), "
                "pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s::pg_lsn)", (table, wal_start))
            sizes = await cur.fetchone()
            assert sizes is not None
        return _result(case, count, txns, writing, reading, int(sizes[0]), int(sizes[1]))
    finally:
        await conn.close()


async def _pgstore_case(dsn: str, postmaster: int, case: Case) -> Result:
    """The engine's own append and read (pgstore.batch_log): v2 batches of
    random bytes (as zstd), each group one statement, with the epoch check."""
    size = case.batch_bytes
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    try:
        async with pool.acquire() as conn:
            await conn.execute("DROP SCHEMA IF EXISTS bench_pgstore CASCADE")
            await migrate(conn, "bench_pgstore")
            log_id = await conn.fetchval(
                "WITH t AS (INSERT INTO bench_pgstore.topics (topic_id, name, created_ms) "
                "VALUES (gen_random_uuid(), 'bench', 0) RETURNING topic_id) "
                "INSERT INTO bench_pgstore.partitions (topic_id, partition) "
                "SELECT topic_id, 0 FROM t RETURNING log_id")
            wal_start = await conn.fetchval("SELECT pg_current_wal_insert_lsn()")
        log = await BatchLog.open(pool, "bench_pgstore", log_id)
        count = case.total_bytes // size
        # 16 records a batch, zstd-flagged random bytes: incompressible.
        payloads = [with_payload(4, os.urandom(size - 61), record_count=16)
                    for _ in range(min(count, 64))]
        batches = [payloads[i % len(payloads)] for i in range(count)]
        txns = 0
        with _Meter(postmaster) as writing:
            for at in range(0, count, case.batches_per_txn):
                await log.append(batches[at:at + case.batches_per_txn])
                txns += 1
        read = 0
        offset = 0
        with _Meter(postmaster) as reading:
            while offset < log.log_end_offset:
                got = await log.read(offset, GROUP_BYTES)
                read += sum(len(b) for b in got)
                offset = log.log_end_offset if not got else (
                    int.from_bytes(got[-1][:8], "big") + 16)
        written = sum(len(b) for b in batches)
        assert read == written, (read, written)
        async with pool.acquire() as conn:
            wal = int(await conn.fetchval(
                "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1)", wal_start))
            table_bytes = int(await conn.fetchval(
                "SELECT pg_total_relation_size('bench_pgstore.batch_data') "
                "+ pg_total_relation_size('bench_pgstore.batches')"))
            await conn.execute("DROP SCHEMA bench_pgstore CASCADE")
        return _result(case, count, txns, writing, reading, table_bytes, wal)
    finally:
        await pool.close()


def _result(case: Case, count: int, txns: int, writing: _Meter, reading: _Meter,
            table_bytes: int, wal: int) -> Result:
    written = count * case.batch_bytes
    gib = written / 2**30
    return Result(case.client, case.storage, case.method, case.batch_bytes,
                  case.batches_per_txn, count, written / writing.wall / 2**20,
                  writing.wall / txns * 1000, written / reading.wall / 2**20, table_bytes,
                  written, wal, writing.server / gib, writing.client / gib)


def cases(mib: int) -> list[Case]:
    total = mib << 20
    out = []
    for size in (16 << 10, 1 << 20):
        per_txn = max(1, GROUP_BYTES // size)
        for storage in ("extended", "external"):
            for method in ("executemany", "copy"):
                out.append(Case("asyncpg", storage, method, size, per_txn, total))
        out.append(Case("asyncpg", "large_object", "executemany", size, per_txn, total))
        for method in ("executemany", "copy"):
            out.append(Case("psycopg", "external", method, size, per_txn, total))
        out.append(Case("pgstore", "external", "batch_log", size, per_txn, total))
    # One durable commit per 16 KiB batch: fsync-bound.
    out.append(Case("asyncpg", "external", "executemany", 16 << 10, 1, min(total, 8 << 20)))
    return out


async def run(dsn: str, postmaster: int, mib: int, repeat: int) -> list[Result]:
    """Every case ``repeat`` times, interleaved (the machine is shared: a slow
    moment spreads over all cases); the median run of each (by write rate)."""
    runs: dict[Case, list[Result]] = {}
    for _ in range(repeat):
        for case in cases(mib):
            measure = {"asyncpg": _asyncpg_case, "psycopg": _psycopg_case,
                       "pgstore": _pgstore_case}[case.client]
            runs.setdefault(case, []).append(await measure(dsn, postmaster, case))
    results = []
    for found in runs.values():
        middle = sorted(found, key=lambda r: r.write_mib_s)[len(found) // 2]
        print(_line(middle), flush=True)
        results.append(middle)
    return results


def _line(r: Result) -> str:
    return (f"{r.client:8} {r.storage:12} {r.method:11} {r.batch_bytes >> 10:5} KiB x"
            f"{r.batches_per_txn:4}/txn  write {r.write_mib_s:6.1f} MiB/s "
            f"({r.write_txn_ms:5.1f} ms/txn, CPU s/GiB server {r.server_cpu_s_per_gib:5.1f} "
            f"client {r.client_cpu_s_per_gib:5.1f})  read {r.read_mib_s:6.1f} MiB/s  "
            f"table {r.table_bytes / r.written_bytes:5.3f}x, WAL "
            f"{r.wal_bytes / r.written_bytes:5.3f}x of the bytes written")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=64, help="MiB written per case")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each case (median)")
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    with PostgresServer() as pg:
        assert pg.pid is not None
        results = asyncio.run(run(pg.dsn, pg.pid, args.mib, args.repeat))
    if args.json:
        with open(args.json, "w") as out:
            json.dump([asdict(r) for r in results], out, indent=1)


if __name__ == "__main__":
    main()
