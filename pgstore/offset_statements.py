"""The SQL of ``pgstore.consumer_offsets`` (and of its loading,
``pgstore.offset_loading``), prepared once per schema, with the names its
rows use and the stored form of its text columns."""

from __future__ import annotations

import re

# The counters row of transaction instances (txn/registry.py names it too).
TXN_INSTANCE_COUNTER = "txn.instance"
# The counters row every deletion raises to the newest version it deleted.
VERSION_COUNTER = "consumer.offsets.version"
# released_offsets' row for a whole group.
WHOLE_GROUP = ("", -1)

# PostgreSQL's text holds no NUL character, which a client's metadata may
# carry (confluent-kafka sends the C string's terminator with it): the
# metadata is stored escaped: a backslash doubled, NUL as a backslash and "0".
_UNESCAPE = re.compile(r"\\(\\|0)")


def to_text(value: str) -> str:
    """``value`` as PostgreSQL's text can hold it."""
    return value.replace("\\", "\\\\").replace("\x00", "\\0")


def from_text(stored: str) -> str:
    """The value ``to_text`` gave ``stored`` for."""
    return _UNESCAPE.sub(lambda m: "\\" if m.group(1) == "\\" else "\x00", stored)


def stamp_sql(s: str) -> str:
    """The stamp every write of a ``consumer_offsets`` row sets (migration 6):
    the transaction-instance counter as the writing statement reads it. A
    transaction's begin sets that counter to its instance (in the PostgreSQL
    transaction that begins it), so a row stamped at or above a transaction's
    instance was committed after that transaction began, on whichever gateway
    (docs/cluster-design.md, "A transaction's begin point across gateways")."""
    return (f"(SELECT coalesce(max(value), 0) FROM {s}.counters "
            f"WHERE name = '{TXN_INSTANCE_COUNTER}')")


class OffsetStatements:
    def __init__(self, s: str) -> None:
        """``s``: the schema's quoted name."""
        stamp = stamp_sql(s)
        self.upsert = (
            f"INSERT INTO {s}.consumer_offsets (group_id, topic, partition, committed_offset, "
            "leader_epoch, metadata, commit_timestamp, version, committer, member, stamp) "
            f"SELECT $1, *, {stamp} FROM unnest($2::text[], $3::int[], $4::bigint[], $5::int[], "
            "$6::text[], $7::bigint[], $8::bigint[], $9::text[], $10::text[]) "
            "ON CONFLICT (group_id, topic, partition) DO UPDATE SET "
            "committed_offset = excluded.committed_offset, leader_epoch = excluded.leader_epoch, "
            "metadata = excluded.metadata, commit_timestamp = excluded.commit_timestamp, "
            "version = excluded.version, committer = excluded.committer, "
            "member = excluded.member, stamp = excluded.stamp")
        # The compare-and-set form (``stage`` with ``refused``): first a read of
        # the rows as this gateway expects them, locked; then the upsert, which
        # updates a row only at its expected version and must write every row
        # (a row another gateway inserted meanwhile fails it). Only the second
        # writes, and it is never a change's first step, so a refusal there
        # rolls back (pgstore.writer).
        self.expect = (
            "SELECT 1 WHERE NOT EXISTS (SELECT 1 FROM unnest($2::text[], $3::int[], "
            "$4::bigint[]) AS e(topic, partition, expected) LEFT JOIN LATERAL "
            f"(SELECT version FROM {s}.consumer_offsets c WHERE c.group_id = $1 "
            "AND c.topic = e.topic AND c.partition = e.partition FOR UPDATE) c ON true "
            "WHERE coalesce(c.version, 0) <> e.expected)")
        self.upsert_expected = (
            "WITH e AS (SELECT * FROM unnest($2::text[], $3::int[], $4::bigint[], $5::int[], "
            "$6::text[], $7::bigint[], $8::bigint[], $9::text[], $10::text[], $11::bigint[]) "
            "AS e(topic, partition, committed_offset, leader_epoch, metadata, commit_timestamp, "
            "version, committer, member, expected)), "
            f"up AS (INSERT INTO {s}.consumer_offsets AS c (group_id, topic, partition, "
            "committed_offset, leader_epoch, metadata, commit_timestamp, version, committer, "
            "member, stamp) SELECT $1, topic, partition, committed_offset, leader_epoch, "
            f"metadata, commit_timestamp, version, committer, member, {stamp} FROM e "
            "ON CONFLICT (group_id, topic, partition) DO UPDATE SET "
            "committed_offset = excluded.committed_offset, leader_epoch = excluded.leader_epoch, "
            "metadata = excluded.metadata, commit_timestamp = excluded.commit_timestamp, "
            "version = excluded.version, committer = excluded.committer, "
            "member = excluded.member, stamp = excluded.stamp "
            "WHERE c.version = (SELECT expected FROM e WHERE e.topic = excluded.topic "
            "AND e.partition = excluded.partition) RETURNING 1) "
            "SELECT 1 WHERE (SELECT count(*) FROM up) = $12")
        # The coordinator's fence (``PgConsumerOffsets.slot_holder``): the
        # group's slot is still this gateway's at the epoch it gained it. The
        # row stays share-locked until the change ends, so a takeover (an
        # UPDATE of the row, pgstore.leadership) waits for a write already
        # past this check, and a write after the takeover finds no row.
        self.slot_held = (
            f"SELECT 1 FROM {s}.coordinator_slots WHERE slot = $1 AND leader_node = $2 "
            "AND leader_epoch = $3 FOR SHARE")
        self.unrelease = (
            f"DELETE FROM {s}.released_offsets WHERE group_id = $1 AND (topic, partition) IN "
            "(SELECT * FROM unnest($2::text[], $3::int[]))")
        self.release = (
            f"INSERT INTO {s}.released_offsets (group_id, topic, partition) "
            "SELECT $1, * FROM unnest($2::text[], $3::int[]) ON CONFLICT DO NOTHING")
        self.delete_group = (
            f"DELETE FROM {s}.consumer_offsets WHERE group_id = $1 AND version <= $2")
        self.delete_some = (
            f"DELETE FROM {s}.consumer_offsets WHERE group_id = $1 AND version <= $2 "
            "AND (topic, partition) IN (SELECT * FROM unnest($3::text[], $4::int[]))")
        # The reads of ``load`` and ``load_group`` (pgstore.offset_loading).
        self.load_counter = f"SELECT value FROM {s}.counters WHERE name = $1"
        self.load_offsets = f"SELECT * FROM {s}.consumer_offsets"
        self.load_released = f"SELECT group_id, topic, partition FROM {s}.released_offsets"
        self.load_group_offsets = f"SELECT * FROM {s}.consumer_offsets WHERE group_id = $1"
        self.load_group_released = (
            f"SELECT group_id, topic, partition FROM {s}.released_offsets "
            "WHERE group_id = $1")
        # A deleted topic's offsets and releases (``drop_topic``).
        self.drop_topic_offsets = f"DELETE FROM {s}.consumer_offsets WHERE topic = $1"
        self.drop_topic_released = f"DELETE FROM {s}.released_offsets WHERE topic = $1"
        self.counter = (
            f"INSERT INTO {s}.counters AS c (name, value) VALUES ($1, $2) ON CONFLICT (name) "
            "DO UPDATE SET value = greatest(c.value, excluded.value)")
