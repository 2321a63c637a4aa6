"""The PostgreSQL storage engine (issue 22; the plan: docs/cluster-design.md).

A second engine behind the storage seam (``tablets/seam.py``), for several
stateless gateways sharing one PostgreSQL. It may import ``tablets.seam`` and
the protocol-free helpers of ``tablets/`` (Kafka's record-batch format,
validation); never ``kafka_gateway/`` or ``txn/`` (``tests/test_layers.py``).

What exists so far:

- ``schema``/``migrate``: the tables, as versioned migrations, applied at
  start-up one migrator at a time;
- ``writer``: group commit, one PostgreSQL transaction per group of changes;
- ``batch_log``: one partition's batches at library level (its read query
  is the engine's);
- the engine behind the seam: ``node`` (``NodeStorage``), ``topics``
  (``TopicView``s, Kafka's checks, the claim of every partition at start),
  ``partition_log`` (``PartitionLog``) with ``appends`` (transactional
  batches: ``pending_appends``), ``truncation`` and ``producer_rows`` (the
  log is also the ``TxnPartition`` of transactions);
  ``engine_seam_check`` holds them to the Protocols under mypy.
- ``connect``: a connection to the host of a multi-host URL that takes
  writes, each host within its own time limit (PostgreSQL failover);
- ``consumer_offsets`` (with ``offset_loading``: its reads at start-up and
  of one group; ``offset_statements``: its SQL), ``node_records``: the
  seam's ``ConsumerOffsetStore`` and ``NodeRecordStore`` (held to the
  Protocols by ``seam_check``);
- ``important``: important consumer groups' hold on a retention pass;
- ``retention``: the node's retention pass (retention.ms/bytes, the
  important groups' holds, idle producers); ``retention_sql``: retention's
  delete as one statement fenced by the leader epoch (the log start moved,
  the batches wholly below it deleted), Kafka's retention.bytes rule in SQL,
  and the engine's own VACUUM (measured by ``bench.pg_retention``; the
  engine's pass is still to use it);
- ``membership``, ``leadership``: the cluster at library level: each
  gateway's lease-held registration, and the partitions and coordinator
  slots balanced over the live gateways by compare-and-set on their epochs
  (``placement``: the plan and a key's slot, computed without I/O;
  ``leader_rows``: the rows as read and the statements that move them);
- ``cluster``: the engine in a cluster of gateways (joining, leaving,
  leadership changes, the topic catalog's rereads), with ``cluster_view``
  (the seam's ``ClusterView``: routing answers), ``cluster_opening`` (what
  a gateway gains opened, what it loses closed) and ``topic_notices`` (a
  topic change told to every gateway);
- ``group_counters``: a group's persisted generation and its offset version
  counter, moved inside the caller's transaction;
- ``txn_storage`` (with ``txn_coordinator_state``: the coordinator's
  counters and state rows; ``txn_pending``: pending batches, a commit's
  publication, an abort; ``txn_publication``, ``txn_statements``): the seam's
  ``TransactionStorage``: the coordinator's state, pending batches, a
  commit's publication across partitions in one transaction; what it needs
  of a partition log is ``txn_publication.TxnPartition``; the engine hands
  it to the coordinator and to its logs' transactional appends;
- ``writer``'s companions: ``log_notices`` (log ends told to every gateway
  by LISTEN/NOTIFY).

``kafka-gateway serve --store postgresql://...`` runs on it (docs/cluster.md).
"""
