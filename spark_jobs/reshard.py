"""reshard: SOURCE -> TARGET keyed and partitioned by the user id, exactly once.

Reads SOURCE with Spark's Kafka source (read_committed) and writes every
record to TARGET with the ``user_id`` of its JSON value as the key, in the
partition the Java client's partitioner picks for that key (murmur2), so all
of a user's events land in one partition. Values and headers are unchanged.

Exactly once across crashes and restarts: each micro-batch is written in
``foreachBatch`` by one transaction per source partition (one Spark task
each), with confluent-kafka's transactional producer, whose
``transactional.id`` is stable per query and partition
(``<query name>-<topic>-<partition>``). The transaction also commits the
partition's end offset to the consumer group GROUP. A task first asks the
group: if it already holds an offset past the task's first record, that
batch was committed before (a replay after a crash) and the task skips it.
A zombie task never publishes: the gateway refuses a second commit of the
same range, by fencing (same transactional id) or by its offset-range check
(another id). See docs/spark.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from functools import partial
from typing import Any

from spark_jobs.common import add_bootstrap, add_trigger, kafka_reader, log_progress, with_trigger

log = logging.getLogger("spark_jobs.reshard")

# A test's hook inside a task: called with "produced" (records sent, offsets
# not yet) and "offsets-sent" (before the commit).
Pause = Callable[[str], None]
# Called by the driver after each batch with its id and the tasks' outcomes.
AfterBatch = Callable[[int, list[dict[str, Any]]], None]


@dataclass(frozen=True)
class Writer:
    """What a task needs to write its partition of a batch (pickled to executors)."""

    bootstrap: str
    target: str
    group: str
    query_name: str
    timeout: float = 60.0


def transactional_id(query_name: str, topic: str, partition: int) -> str:
    """Stable per query and source partition: a rerun of a batch's task, after
    a crash or by a zombie, has the same id, and its InitProducerId fences
    every earlier producer of that id."""
    return f"{query_name}-{topic}-{partition}"


def write_partition(writer: Writer, rows: Iterable[Any],
                    pause: Pause | None = None) -> dict[str, Any] | None:
    """Write one source partition's records of a batch in one transaction.

    ``rows`` are Kafka source rows (topic, partition, offset, key, value,
    headers, user_id) of one source partition in offset order, as a Spark
    task of the Kafka source holds them. Returns the outcome, or None for no
    rows. Raises if the records were not written and nobody else wrote them.
    """
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

    rows = iter(rows)
    first = next(rows, None)
    if first is None:
        return None
    topic, partition, start = first.topic, first.partition, first.offset
    txn_id = transactional_id(writer.query_name, topic, partition)
    outcome = {"topic": topic, "partition": partition, "start": start, "end": None,
               "records": 0, "transactional_id": txn_id}
    producer = Producer({
        "bootstrap.servers": writer.bootstrap,
        "transactional.id": txn_id,
        "transaction.timeout.ms": int(writer.timeout * 1000),
        "partitioner": "murmur2_random",  # the Java client's choice for a key
        "linger.ms": 5,
    })
    # read_uncommitted: the group's last committed offset, without waiting for
    # a pending transaction's offsets (a hung zombie's could hold them for the
    # whole transaction timeout); the gateway decides between the two at commit.
    consumer = Consumer({"bootstrap.servers": writer.bootstrap, "group.id": writer.group,
                         "enable.auto.commit": False, "isolation.level": "read_uncommitted"})
    source = TopicPartition(topic, partition)

    def held() -> int:
        [committed] = consumer.committed([source], timeout=writer.timeout)
        return committed.offset

    try:
        producer.init_transactions(writer.timeout)
        done = held()
        if done > start:
            return {**outcome, "status": "skipped", "detail": f"group holds {done}"}
        producer.begin_transaction()
        count, last = _produce(producer, writer, (topic, partition), first, rows)
        if pause:
            pause("produced")
        producer.send_offsets_to_transaction(
            [TopicPartition(topic, partition, last + 1)],
            consumer.consumer_group_metadata(), writer.timeout)
        if pause:
            pause("offsets-sent")
        producer.commit_transaction(writer.timeout)
        return {**outcome, "end": last + 1, "records": count, "status": "committed",
                "detail": ""}
    except KafkaException as exc:
        error = exc.args[0]
        if error.txn_requires_abort():
            # Fenced meanwhile: nothing of this transaction is published anyway.
            with suppress(KafkaException):
                producer.abort_transaction(writer.timeout)
        done = held()
        if done > start:
            # Another producer (a zombie, or the live task if this is the zombie)
            # committed this range: the gateway let exactly one of us through.
            return {**outcome, "status": "lost", "detail":
                    f"{error.name()}: group holds {done}, committed by another producer"}
        raise RuntimeError(f"{txn_id}: records from offset {start} not written: {error}") \
            from exc
    finally:
        consumer.close()


def _produce(producer: Any, writer: Writer, source: tuple[str, int], first: Any,
             rest: Iterator[Any]) -> tuple[int, int]:
    """Send every row, in offset order; returns (records, last offset)."""
    count, last, spread = 0, -1, None
    for row in _chain(first, rest):
        if (row.topic, row.partition) != source:
            raise RuntimeError(f"a task holds {source} and {(row.topic, row.partition)}: "
                               "the batch must keep the Kafka source's partitioning")
        if row.offset <= last:
            raise RuntimeError(f"{source}: offset {row.offset} after {last}")
        key = row.user_id if row.user_id is not None else _bytes(row.key)
        extra: dict[str, Any] = {}
        if key is None:
            # Keyless and no user: keep the source partition's order in one partition.
            if spread is None:
                spread = len(producer.list_topics(writer.target, timeout=writer.timeout)
                             .topics[writer.target].partitions)
            extra["partition"] = source[1] % spread
        headers = [(h.key, _bytes(h.value)) for h in row.headers] if row.headers else None
        while True:
            try:
                producer.produce(writer.target, key=key, value=_bytes(row.value),
                                 headers=headers, **extra)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
        count, last = count + 1, row.offset
    return count, last


def _bytes(value: bytearray | None) -> bytes | None:
    """Spark hands binary columns over as bytearray; the producer takes bytes."""
    return None if value is None else bytes(value)


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest


def _task(writer: Writer, rows: Iterable[Any]) -> list[dict[str, Any]]:
    outcome = write_partition(writer, rows)
    return [] if outcome is None else [outcome]


def source_rows(batch: Any) -> Any:
    """The columns a task needs, the user id parsed from the JSON value."""
    from pyspark.sql import functions as F

    user_id = F.get_json_object(F.col("value").cast("string"), "$.user_id")
    return batch.select("topic", "partition", "offset", "key", "value", "headers",
                        user_id.alias("user_id"))


def write_batch(writer: Writer, after_batch: AfterBatch | None = None
                ) -> Callable[[Any, int], None]:
    """The foreachBatch function: one transaction per source partition."""

    def run(batch: Any, batch_id: int) -> None:
        began = time.monotonic()
        outcomes = source_rows(batch).rdd.mapPartitions(partial(_task, writer)).collect()
        for o in sorted(outcomes, key=lambda o: (o["topic"], o["partition"])):
            log.info("%s: batch %d: %s[%d] from %d: %s %d records %s", writer.query_name,
                     batch_id, o["topic"], o["partition"], o["start"], o["status"],
                     o["records"], o["detail"])
        written = sum(o["records"] for o in outcomes if o["status"] == "committed")
        log.info("%s: batch %d written: %d records in %d transactions, %d skipped, "
                 "%d lost to another producer, %.1f s", writer.query_name, batch_id, written,
                 sum(o["status"] == "committed" for o in outcomes),
                 sum(o["status"] == "skipped" for o in outcomes),
                 sum(o["status"] == "lost" for o in outcomes), time.monotonic() - began)
        if after_batch is not None:
            after_batch(batch_id, outcomes)

    return run


def group_offsets(bootstrap: str, group: str, topic: str, timeout: float = 60.0) -> str:
    """Spark's startingOffsets JSON from GROUP's committed offsets (earliest
    where it has none): a query without a checkpoint resumes where the
    transactions left off."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    try:
        metadata = consumer.list_topics(topic, timeout=timeout).topics[topic]
        if metadata.error is not None:  # no topic yet: nothing consumed either
            log.info("%s: %s; starting at the earliest offsets", topic, metadata.error)
            return "earliest"
        committed = consumer.committed(
            [TopicPartition(topic, p) for p in sorted(metadata.partitions)], timeout=timeout)
    finally:
        consumer.close()
    return json.dumps({topic: {str(tp.partition): tp.offset if tp.offset >= 0 else -2
                               for tp in committed}})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_bootstrap(parser)
    parser.add_argument("--source", required=True, help="topic to read")
    parser.add_argument("--target", required=True, help="topic to write")
    parser.add_argument("--checkpoint", required=True, metavar="DIR",
                        help="Spark's checkpoint directory for this query")
    parser.add_argument("--query-name", help="names the query, its transactional ids "
                        "and (by default) its group; default reshard-SOURCE-TARGET")
    parser.add_argument("--group", help="consumer group holding the committed source "
                        "offsets; default: the query name")
    parser.add_argument("--starting-offsets", default="group",
                        help="where a query without a checkpoint starts: 'group' (the "
                        "group's offsets, earliest where none), 'earliest', 'latest' or "
                        "Spark's JSON (default: group)")
    parser.add_argument("--max-offsets-per-trigger", type=int,
                        help="cap the records of one micro-batch")
    parser.add_argument("--transaction-timeout", type=float, default=60.0, metavar="SECONDS")
    add_trigger(parser)


def start(spark: Any, args: argparse.Namespace, after_batch: AfterBatch | None = None) -> Any:
    """Start the reshard query; returns the StreamingQuery."""
    name = args.query_name or f"reshard-{args.source}-{args.target}"
    writer = Writer(args.bootstrap_servers, args.target, args.group or name, name,
                    args.transaction_timeout)
    starting = args.starting_offsets
    if starting == "group":
        starting = group_offsets(args.bootstrap_servers, writer.group, args.source)
    log_progress(spark)
    reader = kafka_reader(spark.readStream, args.bootstrap_servers, args.source, starting)
    if args.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", args.max_offsets_per_trigger)
    log.info("%s: %s -> %s, group %s, transactional ids %s-%s-<partition>", name,
             args.source, args.target, writer.group, name, args.source)
    query = (reader.load().writeStream.queryName(name)
             .option("checkpointLocation", args.checkpoint)
             .foreachBatch(write_batch(writer, after_batch)))
    return with_trigger(query, args).start()


def run(spark: Any, args: argparse.Namespace) -> None:
    start(spark, args).awaitTermination()

