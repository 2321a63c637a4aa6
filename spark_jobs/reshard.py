"""Reshard a topic by user id: the headline exactly-once use case.

Reads ``--source`` with Spark's Kafka source (``format("kafka")``), takes the
``user_id`` field of each JSON value as the new key, and writes to
``--target`` with Spark's Kafka sink, whose producer routes each record by
that key: all of one user's events land in one partition of the target.

    spark-submit --packages org.apache.spark:spark-sql-kafka-0-10_2.12:3.5.3 \\
        spark_jobs/reshard.py --bootstrap-servers 127.0.0.1:9092 \\
        --source orders --target orders-by-user --checkpoint /tmp/ckpt

``--once`` processes what is there and stops (availableNow), for batch runs
and tests; without it the query runs until stopped.
"""

from __future__ import annotations

import argparse

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

VALUE_SCHEMA = StructType([StructField("user_id", StringType())])


def reshard(records: DataFrame) -> DataFrame:
    """Kafka source rows -> Kafka sink rows keyed by the value's user_id."""
    user_id = F.from_json(F.col("value").cast("string"), VALUE_SCHEMA)["user_id"]
    return records.select(
        F.coalesce(user_id, F.col("key").cast("string")).alias("key"),
        F.col("value"),
        F.col("headers"),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--starting-offsets", default="earliest")
    parser.add_argument("--once", action="store_true", help="process what is there, then stop")
    args = parser.parse_args(argv)

    spark = SparkSession.builder.appName("kafka-gateway-reshard").getOrCreate()
    source = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap_servers)
        .option("subscribe", args.source)
        .option("startingOffsets", args.starting_offsets)
        .option("includeHeaders", "true")
        .load()
    )
    writer = (
        reshard(source).writeStream.format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap_servers)
        .option("topic", args.target)
        .option("checkpointLocation", args.checkpoint)
    )
    if args.once:
        writer = writer.trigger(availableNow=True)
    writer.start().awaitTermination()


if __name__ == "__main__":
    main()
