"""Retention's delete over pgstore's schema: move a partition's log start and
drop every batch wholly below it, index rows and bytes, in one statement.

    new_start = await start_for_size(conn, schema, log_id, retention_bytes)
    deleted = await delete_below(conn, schema, log_id, leader_epoch, new_start)
    await vacuum(conn, schema)   # now and then, outside a transaction

Retention (retention.ms, retention.bytes), DeleteRecords and the important
consumers' holds (``pgstore.important``) all end here: whoever decided where
the log start goes, the delete is the same (docs/cluster-design.md,
"Retention, compaction and bloat").

``delete_below`` is one statement, so one transaction whether or not the
caller's connection is in one:

1. it locks the partition row where the leader epoch is still the caller's
   and ``new_start`` is within the log (at most the log end), as an append's
   fence does; a moved epoch matches nothing and the rest deletes nothing;
2. it deletes the ``batches`` rows whose last offset is below ``new_start``:
   a batch holding ``new_start`` stays whole (Kafka deletes whole segments
   and keeps the batch a DeleteRecords offset falls in; a read at the log
   start returns that batch, the consumer skips the records before it);
3. it deletes those batches' ``batch_data`` rows (their TOAST chunks go with
   them); the foreign key from ``batches`` is checked at the end of the
   statement, when neither is left;
4. it sets the log start (never backwards) and takes the deleted bytes off
   the partition's size.

A log start moved backwards or to where it is already deletes nothing and
succeeds. Beyond the log end it raises ``OffsetOutOfRange`` (Kafka's answer
to DeleteRecords past the high watermark); under a moved epoch ``Fenced``
(``pgstore.batch_log``'s), with nothing deleted either way.

The deleted rows are dead tuples until vacuum reclaims them: the space is
reused by later appends only once the TOAST table of ``batch_data`` has been
vacuumed. Autovacuum visits a database once per ``autovacuum_naptime`` (a
server setting, 1 min by default; migration 3 lifts its throttle and lowers
its trigger on these tables), so the engine's retention also calls
``vacuum`` itself once it has deleted a good part of the data retained
(docs/cluster-design.md has the figures: 4 s of appends over the retained
data with it, 78 s with autovacuum alone).
"""

from __future__ import annotations

from dataclasses import dataclass

from .batch_log import Fenced, UnknownLog
from .migrate import Connection, quoted


class OffsetOutOfRange(ValueError):
    """The new log start is past the partition's log end: nothing was deleted."""


@dataclass(frozen=True, slots=True)
class Deleted:
    """What one ``delete_below`` did."""

    log_start_offset: int  # the partition's log start now
    batches: int  # index rows (and as many batch_data rows) deleted
    bytes: int  # the batches' bytes deleted (taken off the partition's size)


def _delete_sql(schema: str) -> str:
    s = quoted(schema)
    return f"""
        WITH fence AS (
            SELECT log_id FROM {s}.partitions
             WHERE log_id = $1 AND leader_epoch = $2 AND $3 <= log_end_offset
               FOR UPDATE
        ), gone AS (
            DELETE FROM {s}.batches b USING fence
             WHERE b.log_id = fence.log_id AND b.last_offset < $3
         RETURNING b.data_id, b.size
        ), data AS (
            DELETE FROM {s}.batch_data d USING gone
             WHERE d.log_id = $1 AND d.data_id = gone.data_id
         RETURNING d.data_id
        )
        UPDATE {s}.partitions p
           SET log_start_offset = greatest(p.log_start_offset, $3),
               size_bytes = p.size_bytes - (SELECT coalesce(sum(size), 0) FROM gone)
          FROM fence
         WHERE p.log_id = fence.log_id
     RETURNING p.log_start_offset,
               (SELECT count(*) FROM gone) AS batches,
               (SELECT count(*) FROM data) AS blobs,
               (SELECT coalesce(sum(size), 0) FROM gone) AS bytes"""


async def delete_below(conn: Connection, schema: str, log_id: int, leader_epoch: int,
                       new_start: int) -> Deleted:
    """Make ``new_start`` the log start of ``log_id``, deleting every batch
    wholly below it, fenced by ``leader_epoch`` (see the module's docstring)."""
    row = await conn.fetchrow(_delete_sql(schema), log_id, leader_epoch, new_start)
    if row is None:
        found = await conn.fetchrow(
            f"SELECT leader_epoch, log_end_offset FROM {quoted(schema)}.partitions "
            "WHERE log_id = $1", log_id)
        if found is None:
            raise UnknownLog(f"no partition has log id {log_id} in schema {schema}")
        epoch, end = int(found["leader_epoch"]), int(found["log_end_offset"])
        if epoch != leader_epoch:
            raise Fenced(f"log {log_id}: nothing deleted: the partition is at leader epoch "
                         f"{epoch}, this writer's is {leader_epoch}", epoch, end)
        raise OffsetOutOfRange(f"log {log_id}: nothing deleted: the new log start "
                               f"{new_start} is past the log end {end}")
    if row["batches"] != row["blobs"]:  # every index row names its own bytes
        raise AssertionError(f"log {log_id}: deleted {row['batches']} batches but "
                             f"{row['blobs']} rows of bytes")
    return Deleted(int(row["log_start_offset"]), int(row["batches"]), int(row["bytes"]))


async def start_for_size(conn: Connection, schema: str, log_id: int,
                         retention_bytes: int) -> int:
    """Where retention.bytes puts the log start: as in Kafka, the oldest
    batches go only while what remains is still at least ``retention_bytes``
    (the current log start when nothing is due)."""
    s = quoted(schema)
    row = await conn.fetchrow(
        f"SELECT p.log_start_offset, p.log_end_offset, p.size_bytes - $2 AS excess "
        f"  FROM {s}.partitions p WHERE p.log_id = $1", log_id, retention_bytes)
    if row is None:
        raise UnknownLog(f"no partition has log id {log_id} in schema {schema}")
    if row["excess"] <= 0:
        return int(row["log_start_offset"])
    first_kept = await conn.fetchval(
        "SELECT base_offset FROM (SELECT base_offset, sum(size) OVER (ORDER BY base_offset) "
        f"AS running FROM {s}.batches WHERE log_id = $1) b "
        "WHERE running > $2 ORDER BY base_offset LIMIT 1", log_id, row["excess"])
    return int(row["log_end_offset"] if first_kept is None else first_kept)


async def vacuum(conn: Connection, schema: str) -> None:
    """Vacuum ``batches`` and ``batch_data`` (its TOAST table too) now, so the
    space retention freed is reused without waiting for autovacuum's next
    visit (once per ``autovacuum_naptime``). Outside a transaction; the role
    owns the tables (it migrated them). A table another vacuum holds is
    skipped: that one does the work."""
    s = quoted(schema)
    await conn.execute(f"VACUUM (SKIP_LOCKED) {s}.batches, {s}.batch_data")
