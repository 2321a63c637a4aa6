"""What the jobs share: their command-line arguments, the Kafka source, and a
progress line per micro-batch."""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any

log = logging.getLogger("spark_jobs")


def add_bootstrap(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap-servers", required=True, metavar="HOST:PORT[,...]",
                        help="the gateway (or any Kafka broker)")


def kafka_reader(reader: Any, bootstrap: str, topic: str, starting_offsets: str,
                 fail_on_data_loss: bool = True) -> Any:
    """``format("kafka")`` on ``topic`` reading committed records only, with headers.

    The gateway never lets aborted data into a log, but read_committed is
    what a job needs on Apache Kafka, and the gateway honours it the same way.
    """
    return (reader.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .option("kafka.isolation.level", "read_committed")
            .option("startingOffsets", starting_offsets)
            .option("includeHeaders", "true")
            .option("failOnDataLoss", str(fail_on_data_loss).lower()))


def with_trigger(writer: Any, args: argparse.Namespace) -> Any:
    """The DataStreamWriter with the trigger of ``add_trigger``'s arguments:
    availableNow, a processing-time interval, or Spark's default (the next
    batch as soon as one ends)."""
    if args.once:
        return writer.trigger(availableNow=True)
    if args.trigger_interval:
        return writer.trigger(processingTime=args.trigger_interval)
    return writer


def add_trigger(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--once", action="store_true",
                        help="process what is in the topic now, then stop (availableNow)")
    parser.add_argument("--trigger-interval", metavar="DURATION",
                        help="start a micro-batch every DURATION (e.g. '10 seconds'); "
                             "default: as soon as the previous one ends")


def describe_offsets(offsets: str | None) -> str:
    """Spark's offset JSON ({"topic": {"0": 12}}) as ``topic[0:12 1:30]``."""
    if not offsets:
        return "-"
    try:
        parsed = json.loads(offsets)
    except ValueError:
        return offsets
    if not isinstance(parsed, dict):
        return offsets
    return " ".join(
        f"{topic}[" + " ".join(f"{p}:{o}" for p, o in sorted(parts.items(),
                                                        key=lambda kv: int(kv[0]))) + "]"
        for topic, parts in sorted(parsed.items()) if isinstance(parts, dict))


def log_progress(spark: Any) -> None:
    """Log one line per micro-batch of every query of ``spark`` (once per session)."""
    if getattr(spark, "_spark_jobs_progress", False):
        return
    from pyspark.sql.streaming import StreamingQueryListener

    class ProgressLog(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            log.info("query %s started (id %s, run %s)", event.name, event.id, event.runId)

        def onQueryProgress(self, event: Any) -> None:
            p = event.progress
            ends = " ".join(describe_offsets(s.endOffset) for s in p.sources)
            log.info("%s: batch %d: %d rows in %d ms, source offsets now %s", p.name,
                     p.batchId, p.numInputRows, p.durationMs.get("triggerExecution", 0), ends)

        def onQueryTerminated(self, event: Any) -> None:
            if event.exception:
                log.error("query %s failed: %s", event.id, event.exception.splitlines()[0])
            else:
                log.info("query %s stopped", event.id)

    spark.streams.addListener(ProgressLog())
    spark._spark_jobs_progress = True
