"""The PostgreSQL storage engine (issue 22; the plan: docs/cluster-design.md).

A second engine behind the storage seam (``tablets/seam.py``), for several
stateless gateways sharing one PostgreSQL. It may import ``tablets.seam`` and
the protocol-free helpers of ``tablets/`` (Kafka's record-batch format,
validation); never ``kafka_gateway/`` or ``txn/`` (``tests/test_layers.py``).

What exists so far:

- ``schema``: the tables, as versioned migrations;
- ``migrate``: bring a database's schema to this code's version at start-up,
  one migrator at a time, refusing a schema newer than the code;
- ``batch_log``: one partition's record batches over that schema (append a
  group of batches with their index rows in one transaction, fenced by the
  leader epoch; read by offset range), a library-level piece, not yet
  behind the seam;
- ``writer``: the group-commit writer (one PostgreSQL transaction per group
  of changes);
- ``connect``: a connection to the host of a multi-host URL that takes
  writes, each host within its own time limit (PostgreSQL failover);
- ``consumer_offsets``, ``node_records``: the seam's ``ConsumerOffsetStore``
  and ``NodeRecordStore`` (held to the Protocols by ``seam_check``);
- ``important``: important consumer groups' hold on a retention pass;
- ``membership``, ``leadership``: the cluster at library level: each
  gateway's lease-held registration, and the partitions and coordinator
  slots balanced over the live gateways by compare-and-set on their epochs;
- ``group_counters``: a group's persisted generation and its offset version
  counter, moved inside the caller's transaction.

Nothing here is wired into the gateway yet (no ``--store`` flag).
"""
