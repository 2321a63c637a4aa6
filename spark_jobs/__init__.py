"""PySpark jobs that use the gateway through Spark's own Kafka source and sink
(``format("kafka")``), run with ``python -m spark_jobs JOB ...`` (docs/spark.md).

- reshard: a topic re-keyed and re-partitioned by user id, exactly once;
- archive: a topic to Parquet with the source offsets, exactly once;
- aggregate: events per user per minute, written back with Spark's Kafka sink;
- feed: test events for them (no Spark).
"""
