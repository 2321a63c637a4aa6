"""archive: TOPIC -> Parquet files, every record once, with its source offsets.

Each row holds topic, partition, offset, timestamp, timestampType, key,
value and headers, so the archive says where each record came from.

- ``--mode stream`` (default): a Structured Streaming query with
  ``trigger(availableNow=True)``: each run archives what arrived since the
  last one and stops. Spark's file sink is exactly once: a batch's files are
  listed in OUTPUT/_spark_metadata only when the batch commits, and Spark
  readers of OUTPUT see only listed files, so a crashed run's files never
  count and its batch is rewritten by the next run.
- ``--mode batch``: one ``read.format("kafka")`` between offset bounds
  (``--starting-offsets`` / ``--ending-offsets``: earliest, latest, or
  Spark's JSON such as ``{"orders": {"0": 100, "1": 250}}``), written with
  mode overwrite: a rerun with the same bounds replaces OUTPUT with the same
  records, so the archive holds each record of the range exactly once.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from spark_jobs.common import add_bootstrap, kafka_reader, log_progress

log = logging.getLogger("spark_jobs.archive")
COLUMNS = ("topic", "partition", "offset", "timestamp", "timestampType", "key", "value",
           "headers")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_bootstrap(parser)
    parser.add_argument("--topic", required=True, help="topic to archive")
    parser.add_argument("--output", required=True, metavar="DIR", help="Parquet directory")
    parser.add_argument("--mode", choices=("stream", "batch"), default="stream")
    parser.add_argument("--checkpoint", metavar="DIR",
                        help="Spark's checkpoint directory (stream mode; required there)")
    parser.add_argument("--starting-offsets", default="earliest",
                        help="earliest, latest or Spark's JSON (stream: only for a new "
                             "checkpoint; default earliest)")
    parser.add_argument("--ending-offsets", default="latest",
                        help="batch mode: latest or Spark's JSON (default latest)")
    parser.add_argument("--fail-on-data-loss", choices=("true", "false"), default="true",
                        help="fail when records in range were deleted (default true)")


def run(spark: Any, args: argparse.Namespace) -> None:
    fail_on_loss = args.fail_on_data_loss == "true"
    if args.mode == "batch":
        source = kafka_reader(spark.read, args.bootstrap_servers, args.topic,
                              args.starting_offsets, fail_on_loss)
        (source.option("endingOffsets", args.ending_offsets).load().select(*COLUMNS)
         .write.mode("overwrite").parquet(args.output))
        summarize(spark, args.output)
        return
    if not args.checkpoint:
        raise SystemExit("archive --mode stream needs --checkpoint")
    log_progress(spark)
    source = kafka_reader(spark.readStream, args.bootstrap_servers, args.topic,
                          args.starting_offsets, fail_on_loss)
    (source.load().select(*COLUMNS)
     .writeStream.queryName(f"archive-{args.topic}").format("parquet")
     .option("path", args.output).option("checkpointLocation", args.checkpoint)
     .trigger(availableNow=True).start().awaitTermination())
    summarize(spark, args.output)


def summarize(spark: Any, output: str) -> None:
    """Log what the archive holds per partition: records and offset bounds."""
    from pyspark.sql import functions as F

    rows = (spark.read.parquet(output).groupBy("topic", "partition")
            .agg(F.count("*").alias("records"), F.min("offset").alias("first"),
                 F.max("offset").alias("last")).orderBy("topic", "partition").collect())
    for row in rows:
        log.info("archive %s: %s[%d] holds %d records, offsets %d..%d", output, row.topic,
                 row.partition, row.records, row.first, row.last)
