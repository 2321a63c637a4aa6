"""The SQL of ``pgstore.txn_storage``, prepared once per schema."""

from __future__ import annotations

from .log_notices import ANNOUNCE_FROM_ROW


class TxnStatements:
    def __init__(self, s: str) -> None:
        """``s``: the schema's quoted name."""
        # A counter never moves back (setting the value it holds again is
        # allowed: a transaction's state rewrites its instance), and only from
        # the value this gateway last saw (a compare-and-set: two gateways taking the same block of
        # producer ids or instances from one view cannot both land); $3 NULL:
        # absent.
        self.counter = (
            f"INSERT INTO {s}.counters AS c (name, value) VALUES ($1, $2) "
            "ON CONFLICT (name) DO UPDATE SET value = excluded.value "
            "WHERE c.value = $3 AND excluded.value >= c.value RETURNING 1")
        self.read_counter = f"SELECT value FROM {s}.counters WHERE name = $1 FOR UPDATE"
        self.put_state = (
            f"INSERT INTO {s}.txn_states (transactional_id, state) VALUES ($1, $2) "
            "ON CONFLICT (transactional_id) DO UPDATE SET state = excluded.state")
        self.delete_state = f"DELETE FROM {s}.txn_states WHERE transactional_id = $1"
        self.put_partition = (
            f"INSERT INTO {s}.txn_partitions (transactional_id, instance, topic_id, partition, "
            "topic) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (transactional_id, instance, "
            "topic_id, partition) DO UPDATE SET topic = excluded.topic")
        self.delete_partition = (
            f"DELETE FROM {s}.txn_partitions WHERE transactional_id = $1 AND instance = $2 "
            "AND topic_id = $3 AND partition = $4")
        # A transactional append: the partition is still led at the appender's
        # epoch (the row share-locked, so the epoch cannot move before this
        # transaction ends), then the bytes once and the pending row naming them.
        self.pending_fence = (
            f"SELECT 1 FROM {s}.partitions WHERE log_id = $1 AND leader_epoch = $2 FOR SHARE")
        # The same for the coordinator's own batch in a cluster, in the same
        # one statement: also the transactional id's coordinator slot still
        # this gateway's at its epoch, that row share-locked too, so a slot
        # takeover waits for the batch, and a batch after it is refused
        # (``pgstore.txn_slots``, "the coordinator's own batches").
        self.pending_slot_fence = (
            f"SELECT 1 FROM {s}.partitions p, {s}.coordinator_slots c WHERE p.log_id = $1 "
            "AND p.leader_epoch = $2 AND c.slot = $3 AND c.leader_node = $4 "
            "AND c.leader_epoch = $5 FOR SHARE OF p, c")
        self.put_pending = (
            f"WITH d AS (INSERT INTO {s}.batch_data (log_id, data) VALUES ($1, $2) "
            "RETURNING data_id) "
            f"INSERT INTO {s}.pending_batches (log_id, instance, ordinal, header, size, data_id) "
            "SELECT $1, $3, $4, $5, $6, d.data_id FROM d")
        # A commit's publication, 1: the partition row takes the offsets at
        # its log end, only at the publisher's leader epoch ($2 NULL: a
        # partition another gateway leads, whatever its epoch); the row stays
        # locked to the end of the transaction, so nothing else appends in
        # between, and the leader's appends, which check the log end, never
        # reuse these offsets.
        # A log deleted since the coordinator looked (its topic deleted through
        # another gateway, whose notice has not reached this one yet) passes
        # and takes nothing: its pending rows went with it, and the commit
        # lands for the rest, as it does when the coordinator knew (log ids
        # are never reused, so a missing row is a deleted log).
        gone = f"NOT EXISTS (SELECT 1 FROM {s}.partitions WHERE log_id = $1)"
        self.publish_fence = (
            f"WITH u AS (UPDATE {s}.partitions SET log_end_offset = log_end_offset + $3, "
            "size_bytes = size_bytes + $4 "
            "WHERE log_id = $1 AND ($2::integer IS NULL OR leader_epoch = $2) RETURNING 1) "
            f"SELECT 1 FROM u UNION ALL SELECT 1 WHERE {gone}")
        # 2: the pending rows become index rows at offsets counted back from
        # the new log end (the marker takes the last), naming the same bytes
        # (shifted: stored before they had offsets); every blob must be there.
        # $3: offsets published in all (marker included); per blob: ordinal,
        # offset delta from the base, last offset delta, max timestamp, the
        # running max within the commit.
        self.publish_blobs = (
            "WITH e AS (SELECT * FROM unnest($4::int[], $5::bigint[], $6::bigint[], "
            "$7::bigint[], $8::bigint[]) AS e(ordinal, delta, last_delta, max_ts, running)), "
            f"moved AS (DELETE FROM {s}.pending_batches p USING e WHERE p.log_id = $1 "
            "AND p.instance = $2 AND p.ordinal = e.ordinal RETURNING p.ordinal, p.size, "
            "p.data_id), "
            f"start AS (SELECT log_end_offset - $3 AS base FROM {s}.partitions "
            "WHERE log_id = $1), "
            f"prior AS (SELECT coalesce((SELECT running_max_timestamp FROM {s}.batches "
            "WHERE log_id = $1 ORDER BY base_offset DESC LIMIT 1), -1) AS ts), "
            f"ins AS (INSERT INTO {s}.batches (log_id, base_offset, last_offset, max_timestamp, "
            "running_max_timestamp, size, data_id, shifted) "
            "SELECT $1, start.base + e.delta, start.base + e.delta + e.last_delta, e.max_ts, "
            "greatest(prior.ts, e.running), moved.size, moved.data_id, true "
            "FROM moved JOIN e USING (ordinal), start, prior RETURNING 1) "
            f"SELECT 1 WHERE (SELECT count(*) FROM ins) = cardinality($4::int[]) OR {gone}")
        # 3: the COMMIT marker, a new batch at the last offset taken ($5: the
        # offset it was stamped with, NULL when none was expected; stored
        # shifted, patched when read, when it landed elsewhere).
        self.publish_marker = (
            f"WITH d AS (INSERT INTO {s}.batch_data (log_id, data) SELECT $1, $2 "
            f"WHERE NOT {gone} RETURNING data_id), "
            f"at AS (SELECT log_end_offset - 1 AS offset FROM {s}.partitions WHERE log_id = $1), "
            f"prior AS (SELECT coalesce((SELECT running_max_timestamp FROM {s}.batches "
            "WHERE log_id = $1 ORDER BY base_offset DESC LIMIT 1), -1) AS ts) "
            f"INSERT INTO {s}.batches (log_id, base_offset, last_offset, max_timestamp, "
            "running_max_timestamp, size, data_id, shifted) "
            "SELECT $1, at.offset, at.offset, $3, greatest(prior.ts, $3), $4, d.data_id, "
            "$5::bigint IS DISTINCT FROM at.offset "
            "FROM d, at, prior")
        # 4: what the commit added, told to every gateway once the
        # transaction commits, and the new log end read back.
        self.publish_notify = ANNOUNCE_FROM_ROW.format(s=s)
        self.log_end = f"SELECT log_end_offset FROM {s}.partitions WHERE log_id = $1"
        # An abort: the pending rows of one transaction on one partition, and
        # the bytes they name (only they name them).
        self.abort = (
            f"WITH gone AS (DELETE FROM {s}.pending_batches WHERE log_id = $1 AND instance = $2 "
            "RETURNING data_id) "
            f"DELETE FROM {s}.batch_data d USING gone WHERE d.log_id = $1 "
            "AND d.data_id = gone.data_id")
        # The coordinator's fence (``pgstore.txn_slots``): the transactional
        # id's slot is still this gateway's at the epoch it gained it; the
        # row share-locked to the end of the change (a takeover waits for it).
        self.slot_held = (
            f"SELECT 1 FROM {s}.coordinator_slots WHERE slot = $1 AND leader_node = $2 "
            "AND leader_epoch = $3 FOR SHARE")
        # A slot gained: the partitions and pending rows of some ids ($1).
        self.load_partitions_of = (
            f"SELECT transactional_id, instance, topic_id, partition, topic "
            f"FROM {s}.txn_partitions WHERE transactional_id = ANY($1::text[]) "
            "ORDER BY transactional_id, instance, topic, partition")
        self.load_pending_of = (
            f"SELECT p.log_id, p.instance, p.ordinal, p.header, p.size "
            f"FROM {s}.txn_partitions t JOIN {s}.partitions l "
            "ON l.topic_id = t.topic_id AND l.partition = t.partition "
            f"JOIN {s}.pending_batches p ON p.log_id = l.log_id AND p.instance = t.instance "
            "WHERE t.transactional_id = ANY($1::text[]) ORDER BY p.log_id, p.instance, p.ordinal")
        # Start-up.
        self.load_counters = f"SELECT name, value FROM {s}.counters"
        self.load_states = f"SELECT transactional_id, state FROM {s}.txn_states"
        self.load_partitions = (
            f"SELECT transactional_id, instance, topic_id, partition, topic "
            f"FROM {s}.txn_partitions ORDER BY transactional_id, instance, topic, partition")
        self.load_pending = (
            f"SELECT log_id, instance, ordinal, header, size FROM {s}.pending_batches "
            "ORDER BY log_id, instance, ordinal")
