"""One partition's record batches over pgstore's schema: append and read.

A library-level piece of the engine (docs/cluster-design.md, "What one
PostgreSQL transaction is"), not yet behind the seam: no producer state, no
transactions, no segments, no retention. The caller has checked each batch
(``tablets.validate``) before it comes here.

    log = await BatchLog.open(pool, "kafka_gateway", log_id)
    base_offsets = await log.append([batch, batch, ...])   # one transaction
    batches = await log.read(offset, max_bytes)

``append`` gives a group of batches consecutive offsets from the log end,
stamps each with its base offset and the writer's leader epoch
(``tablets.batch.stamp``), and writes them in **one transaction**. It sets
the partition row's new log end and size, puts each batch's bytes in
``batch_data`` and puts its index row in ``batches``. Its first statement
updates the partition row only where the leader epoch is still the writer's
and the log end is still the one it assigned offsets from. When either
moved, nothing is written and ``append`` raises ``Fenced``. An epoch moves
when another gateway took the partition; the log end moves when another
writer appended. That update also locks the row, so
two writers of one partition are serialised and the second finds the log end
moved. Nothing rests on a lease.

When the outcome of a write is unknown (the connection broke before the
answer), the log's state is in doubt. The next ``append`` then rereads the
partition row, which says whether the write landed, before it assigns
offsets again.

``read`` returns whole batches, from the one holding ``offset``, in order, up
to ``max_bytes`` (the first one whatever its size with ``min_one``), none at
or past ``until`` (the high watermark). A transactional batch stored before
its commit gave it offsets (``shifted``) has its base offset patched.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg

from tablets import batch as batch_header

from .migrate import Connection, quoted

# A read scans at most this many index rows: twice as many as batches of
# the partition's recent mean size fill max_bytes, within these bounds. The
# window that stops at max_bytes costs per row scanned (a bound of 5000 for
# a 4 MiB read of 16 KiB batches read 22 % slower than one of 300). A read
# of batches much smaller than the mean returns fewer bytes than asked; the
# consumer asks again.
MAX_BATCHES_PER_READ = 5000
MIN_BATCHES_PER_READ = 16
RECENT_BATCHES = 64  # the mean batch size is over about this many
_INT64 = struct.Struct(">q")


class Fenced(Exception):
    """The partition's leader epoch or log end moved: this writer no longer
    leads it, or another wrote to it. Nothing of the append was written."""

    def __init__(self, message: str, leader_epoch: int, log_end_offset: int) -> None:
        super().__init__(message)
        self.leader_epoch = leader_epoch  # as found in the database
        self.log_end_offset = log_end_offset


class UnknownLog(LookupError):
    """No partition row has this log id (its topic was deleted)."""


@dataclass(slots=True)
class _State:
    leader_epoch: int
    log_start_offset: int
    log_end_offset: int
    running_max_timestamp: int
    mean_batch_bytes: float  # recent batches' (0: none yet)


class BatchLog:
    """One partition's batches, written by its leader at ``leader_epoch``."""

    def __init__(self, pool: asyncpg.Pool, schema: str, log_id: int, state: _State,
                 name: str, sequence: str) -> None:
        self.pool = pool
        self.schema = schema
        self.log_id = log_id
        self.name = name  # topic-partition, for messages
        self._state = state
        self._in_doubt = False
        self._appending = asyncio.Lock()  # offsets are assigned by one append at a time
        s = quoted(schema)
        self._sequence = sequence  # batch_data's identity sequence
        # The fence: the partition row moves only where the epoch and the log
        # end are the writer's; it also hands out the ids of the batches' bytes.
        self._fence_sql = f"""
            UPDATE {s}.partitions
               SET log_end_offset = $4, size_bytes = size_bytes + $5
             WHERE log_id = $1 AND leader_epoch = $2 AND log_end_offset = $3
         RETURNING (SELECT array_agg(nextval($6::regclass)) FROM generate_series(1, $7))"""
        self._data_sql = (f"INSERT INTO {s}.batch_data (log_id, data_id, data) "
                          "OVERRIDING SYSTEM VALUE VALUES ($1, $2, $3)")
        self._index_sql = (f"INSERT INTO {s}.batches (log_id, base_offset, last_offset, "
                           "max_timestamp, running_max_timestamp, size, data_id) "
                           "VALUES ($1, $2, $3, $4, $5, $6, $7)")
        self._read_sql = read_sql(s)

    # ------------------------------------------------------------ opening
    @classmethod
    async def open(cls, pool: asyncpg.Pool, schema: str, log_id: int) -> BatchLog:
        """The log of partition ``log_id``, written at the epoch its row holds now."""
        async with pool.acquire() as conn:
            state, name = await _load(conn, quoted(schema), log_id)
            sequence = await conn.fetchval("SELECT pg_get_serial_sequence($1, 'data_id')",
                                           f"{quoted(schema)}.batch_data")
        return cls(pool, schema, log_id, state, name, sequence)

    @property
    def leader_epoch(self) -> int:
        return self._state.leader_epoch

    @property
    def log_start_offset(self) -> int:
        return self._state.log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._state.log_end_offset

    # ------------------------------------------------------------ append
    async def append(self, batches: Sequence[bytes | memoryview]) -> list[int]:
        """Append ``batches`` (each one checked v2 batch) in one transaction;
        their base offsets. Raises ``Fenced`` (nothing written) when the
        partition's epoch or log end moved."""
        if not batches:
            return []
        headers = []
        for data in batches:
            view = memoryview(data)
            parsed = batch_header.parse_batches(view, verify_crc=False)
            if len(parsed) != 1:
                raise ValueError(f"{self.name}: one batch per item, not {len(parsed)}")
            headers.append((view, parsed[0]))
        async with self._appending:
            if self._in_doubt:
                await self._reload()
            state = self._state
            offset = state.log_end_offset
            running = state.running_max_timestamp
            bases: list[int] = []
            lasts: list[int] = []
            max_timestamps: list[int] = []
            running_maxes: list[int] = []
            sizes: list[int] = []
            stamped: list[bytes] = []
            for view, header in headers:
                data = batch_header.stamp(view, header, offset, state.leader_epoch)
                running = max(running, header.max_timestamp)
                bases.append(offset)
                lasts.append(offset + header.last_offset_delta)
                max_timestamps.append(header.max_timestamp)
                running_maxes.append(running)
                sizes.append(len(data))
                stamped.append(data)
                offset += header.last_offset_delta + 1
            nbytes = sum(sizes)
            try:
                async with self.pool.acquire() as conn, conn.transaction():
                    ids = await conn.fetchval(
                        self._fence_sql, self.log_id, state.leader_epoch,
                        state.log_end_offset, offset, nbytes, self._sequence, len(stamped))
                    if ids is not None:
                        await conn.executemany(self._data_sql, [
                            (self.log_id, data_id, data)
                            for data_id, data in zip(ids, stamped, strict=True)])
                        await conn.executemany(self._index_sql, [
                            (self.log_id, *entry, data_id) for entry, data_id in zip(
                                zip(bases, lasts, max_timestamps, running_maxes, sizes,
                                    strict=True), ids, strict=True)])
            except (asyncpg.PostgresError, OSError, asyncio.CancelledError,
                    asyncpg.InterfaceError,
                    # a backend terminated between two statements (its session
                    # idle in the transaction too long) may surface as a
                    # protocol state clash rather than a lost connection
                    asyncpg.InternalClientError):
                # Landed or not (a lost answer to COMMIT): the next append
                # rereads the partition first.
                self._in_doubt = True
                raise
            if ids is None:
                await self._reload()
                now = self._state
                raise Fenced(
                    f"{self.name}: not written: the partition is at leader epoch "
                    f"{now.leader_epoch} and log end {now.log_end_offset}, this writer "
                    f"assigned offsets at epoch {state.leader_epoch} from "
                    f"{state.log_end_offset}", now.leader_epoch, now.log_end_offset)
            state.log_end_offset = offset
            state.running_max_timestamp = running
            for size in sizes:
                state.mean_batch_bytes += ((size - state.mean_batch_bytes) /
                                           (RECENT_BATCHES if state.mean_batch_bytes else 1))
            return bases

    async def _reload(self) -> None:
        """Reread the partition row and the newest running max timestamp. The
        epoch kept is this writer's, so a moved epoch still fences it."""
        async with self.pool.acquire() as conn:
            state, _ = await _load(conn, quoted(self.schema), self.log_id)
        mine, found = self._state.leader_epoch, state.leader_epoch
        state.leader_epoch = mine
        self._state = state
        self._in_doubt = False
        if found != mine:
            raise Fenced(f"{self.name}: not written: the partition moved to leader epoch "
                         f"{found}; this writer's is {mine}", found, state.log_end_offset)

    # ------------------------------------------------------------ read
    async def read(self, offset: int, max_bytes: int, until: int | None = None,
                   min_one: bool = True) -> list[bytes]:
        """Whole batches from the one holding ``offset`` (see the module's docstring);
        ``until``: none from this offset on (default: the log end as this writer knows it)."""
        end = self._state.log_end_offset if until is None else until
        cap = read_cap(max_bytes, self._state.mean_batch_bytes)
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(self._read_sql, self.log_id, offset, end, max_bytes,
                                    min_one, cap)
        out = []
        for row in rows:
            data: bytes = row["data"]
            if row["shifted"]:
                data = _INT64.pack(row["base_offset"]) + data[8:]
            out.append(data)
        return out


def read_cap(max_bytes: int, mean_batch_bytes: float) -> int:
    """The index rows a read of ``max_bytes`` scans at most (module docstring)."""
    cap = max_bytes // batch_header.HEADER_SIZE + 1
    if mean_batch_bytes:
        cap = min(cap, max(MIN_BATCHES_PER_READ, int(2 * max_bytes / mean_batch_bytes) + 1))
    return max(1, min(MAX_BATCHES_PER_READ, cap))


def read_sql(s: str) -> str:
    """The read of whole batches: $1 log id, $2 offset, $3 none from here on
    (the high watermark), $4 max bytes, $5 min one, $6 index rows scanned at most.

    The batch holding $2 (else the first after it), then on while the bytes
    before a batch plus its own stay within $4."""
    return f"""
        WITH first AS (
            SELECT coalesce((
                SELECT CASE WHEN last_offset >= $2 THEN base_offset END
                  FROM {s}.batches
                 WHERE log_id = $1 AND base_offset <= $2
                 ORDER BY base_offset DESC LIMIT 1), $2) AS at
        ), picked AS (
            SELECT b.base_offset, b.shifted, b.data_id, b.size,
                   sum(b.size) OVER (ORDER BY b.base_offset) - b.size AS before
              FROM {s}.batches b, first
             WHERE b.log_id = $1 AND b.base_offset >= first.at AND b.base_offset < $3
             ORDER BY b.base_offset
             LIMIT $6
        )
        SELECT p.base_offset, p.shifted, d.data
          FROM picked p
          JOIN {s}.batch_data d ON d.log_id = $1 AND d.data_id = p.data_id
         WHERE p.before + p.size <= $4 OR (p.before = 0 AND $5)
         ORDER BY p.base_offset"""


async def _load(conn: Connection, schema: str, log_id: int) -> tuple[_State, str]:
    row = await conn.fetchrow(
        f"SELECT p.leader_epoch, p.log_start_offset, p.log_end_offset, t.name, p.partition, "
        f"       (SELECT running_max_timestamp FROM {schema}.batches b "
        f"         WHERE b.log_id = p.log_id ORDER BY base_offset DESC LIMIT 1) AS running, "
        f"       (SELECT avg(size) FROM (SELECT size FROM {schema}.batches b "
        f"         WHERE b.log_id = p.log_id ORDER BY base_offset DESC "
        f"         LIMIT {RECENT_BATCHES}) recent) AS mean "
        f"  FROM {schema}.partitions p JOIN {schema}.topics t USING (topic_id) "
        f" WHERE p.log_id = $1", log_id)
    if row is None:
        raise UnknownLog(f"no partition has log id {log_id} in schema {schema}")
    running = -1 if row["running"] is None else int(row["running"])
    mean = 0.0 if row["mean"] is None else float(row["mean"])
    state = _State(int(row["leader_epoch"]), int(row["log_start_offset"]),
                   int(row["log_end_offset"]), running, mean)
    return state, f"{row['name']}-{row['partition']}"
