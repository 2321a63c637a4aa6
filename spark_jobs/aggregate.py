"""aggregate: events per user per minute, written back to TARGET with Spark's Kafka sink.

Reads SOURCE (JSON values with a ``user_id``; records without one are left
out), counts events per user in tumbling event-time windows (``--window``,
default 1 minute; the event time is the record's Kafka timestamp), and emits
each window once the watermark (``--watermark``, default 1 minute, behind the
latest event time seen) has passed its end (output mode append). Each result
is one record of TARGET:

    key   = "<user_id>@<window start, epoch ms>"
    value = {"user_id": ..., "window_start": ms, "window_end": ms, "events": n}

Spark's Kafka sink is at-least-once: after a crash between a batch's write
and its commit to the checkpoint, the batch is written again. Its records
are then identical (same key, same value), so a compacted TARGET, or any
reader keeping the last value per key, sees each window once.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from spark_jobs.common import add_bootstrap, add_trigger, kafka_reader, log_progress, with_trigger

log = logging.getLogger("spark_jobs.aggregate")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_bootstrap(parser)
    parser.add_argument("--source", required=True, help="topic of events")
    parser.add_argument("--target", required=True, help="topic of per-window counts")
    parser.add_argument("--checkpoint", required=True, metavar="DIR",
                        help="Spark's checkpoint directory (holds the window state)")
    parser.add_argument("--window", default="1 minute", help="window length (1 minute)")
    parser.add_argument("--watermark", default="1 minute",
                        help="how late an event may be and still count (1 minute)")
    parser.add_argument("--starting-offsets", default="earliest",
                        help="earliest, latest or Spark's JSON, for a new checkpoint")
    add_trigger(parser)


def counts(events: Any, window: str, watermark: str) -> Any:
    """Kafka source rows -> Kafka sink rows (key, value) of per-user window counts."""
    from pyspark.sql import functions as F

    parsed = events.select(
        F.get_json_object(F.col("value").cast("string"), "$.user_id").alias("user_id"),
        F.col("timestamp"))
    counted = (parsed.where(F.col("user_id").isNotNull())
               .withWatermark("timestamp", watermark)
               .groupBy(F.window("timestamp", window).alias("window"), "user_id")
               .count())
    start = F.expr("unix_millis(window.start)")
    return counted.select(
        F.concat_ws("@", "user_id", start.cast("string")).alias("key"),
        F.to_json(F.struct(
            F.col("user_id"), start.alias("window_start"),
            F.expr("unix_millis(window.end)").alias("window_end"),
            F.col("count").alias("events"))).alias("value"))


def run(spark: Any, args: argparse.Namespace) -> None:
    log_progress(spark)
    source = kafka_reader(spark.readStream, args.bootstrap_servers, args.source,
                          args.starting_offsets)
    writer = (counts(source.load(), args.window, args.watermark).writeStream
              .queryName(f"aggregate-{args.source}").outputMode("append").format("kafka")
              .option("kafka.bootstrap.servers", args.bootstrap_servers)
              .option("topic", args.target)
              .option("checkpointLocation", args.checkpoint))
    with_trigger(writer, args).start().awaitTermination()
