"""The statements of a partition's log over pgstore's schema, built once per
schema (``LogSql(schema)``) and shared by every partition.

Every statement that writes checks the leader epoch first (a fence: the
change is refused when no row comes back), so a gateway whose partition was
claimed by another writes nothing (docs/cluster-design.md, "Fencing").
"""

from __future__ import annotations

from dataclasses import dataclass

from .batch_log import read_sql
from .migrate import Connection, quoted


@dataclass(slots=True)
class LogRow:
    """A partition's row as loaded (at start-up, or reread after a doubt)."""

    log_id: int
    leader_epoch: int
    log_start_offset: int
    log_end_offset: int
    size_bytes: int
    running_max_timestamp: int  # of the newest batch (-1: none)
    mean_batch_bytes: float = 0.0


class LogSql:
    def __init__(self, schema: str) -> None:
        s = self.schema = quoted(schema)
        # The append, in one statement (one round trip inside the group's
        # transaction), and its fence: the partition row moves only where the
        # epoch and the log end are the ones this leader assigned offsets
        # from; the bytes and their index row are written only if it moved.
        # No row back: nothing written. $1 log id, $2 epoch, $3 base offset,
        # $4 new log end, $5 size, $6 bytes, $7 last offset, $8 max
        # timestamp, $9 running max timestamp.
        self.append = f"""
            WITH moved AS (
                UPDATE {s}.partitions
                   SET log_end_offset = $4, size_bytes = size_bytes + $5
                 WHERE log_id = $1 AND leader_epoch = $2 AND log_end_offset = $3
             RETURNING log_id
            ), data AS (
                INSERT INTO {s}.batch_data (log_id, data)
                SELECT log_id, $6 FROM moved RETURNING data_id)
            INSERT INTO {s}.batches (log_id, base_offset, last_offset, max_timestamp,
                                     running_max_timestamp, size, data_id)
            SELECT $1, $3, $7, $8, $9, $5, data_id FROM data
         RETURNING base_offset"""
        # An idempotent retry is answered once its original is durable: the
        # log end never moves back, so reaching past it means it landed.
        self.landed = (f"SELECT 1 FROM {s}.partitions "
                       "WHERE log_id = $1 AND leader_epoch = $2 AND log_end_offset >= $3")
        # A transactional retry is answered once its original's pending row
        # is durable: $3 the transaction's instance, $4 the producer id,
        # epoch and base sequence as in the batch header (bytes 43 to 56).
        self.pending_landed = (
            f"SELECT 1 FROM {s}.partitions p WHERE p.log_id = $1 AND p.leader_epoch = $2 "
            f"AND EXISTS (SELECT 1 FROM {s}.pending_batches b WHERE b.log_id = $1 "
            "AND b.instance = $3 AND substring(b.header FROM 44 FOR 14) = $4)")
        self.epoch_fence = (f"SELECT 1 FROM {s}.partitions WHERE log_id = $1 "
                            "AND leader_epoch = $2 FOR UPDATE")
        self.put_producer = f"""
            INSERT INTO {s}.producers (log_id, producer_id, epoch, last_timestamp, recent)
            VALUES ($1, $2, $3, $4, $5)
            ON CONFLICT (log_id, producer_id) DO UPDATE
               SET epoch = excluded.epoch, last_timestamp = excluded.last_timestamp,
                   recent = excluded.recent"""
        self.delete_producer = (f"DELETE FROM {s}.producers "
                                "WHERE log_id = $1 AND producer_id = $2")
        self.producers = (f"SELECT producer_id, epoch, last_timestamp, recent "
                          f"FROM {s}.producers WHERE log_id = $1")
        self.read = read_sql(s)
        # The first batch whose running max timestamp reaches $2 is the first
        # whose own max does (batches_by_time: every writer of a log takes its
        # row's lock before it reads the newest running max, so the index is
        # in offset order).
        self.first_at_time = f"""
            SELECT base_offset FROM {s}.batches
             WHERE log_id = $1 AND running_max_timestamp >= $2
             ORDER BY running_max_timestamp, base_offset LIMIT 1"""
        # Retention's cut: the same batch, found in offset order from the log
        # start, so that it never rests on that order of the time index (rows
        # written before it was kept, or anything else that broke it, cost a
        # later cut, never a batch stamped after the cutoff). It scans the
        # expired batches, which the pass then deletes.
        self.first_unexpired = f"""
            SELECT base_offset FROM {s}.batches
             WHERE log_id = $1 AND running_max_timestamp >= $2
             ORDER BY base_offset LIMIT 1"""
        self.batch_from = f"""
            SELECT b.base_offset, b.shifted, d.data
              FROM {s}.batches b
              JOIN {s}.batch_data d ON d.log_id = b.log_id AND d.data_id = b.data_id
             WHERE b.log_id = $1 AND b.last_offset >= $2 AND b.base_offset < $3
               AND b.max_timestamp >= $4
             ORDER BY b.base_offset LIMIT 1"""
        # retention.bytes: the first batch to keep, while what remains is at
        # least retention.bytes (the oldest go while their sum fits $2).
        self.first_kept_for_size = f"""
            SELECT base_offset FROM (
                SELECT base_offset, sum(size) OVER (ORDER BY base_offset) AS upto
                  FROM {s}.batches WHERE log_id = $1 AND base_offset < $3) running
             WHERE upto > $2 ORDER BY base_offset LIMIT 1"""
        # Truncating the front: the new log start and size, then the batches
        # wholly below it with their bytes, in one statement.
        self.move_start = f"""
            UPDATE {s}.partitions p
               SET log_start_offset = $2, size_bytes = p.size_bytes - gone.freed
              FROM (SELECT coalesce(sum(size), 0) AS freed FROM {s}.batches
                     WHERE log_id = $1 AND last_offset < $2) gone
             WHERE p.log_id = $1 AND p.log_start_offset < $2
         RETURNING gone.freed"""
        # Where a step of a truncation stops: the base offset of the batch $3
        # batches after the one holding $2 (none: the step reaches the target).
        self.step_end = f"""
            SELECT base_offset FROM {s}.batches
             WHERE log_id = $1 AND last_offset >= $2
             ORDER BY base_offset OFFSET $3 LIMIT 1"""
        self.delete_below = f"""
            WITH gone AS (
                DELETE FROM {s}.batches WHERE log_id = $1 AND last_offset < $2
                RETURNING data_id)
            DELETE FROM {s}.batch_data
             WHERE log_id = $1 AND data_id IN (SELECT data_id FROM gone)"""
        self.partition_row = f"""
            SELECT p.leader_epoch, p.log_start_offset, p.log_end_offset, p.size_bytes,
                   (SELECT running_max_timestamp FROM {s}.batches b
                     WHERE b.log_id = p.log_id ORDER BY base_offset DESC LIMIT 1) AS running
              FROM {s}.partitions p WHERE p.log_id = $1"""


async def load_row(conn: Connection, sql: LogSql, log_id: int,
                   mean_batch_bytes: float = 0.0) -> LogRow | None:
    """The partition's row as PostgreSQL has it now (None: deleted)."""
    row = await conn.fetchrow(sql.partition_row, log_id)
    if row is None:
        return None
    running = row["running"]
    return LogRow(log_id, int(row["leader_epoch"]), int(row["log_start_offset"]),
                  int(row["log_end_offset"]), int(row["size_bytes"]),
                  -1 if running is None else int(running), mean_batch_bytes)
