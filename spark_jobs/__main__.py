"""Run a Spark job against the gateway.

    python -m spark_jobs JOB [--master URL] [--packages] [--conf KEY=VALUE] ARGS...
    spark-submit [--packages ...] spark_jobs/__main__.py JOB ARGS...

JOB is reshard, archive or aggregate (``python -m spark_jobs JOB --help``),
or feed, which produces test events without Spark. By default Spark runs in
this process, ``local[*]``, with the Kafka connector from the JVM cache (or
from Maven Central with --packages). Under spark-submit the job takes the
session spark-submit made: its master, its --packages or --jars.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from common.key_value import parse_pairs
from spark_jobs import aggregate, archive, feed, reshard, session

JOBS = {"reshard": reshard, "archive": archive, "aggregate": aggregate}


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m spark_jobs", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    jobs = top.add_subparsers(dest="job", required=True, metavar="JOB")
    for name, module in JOBS.items():
        job = jobs.add_parser(name, help=_summary(module),
                              description=module.__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(job)
        spark = job.add_argument_group("Spark (ignored under spark-submit)")
        spark.add_argument("--master", default="local[*]",
                           help="Spark master (default local[*])")
        spark.add_argument("--packages", action="store_true",
                           help="download the Kafka connector from Maven Central "
                                "(spark.jars.packages) instead of using the JVM cache")
        spark.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                           help="a Spark setting (repeatable)")
    feeder = jobs.add_parser("feed", help=_summary(feed), description=feed.__doc__,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    feed.add_arguments(feeder)
    return top


def _summary(module: object) -> str:
    """The first docstring line without its "name: " prefix."""
    return (module.__doc__ or "").split("\n")[0].split(": ", 1)[-1]


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                        format="%(asctime)s %(name)s: %(message)s")
    if args.job == "feed":
        feed.run(args)
        return 0
    if "PYSPARK_GATEWAY_PORT" in os.environ:  # spark-submit made the JVM and its session
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.appName(f"kafka-gateway-{args.job}").getOrCreate()
    else:
        try:
            spark = session.start(f"kafka-gateway-{args.job}", args.master, args.packages,
                                  parse_pairs(args.conf, "spark_jobs: --conf"))
        except session.ConnectorMissing as exc:
            print(f"spark_jobs: {exc}", file=sys.stderr)
            return 2
    try:
        JOBS[args.job].run(spark, args)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
