"""``kafka-gateway groups reset-offsets``: move the committed offsets of
inactive groups, as ``kafka-consumer-groups.sh --reset-offsets`` does.

- Scope: ``--topic T`` (every partition), ``--topic T:0,2`` (some),
  ``--all-topics`` (every partition the group has an offset for), or the
  partitions of ``--from-file``.
- Target, one of: ``--to-earliest``, ``--to-latest``, ``--to-current``,
  ``--to-offset N``, ``--shift-by N`` (from the committed offset; a partition
  without one is an error), ``--to-datetime`` (the first record at or after
  the time, ISO-8601, local time without a zone), ``--by-duration``
  (``PnDTnHnMnS`` before now), ``--from-file`` (CSV lines
  ``topic,partition,offset``, as ``--export`` prints them). Kafka's rules:
  a time with no record that recent resets to the log end offset; a target
  outside ``[log start, log end]`` is moved to the nearer end, with a warning.
- A group with members is refused (only Empty and Dead groups are reset:
  the members would overwrite the reset with their next commit).
- Nothing is changed without ``--execute``; ``--dry-run`` (the default)
  prints the plan.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import re
import sys
import time
from collections.abc import Iterable

from kio.schema.errors import ErrorCode
from kio.schema.offset_commit.v8 import request as offset_commit

from ..cluster_client import GROUP, ClusterClient
from .common import (
    EARLIEST,
    LATEST,
    committed_offsets,
    group_state,
    offsets_at,
    print_rows,
    topic_partitions,
)

TopicPartition = tuple[str, int]
INACTIVE = ("Empty", "Dead")

_DURATION = re.compile(
    r"([-+]?)P(?:([-+]?\d+)D)?"
    r"(?:T(?:([-+]?\d+)H)?(?:([-+]?\d+)M)?(?:([-+]?\d+(?:[.,]\d{0,9})?)S)?)?", re.IGNORECASE)


def add_reset_arguments(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("--topic", action="append", default=[], metavar="TOPIC[:P,P...]",
                       help="reset this topic, or some of its partitions (repeatable)")
    scope.add_argument("--all-topics", action="store_true",
                       help="reset every partition the group has a committed offset for")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-earliest", action="store_true", help="to the log start offset")
    target.add_argument("--to-latest", action="store_true", help="to the log end offset")
    target.add_argument("--to-current", action="store_true",
                        help="to the committed offset (the log end offset where none)")
    target.add_argument("--to-offset", type=int, metavar="OFFSET", help="to this offset")
    target.add_argument("--shift-by", type=int, metavar="N",
                        help="by N from the committed offset (negative: back)")
    target.add_argument("--to-datetime", type=_datetime_ms, metavar="YYYY-MM-DDTHH:mm:SS.sss",
                        help="to the first record at or after this time (ISO-8601; local time "
                             "unless it ends with Z or +hh:mm)")
    target.add_argument("--by-duration", type=_duration_ms, metavar="PnDTnHnMnS",
                        help="to the first record at or after this long ago (ISO-8601 duration, "
                             "e.g. PT1H30M, P1D)")
    target.add_argument("--from-file", metavar="CSV",
                        help="to the offsets of a CSV file of topic,partition,offset lines "
                             "(what --export prints)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true",
                      help="only print the new offsets (the default)")
    mode.add_argument("--execute", action="store_true", help="commit the new offsets")
    parser.add_argument("--export", action="store_true",
                        help="print the plan as CSV (topic,partition,offset; with the group "
                             "first when several groups are reset)")


def parse_topic_partitions(items: Iterable[str]) -> dict[str, list[int] | None]:
    """``T`` (None: every partition) or ``T:0,1,2``, as Kafka's tools read --topic."""
    out: dict[str, list[int] | None] = {}
    for item in items:
        topic, sep, partitions = item.partition(":")
        if not topic:
            raise SystemExit(f"kafka-gateway: expected TOPIC or TOPIC:P,P..., got {item!r}")
        if not sep:
            out[topic] = None
            continue
        try:
            indexes = [int(p) for p in partitions.split(",")]
        except ValueError:
            raise SystemExit(f"kafka-gateway: bad partition list in {item!r}") from None
        if topic not in out or out[topic] is not None:
            out[topic] = sorted({*(out.get(topic) or ()), *indexes})
    return out


async def reset_offsets(client: ClusterClient, groups: list[str], args: argparse.Namespace) -> int:
    if not (args.topic or args.all_topics or args.from_file):
        raise SystemExit("kafka-gateway: reset-offsets needs --topic, --all-topics or --from-file")
    if not args.execute and not args.dry_run and not args.export:
        print("WARN: No action is performed without --execute; this is a dry run "
              "(--dry-run says so explicitly).", file=sys.stderr)
    status = 0
    plans: list[tuple[str, dict[TopicPartition, int]]] = []
    for group in groups:
        state = (await group_state(client, group)).group_state
        if state not in INACTIVE:
            print(f"Error: offsets can only be reset while group '{group}' is inactive "
                  f"(Empty), but its state is {state}.", file=sys.stderr)
            status = 1
            continue
        plan = await _plan(client, group, args)
        if args.execute:
            status = max(status, await _commit(client, group, plan))
        plans.append((group, plan))
    _print_plans(plans, args.export)
    return status


async def _plan(client: ClusterClient, group: str, args: argparse.Namespace
                ) -> dict[TopicPartition, int]:
    committed = await committed_offsets(client, group)
    if args.from_file:
        wanted = _read_plan(args.from_file, group)
        partitions = sorted(wanted)
    else:
        partitions = await _scope(client, committed, args)
    if args.to_earliest:
        return await _at(client, partitions, EARLIEST)
    if args.to_latest:
        return await _at(client, partitions, LATEST)
    if args.to_current:
        missing = [tp for tp in partitions if tp not in committed]
        return {**await _at(client, missing, LATEST),
                **{tp: committed[tp] for tp in partitions if tp in committed}}
    if args.to_datetime is not None or args.by_duration is not None:
        at = args.to_datetime if args.to_datetime is not None else (
            int(time.time() * 1000) - args.by_duration)
        found = await _at(client, partitions, at, allow_missing=True)
        # No record that recent: the log end offset, as Kafka's tool does.
        found.update(await _at(client, [tp for tp in partitions if found[tp] < 0], LATEST))
        return found
    if args.shift_by is not None:
        for tp in partitions:
            if tp not in committed:
                raise SystemExit(f"kafka-gateway: cannot shift the offset of {tp[0]}-{tp[1]} "
                                 f"of group {group}: it has no committed offset")
        requested = {tp: committed[tp] + args.shift_by for tp in partitions}
    elif args.to_offset is not None:
        requested = dict.fromkeys(partitions, args.to_offset)
    else:
        requested = wanted
    return await _within_log(client, requested)


async def _scope(client: ClusterClient, committed: dict[TopicPartition, int],
                 args: argparse.Namespace) -> list[TopicPartition]:
    if args.all_topics:
        return sorted(committed)
    named = parse_topic_partitions(args.topic)
    existing = await topic_partitions(client, list(named))
    out = []
    for topic, partitions in named.items():
        for p in partitions if partitions is not None else existing[topic]:
            if p not in existing[topic]:
                raise SystemExit(f"kafka-gateway: {topic} has no partition {p}")
            out.append((topic, p))
    return out


async def _at(client: ClusterClient, partitions: list[TopicPartition], timestamp: int,
              allow_missing: bool = False) -> dict[TopicPartition, int]:
    found = await offsets_at(client, dict.fromkeys(partitions, timestamp))
    for tp in partitions:
        if tp not in found:
            raise SystemExit(f"kafka-gateway: no offsets for {tp[0]}-{tp[1]}")
        if found[tp] < 0 and not allow_missing:
            raise SystemExit(f"kafka-gateway: no offset at {timestamp} for {tp[0]}-{tp[1]}")
    return found


async def _within_log(client: ClusterClient,
                      requested: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
    """Targets outside [log start, log end] move to the nearer end, as in Kafka."""
    earliest = await _at(client, list(requested), EARLIEST)
    latest = await _at(client, list(requested), LATEST)
    out = {}
    for tp, offset in requested.items():
        if offset < earliest[tp]:
            print(f"New offset ({offset}) is lower than the earliest offset of {tp[0]}-{tp[1]}: "
                  f"{earliest[tp]} is used.", file=sys.stderr)
            offset = earliest[tp]
        elif offset > latest[tp]:
            print(f"New offset ({offset}) is higher than the latest offset of {tp[0]}-{tp[1]}: "
                  f"{latest[tp]} is used.", file=sys.stderr)
            offset = latest[tp]
        out[tp] = offset
    return out


def _read_plan(path: str, group: str) -> dict[TopicPartition, int]:
    """topic,partition,offset lines, or group,topic,partition,offset (this group's)."""
    out = {}
    with open(path, newline="") as source:
        for number, row in enumerate(csv.reader(source), 1):
            if not row:
                continue
            if len(row) == 4:
                if row[0] != group:
                    continue
                row = row[1:]
            try:
                topic, partition, offset = row[0], int(row[1]), int(row[2])
            except (ValueError, IndexError):
                raise SystemExit(f"kafka-gateway: {path}:{number}: expected "
                                 f"topic,partition,offset") from None
            out[(topic, partition)] = offset
    return out


async def _commit(client: ClusterClient, group: str, plan: dict[TopicPartition, int]) -> int:
    by_topic: dict[str, list[tuple[int, int]]] = {}
    for (topic, partition), offset in sorted(plan.items()):
        by_topic.setdefault(topic, []).append((partition, offset))
    if not by_topic:
        return 0
    request = offset_commit.OffsetCommitRequest(
        group_id=group, generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
        topics=tuple(offset_commit.OffsetCommitRequestTopic(name=topic, partitions=tuple(
            offset_commit.OffsetCommitRequestPartition(
                partition_index=p, committed_offset=o, committed_leader_epoch=-1,
                committed_metadata="")
            for p, o in parts)) for topic, parts in by_topic.items()))
    response = await client.to_coordinator(
        f"commit offsets of {group}", group, GROUP,
        lambda coordinator: coordinator.request(request),
        lambda answer: next((p.error_code for t in answer.topics for p in t.partitions
                             if p.error_code is not ErrorCode.none), ErrorCode.none))
    status = 0
    for topic in response.topics:
        for part in topic.partitions:
            if part.error_code is not ErrorCode.none:
                print(f"Error: group {group} could not commit {topic.name}-"
                      f"{part.partition_index}: {part.error_code.name.upper()}", file=sys.stderr)
                status = 1
    return status


def _print_plans(plans: list[tuple[str, dict[TopicPartition, int]]], export: bool) -> None:
    if export:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        for group, plan in plans:
            for (topic, partition), offset in sorted(plan.items()):
                prefix = [group] if len(plans) > 1 else []
                writer.writerow([*prefix, topic, partition, offset])
        return
    rows = [("GROUP", "TOPIC", "PARTITION", "NEW-OFFSET")]
    rows += [(group, topic, str(partition), str(offset))
             for group, plan in plans for (topic, partition), offset in sorted(plan.items())]
    if len(rows) > 1:
        print_rows(rows)


def _datetime_ms(text: str) -> int:
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an ISO-8601 time such as 2024-01-31T12:00:00.000, got {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.astimezone()  # local time, as Kafka's tool reads it
    return int(moment.timestamp() * 1000)


def _duration_ms(text: str) -> int:
    match = _DURATION.fullmatch(text.strip())
    if match is None or not any(match.groups()[1:]):
        raise argparse.ArgumentTypeError(
            f"expected an ISO-8601 duration such as PT1H or P1DT12H, got {text!r}")
    sign, days, hours, minutes, seconds = match.groups()
    total = (int(days or 0) * 86400 + int(hours or 0) * 3600 + int(minutes or 0) * 60
             + float((seconds or "0").replace(",", ".")))
    return round(total * 1000) * (-1 if sign == "-" else 1)
