"""The engine's tables, as numbered migrations (docs/cluster-design.md, "Schema").

Every table lives in one PostgreSQL schema (namespace) of the database, named
by the gateway's configuration (``DEFAULT_SCHEMA`` unless told), so several
clusters, or tests, can share a database. Statements name it as ``{schema}``;
``migrate`` puts the quoted name there.

A migration is applied once, in the transaction that records it in
``schema_migrations`` (PostgreSQL's DDL is transactional: a migration lands
whole or not at all). Released migrations are never edited: a change to the
schema is a new migration at the end of ``MIGRATIONS``.

Version 1 holds what one gateway keeps in RocksDB today (``tablets/keys.py``),
with the partition's leader epoch. Version 2 adds the cluster's own tables
(docs/cluster-design.md, "Leadership, fencing and leases"):

- ``nodes``: one row per gateway (``node.id``): its advertised listeners, the
  incarnation of the process that registered last (from the
  ``node_incarnations`` sequence: never reused, also after a deregistration)
  and its lease, by the database's clock (``pgstore.membership``);
- ``partitions.leader_node``: the gateway leading the partition (NULL: none);
  every change of it bumps ``leader_epoch`` (``pgstore.leadership``);
- ``coordinator_slots``: ``COORDINATOR_SLOTS`` rows, each with its leader and
  epoch; a group or transactional id is coordinated by the leader of slot
  ``coordinator_slot(key)`` (``pgstore.placement``);
- ``group_generations``: a group's generation, which a trigger keeps from
  ever going backwards; ``group_offset_versions``: the per-group counter that
  numbers offset commits in commit order (``pgstore.group_counters``).

Version 3 is for retention (docs/cluster-design.md, "Retention, compaction
and bloat", has the measurements behind it): autovacuum's per-table settings
on the tables retention deletes from, ``batches`` and ``batch_data`` and its
TOAST table (``TABLE_STORAGE_PARAMETERS``), and the index on ``batches``
(log_id, data_id) that the foreign key's check needs when bytes are deleted.

Version 4 adds ``txn_staged_offsets``: the offsets a TxnOffsetCommit staged
on the group's coordinator for a transaction another gateway coordinates,
until that transaction's commit moves them into ``consumer_offsets`` or its
abort deletes them (``pgstore.txn_staged_offsets``; docs/cluster-design.md,
"Transactional offsets staged by another gateway").

Version 5 is for compaction (``pgstore.compaction``; docs/cluster-design.md,
"Compacted topics"): ``partitions.delete_horizon``, the earliest delete
horizon the last run kept (NULL: none), so a restarted or new leader runs
again once it passes, as the one that stamped it would have. The clean
offset was there from version 1 (``clean_offset``).

Version 6 gives a transaction a begin point every gateway can compare
against: ``consumer_offsets.stamp`` (the transaction-instance counter when
the row was committed) and ``txn_staged_offsets.exempt_version``
(docs/cluster-design.md, "A transaction's begin point across gateways").

How RocksDB's keys map (``tablets/keys.py`` kind -> table):

- ``T`` topic record -> ``topics`` (configs: the overrides, as JSON);
- ``M`` partition meta -> ``partitions``: one row per incarnation of a
  partition (``log_id``, the seam's ``log_ref``), with its offsets, size,
  active segment, compaction's clean offset and the leader epoch. Updated
  by every append: a narrow row, no index on what changes, fillfactor 50,
  so the updates are HOT (no index writes, pruned in place);
- ``L`` log entry -> ``batches`` (where the bytes are: ``data_id``) and
  ``X`` time index -> its ``running_max_timestamp`` column and index;
- the segment files' bytes -> ``batch_data``: each batch's bytes once, in a
  ``bytea`` column with ``STORAGE EXTERNAL`` (out of line, never
  compressed: a compressed batch would only cost pglz's attempt);
- ``S`` closed segment -> ``segments`` (``F`` segment file: no counterpart);
- ``P`` producer state -> ``producers``;
- ``C`` committed offset -> ``consumer_offsets``; ``R`` released ->
  ``released_offsets`` (topic '' and partition -1: the whole group);
- ``B`` pending transactional batch -> ``pending_batches`` (its bytes in
  ``batch_data`` too: a commit moves the small row into ``batches``, never
  the bytes);
- ``Y`` transaction state -> ``txn_states``; ``Q`` partition of an open
  transaction -> ``txn_partitions``; ``N`` counter -> ``counters`` (the
  cluster id -> ``cluster``);
- ``U``/``A`` node records (SCRAM credentials, ACLs) -> ``node_records``;
- ``V`` data directory format -> ``schema_migrations``.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_SCHEMA = "kafka_gateway"

# How many coordinator slots migration 2 makes: Kafka's default of
# offsets.topic.num.partitions (and transaction.state.log.num.partitions), so
# a key lands in the slot whose number is the partition of __consumer_offsets
# Kafka would place it in. Fixed once the schema exists: changing it would
# move every group and transaction at once.
COORDINATOR_SLOTS = 50


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    description: str
    statements: tuple[str, ...]  # SQL, each naming the schema as {schema}


_V1 = (
    # The cluster id Metadata answers: 22 characters of base64url, as Kafka's.
    """CREATE TABLE {schema}.cluster (
        singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
        cluster_id text NOT NULL
    )""",
    """INSERT INTO {schema}.cluster (cluster_id) VALUES (
        translate(rtrim(encode(uuid_send(gen_random_uuid()), 'base64'), '='), '+/', '-_'))""",
    """CREATE TABLE {schema}.topics (
        topic_id uuid PRIMARY KEY,
        name text NOT NULL UNIQUE,
        configs jsonb NOT NULL DEFAULT '{}'::jsonb,
        created_ms bigint NOT NULL
    )""",
    """CREATE TABLE {schema}.partitions (
        log_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        topic_id uuid NOT NULL REFERENCES {schema}.topics ON DELETE CASCADE,
        partition integer NOT NULL CHECK (partition >= 0),
        log_start_offset bigint NOT NULL DEFAULT 0,
        log_end_offset bigint NOT NULL DEFAULT 0,
        size_bytes bigint NOT NULL DEFAULT 0,
        leader_epoch integer NOT NULL DEFAULT 0,
        clean_offset bigint NOT NULL DEFAULT 0,
        active_segment_base bigint NOT NULL DEFAULT 0,
        active_segment_size bigint NOT NULL DEFAULT 0,
        active_segment_first_timestamp bigint NOT NULL DEFAULT -1,
        active_segment_largest_timestamp bigint NOT NULL DEFAULT -1,
        UNIQUE (topic_id, partition),
        CHECK (0 <= log_start_offset AND log_start_offset <= log_end_offset)
    ) WITH (fillfactor = 50)""",
    """CREATE TABLE {schema}.batch_data (
        log_id bigint NOT NULL REFERENCES {schema}.partitions ON DELETE CASCADE,
        data_id bigint GENERATED ALWAYS AS IDENTITY,
        data bytea NOT NULL,
        PRIMARY KEY (log_id, data_id)
    )""",
    "ALTER TABLE {schema}.batch_data ALTER COLUMN data SET STORAGE EXTERNAL",
    # shifted: the bytes carry another base offset (a transactional batch,
    # stored when produced, before its commit gave it offsets): the reader
    # patches the first 8 bytes with base_offset.
    """CREATE TABLE {schema}.batches (
        log_id bigint NOT NULL REFERENCES {schema}.partitions ON DELETE CASCADE,
        base_offset bigint NOT NULL,
        last_offset bigint NOT NULL,
        max_timestamp bigint NOT NULL,
        running_max_timestamp bigint NOT NULL,
        size integer NOT NULL,
        data_id bigint NOT NULL,
        shifted boolean NOT NULL DEFAULT false,
        PRIMARY KEY (log_id, base_offset),
        FOREIGN KEY (log_id, data_id) REFERENCES {schema}.batch_data (log_id, data_id),
        CHECK (base_offset <= last_offset)
    )""",
    """CREATE INDEX batches_by_time ON {schema}.batches
        (log_id, running_max_timestamp, base_offset)""",
    """CREATE TABLE {schema}.segments (
        log_id bigint NOT NULL REFERENCES {schema}.partitions ON DELETE CASCADE,
        base_offset bigint NOT NULL,
        size bigint NOT NULL,
        first_timestamp bigint NOT NULL,
        largest_timestamp bigint NOT NULL,
        PRIMARY KEY (log_id, base_offset)
    )""",
    """CREATE TABLE {schema}.pending_batches (
        log_id bigint NOT NULL REFERENCES {schema}.partitions ON DELETE CASCADE,
        instance bigint NOT NULL,
        ordinal integer NOT NULL,
        header bytea NOT NULL,
        size integer NOT NULL,
        data_id bigint NOT NULL,
        PRIMARY KEY (log_id, instance, ordinal),
        FOREIGN KEY (log_id, data_id) REFERENCES {schema}.batch_data (log_id, data_id)
    )""",
    # recent: the producer's last batches, (first seq, last seq, base offset)
    # each, as tablets/producers.py encodes them.
    """CREATE TABLE {schema}.producers (
        log_id bigint NOT NULL REFERENCES {schema}.partitions ON DELETE CASCADE,
        producer_id bigint NOT NULL,
        epoch smallint NOT NULL,
        last_timestamp bigint NOT NULL,
        recent bytea NOT NULL,
        PRIMARY KEY (log_id, producer_id)
    ) WITH (fillfactor = 70)""",
    """CREATE TABLE {schema}.consumer_offsets (
        group_id text NOT NULL,
        topic text NOT NULL,
        partition integer NOT NULL,
        committed_offset bigint NOT NULL,
        leader_epoch integer NOT NULL,
        metadata text NOT NULL,
        commit_timestamp bigint NOT NULL,
        version bigint NOT NULL,
        committer text NOT NULL DEFAULT '',
        PRIMARY KEY (group_id, topic, partition)
    ) WITH (fillfactor = 70)""",
    """CREATE TABLE {schema}.released_offsets (
        group_id text NOT NULL,
        topic text NOT NULL,
        partition integer NOT NULL,
        PRIMARY KEY (group_id, topic, partition)
    )""",
    """CREATE TABLE {schema}.txn_states (
        transactional_id text PRIMARY KEY,
        state bytea NOT NULL
    )""",
    """CREATE TABLE {schema}.txn_partitions (
        transactional_id text NOT NULL,
        instance bigint NOT NULL,
        topic_id uuid NOT NULL,
        partition integer NOT NULL,
        topic text NOT NULL,
        PRIMARY KEY (transactional_id, instance, topic_id, partition)
    )""",
    """CREATE TABLE {schema}.counters (
        name text PRIMARY KEY,
        value bigint NOT NULL
    )""",
    """CREATE TABLE {schema}.node_records (
        kind text NOT NULL,
        name bytea NOT NULL,
        value bytea NOT NULL,
        PRIMARY KEY (kind, name)
    )""",
)

_V2 = (
    "CREATE SEQUENCE {schema}.node_incarnations AS bigint",
    # listeners: [{"name", "host", "port", "security_protocol"}, ...]. Renewed
    # every lease/3: a narrow row with no index on what changes (HOT updates).
    """CREATE TABLE {schema}.nodes (
        node_id integer PRIMARY KEY CHECK (node_id >= 0),
        listeners jsonb NOT NULL DEFAULT '[]'::jsonb,
        incarnation bigint NOT NULL,
        registered_at timestamptz NOT NULL DEFAULT now(),
        lease_expires_at timestamptz NOT NULL
    ) WITH (fillfactor = 50)""",
    # No foreign key to nodes: a deregistered gateway's row is gone, and a
    # partition it still names is leaderless until another takes it.
    "ALTER TABLE {schema}.partitions ADD COLUMN leader_node integer",
    """CREATE TABLE {schema}.coordinator_slots (
        slot integer PRIMARY KEY CHECK (slot >= 0),
        leader_node integer,
        leader_epoch integer NOT NULL DEFAULT 0
    ) WITH (fillfactor = 50)""",
    f"""INSERT INTO {{schema}}.coordinator_slots (slot)
        SELECT generate_series(0, {COORDINATOR_SLOTS - 1})""",
    """CREATE TABLE {schema}.group_generations (
        group_id text PRIMARY KEY,
        generation integer NOT NULL CHECK (generation >= 0)
    )""",
    # KIP-447 fences and the offset-range check compare generations: one
    # written back lower (a coordinator that loaded an old value) would
    # accept a zombie's commit. The schema refuses it.
    """CREATE FUNCTION {schema}.generation_never_goes_back() RETURNS trigger
        LANGUAGE plpgsql AS $$
    BEGIN
        IF NEW.generation < OLD.generation THEN
            RAISE EXCEPTION 'group %: generation % would go back to %',
                OLD.group_id, OLD.generation, NEW.generation
                USING ERRCODE = 'check_violation';
        END IF;
        RETURN NEW;
    END $$""",
    """CREATE TRIGGER generation_never_goes_back
        BEFORE UPDATE ON {schema}.group_generations
        FOR EACH ROW EXECUTE FUNCTION {schema}.generation_never_goes_back()""",
    """CREATE TABLE {schema}.group_offset_versions (
        group_id text PRIMARY KEY,
        version bigint NOT NULL CHECK (version >= 0)
    )""",
)

# Migration 3: autovacuum for the tables retention deletes from (measured
# with bench/pg_retention.py; docs/cluster-design.md, "Retention, compaction
# and bloat"). Retention deletes the oldest rows of ``batches`` and
# ``batch_data``, and the bytes' TOAST chunks with them; their space is reused
# once vacuum has passed. Settings by table; ``toast.`` ones are for the
# table's TOAST table, which autovacuum visits on its own.
TABLE_STORAGE_PARAMETERS: dict[str, dict[str, str]] = {
    "batch_data": {
        "autovacuum_vacuum_scale_factor": "0.05",
        "autovacuum_vacuum_cost_delay": "0",
        "toast.autovacuum_vacuum_scale_factor": "0.05",
        "toast.autovacuum_vacuum_cost_delay": "0",
    },
    "batches": {
        "autovacuum_vacuum_scale_factor": "0.05",
    },
}

_V3 = (
    *(f"ALTER TABLE {{schema}}.{table} SET ("
      + ", ".join(f"{name} = {value}" for name, value in settings.items()) + ")"
      for table, settings in TABLE_STORAGE_PARAMETERS.items()),
    # Deleting a batch_data row checks that no batches row names it (the
    # foreign key): without an index on (log_id, data_id) each check reads
    # every index row of the partition, so retention's delete grew with the
    # square of the log (1,000 batches off a log of 50,000: 3.3 s; 21 ms with it).
    "CREATE INDEX batches_by_data ON {schema}.batches (log_id, data_id)",
)

_V4 = (
    # expected_version: the consumer_offsets row's version when the partition
    # was first staged in this transaction (0: no row), which the commit's
    # compare-and-set expects. Keyed by the transactional id first: a commit
    # or an abort takes or deletes its rows by that prefix.
    """CREATE TABLE {schema}.txn_staged_offsets (
        transactional_id text NOT NULL,
        group_id text NOT NULL,
        topic text NOT NULL,
        partition integer NOT NULL,
        producer_id bigint NOT NULL,
        producer_epoch smallint NOT NULL,
        committed_offset bigint NOT NULL,
        leader_epoch integer NOT NULL,
        metadata text NOT NULL,
        expected_version bigint NOT NULL,
        PRIMARY KEY (transactional_id, group_id, topic, partition)
    )""",
    "CREATE INDEX txn_staged_offsets_by_group ON {schema}.txn_staged_offsets (group_id)",
)

_V5 = (
    # Nullable, no default: adding it rewrites nothing.
    "ALTER TABLE {schema}.partitions ADD COLUMN delete_horizon bigint",
)

_V6 = (
    # stamp: the transaction-instance counter (``counters`` row
    # ``txn.instance``) as the commit that wrote the row read it. A
    # transaction's instance is that counter as its begin set it, so a row
    # stamped at or above a transaction's instance was committed after it
    # began, whichever gateway committed it (rows of before: 0, below every
    # instance).
    "ALTER TABLE {schema}.consumer_offsets ADD COLUMN stamp bigint NOT NULL DEFAULT 0",
    # member: who committed it (tablets.seam.CommittedOffset.member: a group
    # member and its generation), which the offset-range check's exceptions
    # need on whichever gateway reads the row ('': unknown, the stricter).
    "ALTER TABLE {schema}.consumer_offsets ADD COLUMN member text NOT NULL DEFAULT ''",
    "ALTER TABLE {schema}.txn_staged_offsets ADD COLUMN member text NOT NULL DEFAULT ''",
    # exempt_version: the consumer_offsets version for which the group's
    # coordinator found the offset-range check's exceptions (an unchanged,
    # member-fenced offset of a predecessor; the member's own auto-commit)
    # to apply when it staged the row; -1: none.
    "ALTER TABLE {schema}.txn_staged_offsets ADD COLUMN exempt_version bigint NOT NULL "
    "DEFAULT -1",
)

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "what one gateway keeps in RocksDB, with leader epochs", _V1),
    Migration(2, "the cluster: nodes and leases, partition leaders, coordinator slots, "
                 "group generations and offset versions", _V2),
    Migration(3, "retention: autovacuum settings of batches and batch_data, "
                 "the index the deletes' foreign key check needs", _V3),
    Migration(4, "offsets staged by a group's coordinator for a transaction another "
                 "gateway coordinates", _V4),
    Migration(5, "compaction: the earliest delete horizon a partition's last run kept", _V5),
    Migration(6, "the begin point of a transaction across gateways: offsets stamped with "
                 "the transaction-instance counter", _V6),
)

LATEST = MIGRATIONS[-1].version
