"""Fetch (key 1), v4-13: read batches from partition tablets, long-polling.

- From the batch that contains the fetch offset (the client skips records
  below it), whole batches only, within partition_max_bytes and max_bytes
  (itself at most the node's ``fetch.max.bytes``, 55 MiB, as in Kafka);
  the first batch of the response is returned even when larger (KIP-74), and
  each partition returns at least one batch while the response has room.
- Waits up to max_wait for min_bytes, woken when any fetched partition's high
  watermark moves. Errors, and a request naming no partition, answer at once.
- Both isolation levels read the same data: transactional data reaches a
  log only when committed, so the last stable offset is the high watermark
  and no transaction is ever aborted (the list is empty for READ_COMMITTED,
  null for READ_UNCOMMITTED, as Kafka sends it). A partition in error has
  no offsets (-1), as in Kafka.
- v13 addresses topics by id (the zero id is UNKNOWN_TOPIC_ID, answered as
  sent). Fetch sessions (KIP-227) are not kept: the answer's session id is 0,
  which tells clients to send full requests.
- With an authorizer, each topic needs READ (TOPIC_AUTHORIZATION_FAILED; by
  name also for topics that do not exist, as Kafka checks before looking).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, TypeAlias
from uuid import UUID

from kio.schema.errors import ErrorCode
from kio.schema.fetch.v13 import request as v13

from tablets.seam import FileRegion, PartitionLog

from ..codec import EncodedBody, Request
from ..context import HandlerContext
from ..contract import Response
from ..errors import EXPECTED, code_of, error_code
from ..leader_epoch import leader_epoch_error
from ..metrics import Metrics
from ..routing import leader_epoch
from ..security.acls import Operation, ResourceType
from ..security.authorizer import authorize
from ..slicing import LARGE_RESPONSE_ITEMS, Slices, off_loop
from .fetch_response import PartitionResult, encode

if TYPE_CHECKING:
    from kio.schema.fetch.v4 import request as v4
    from kio.schema.fetch.v5 import request as v5
    from kio.schema.fetch.v6 import request as v6
    from kio.schema.fetch.v7 import request as v7
    from kio.schema.fetch.v8 import request as v8
    from kio.schema.fetch.v9 import request as v9
    from kio.schema.fetch.v10 import request as v10
    from kio.schema.fetch.v11 import request as v11
    from kio.schema.fetch.v12 import request as v12

    # The request body at each version served: kio generates one class per version.
    FetchRequest: TypeAlias = (
        v4.FetchRequest | v5.FetchRequest | v6.FetchRequest | v7.FetchRequest | v8.FetchRequest
        | v9.FetchRequest | v10.FetchRequest | v11.FetchRequest | v12.FetchRequest
        | v13.FetchRequest
    )

    FetchTopic: TypeAlias = (
        v4.FetchTopic | v5.FetchTopic | v6.FetchTopic | v7.FetchTopic | v8.FetchTopic
        | v9.FetchTopic | v10.FetchTopic | v11.FetchTopic | v12.FetchTopic | v13.FetchTopic
    )

    FetchPartition: TypeAlias = (
        v4.FetchPartition | v5.FetchPartition | v6.FetchPartition | v7.FetchPartition
        | v8.FetchPartition | v9.FetchPartition | v10.FetchPartition | v11.FetchPartition
        | v12.FetchPartition | v13.FetchPartition
    )

API_KEY = 1
VERSIONS = (4, 13)
_NO_ID = UUID(int=0)
ONE_AT_A_TIME = True  # answers can be large: at most one waits for a slow reader
# A partition read: (error, high watermark, log start offset, batches).
_Read: TypeAlias = tuple[ErrorCode, int, int, list[bytes | FileRegion]]


class _Wanted:
    """One requested partition, resolved to its tablet (or its error)."""

    __slots__ = ("error", "fetch_offset", "index", "key", "max_bytes", "tablet")

    def __init__(self, key: str | UUID, index: int, fetch_offset: int, max_bytes: int,
                 tablet: PartitionLog | None, error: ErrorCode) -> None:
        self.key = key  # topic name, or topic id for v13
        self.index = index
        self.fetch_offset = fetch_offset
        self.max_bytes = max_bytes
        self.tablet: PartitionLog | None = tablet
        self.error: ErrorCode = error


async def handle(broker: HandlerContext, request: Request[FetchRequest]) -> Response:
    body = request.body
    version = request.version
    by_id = version >= 13
    # Loops written out with Slices, not sliced(): an async generator per loop
    # costs a tail fetch more than its one partition's work.
    wanted: list[_Wanted] = []
    slices = Slices()
    for topic in body.topics:
        key = _topic_key(topic)
        for part in topic.partitions:
            wanted.append(_resolve(broker, key, part, by_id))
            if slices.due():
                await slices.pause()
    if broker.authorizer is not None:
        _authorize(broker, request, wanted, by_id)
    deadline = time.monotonic() + body.max_wait.total_seconds()
    min_bytes = max(body.min_bytes, 1)
    # As Kafka, at most the node's fetch.max.bytes whatever the client asks: a
    # read walks its partition's index on the event loop, so its cost must
    # not grow with what a client may ask for.
    asked = body.max_bytes if body.max_bytes > 0 else 0x7FFFFFFF
    max_bytes = min(asked, broker.config.fetch_max_bytes)
    while True:
        parts, total, failed = await _read_all(wanted, max_bytes)
        remaining = deadline - time.monotonic()
        # No partitions at all is answered at once, as Kafka does.
        if total >= min_bytes or failed or remaining <= 0 or broker.stopping or not wanted:
            break
        await _wait_for_data([w.tablet for w in wanted if w.tablet is not None], remaining)
    await _count(broker.metrics, wanted, parts, total)
    return await off_loop(len(wanted) > LARGE_RESPONSE_ITEMS, _response, version, wanted, parts,
                          body.isolation_level == 1)


async def _count(metrics: Metrics, wanted: list[_Wanted], parts: list[_Read], total: int) -> None:
    """Bytes per topic and error codes (the answer is encoded here, not by kio)."""
    metrics.fetched_bytes += total
    slices = Slices()
    for want, (code, _hw, _start, batches) in zip(wanted, parts, strict=True):
        if slices.due():
            await slices.pause()
        if code is not ErrorCode.none:
            metrics.response_errors[("fetch", code.name.upper())] += 1
        elif batches:
            assert want.tablet is not None  # none of an error was read
            metrics.topic_bytes_out[want.tablet.topic_id] += sum(map(len, batches))


def _topic_key(topic: FetchTopic) -> str | UUID:
    """v13 names a topic by id: kio reads the zero id (an id never assigned)
    as None; it is answered as sent."""
    if isinstance(topic, v13.FetchTopic):
        return topic.topic_id or _NO_ID
    return topic.topic


def _resolve(broker: HandlerContext, key: str | UUID, part: FetchPartition,
             by_id: bool) -> _Wanted:
    # by_id: the key is a UUID (_topic_key)
    topic = (broker.engine.topic_by_id(key) if isinstance(key, UUID)
             else broker.engine.find_topic(key))
    error = ErrorCode.none
    tablet = None
    if topic is None:
        error = ErrorCode.unknown_topic_id if by_id else ErrorCode.unknown_topic_or_partition
    elif not 0 <= part.partition < len(topic.partitions):
        error = ErrorCode.unknown_topic_or_partition
    elif (cluster := broker.engine.cluster()) is not None and not cluster.leads(
            topic.name, part.partition):
        error = ErrorCode.not_leader_or_follower  # another gateway leads it (routing.py)
    elif (fenced := leader_epoch_error(max(getattr(part, "current_leader_epoch", -1), -1),
                                       leader_epoch(broker, topic.name, part.partition))).value:
        error = fenced  # v9+ clients name the epoch they know; Kafka ignores negative ones
    else:
        tablet = topic.partitions[part.partition]
    return _Wanted(key, part.partition, part.fetch_offset, part.partition_max_bytes, tablet, error)


def _authorize(broker: HandlerContext, request: Request[object], wanted: list[_Wanted],
               by_id: bool) -> None:
    """Partitions of topics the principal may not read answer TOPIC_AUTHORIZATION_FAILED."""
    codes: dict[str | UUID, ErrorCode] = {}
    for want in wanted:
        if by_id and want.error is ErrorCode.unknown_topic_id:
            continue  # nothing to name: unknown ids stay unknown
        if want.key not in codes:
            found = broker.engine.topic_by_id(want.key) if isinstance(want.key, UUID) else None
            name = found.name if found is not None else want.key
            codes[want.key] = code_of(authorize, broker, request, Operation.READ,
                                      ResourceType.TOPIC, name)
        if codes[want.key]:
            want.tablet, want.error = None, codes[want.key]


async def _read_all(wanted: list[_Wanted], max_bytes: int) -> tuple[list[_Read], int, bool]:
    """Read every partition once; returns (results, bytes read, any error)."""
    # Batches as the engine hands them out: bytes, or regions of its files that
    # the connection sends without reading them (connection/regions.py).
    parts: list[_Read] = []
    total = 0
    failed = False
    slices = Slices()
    for want in wanted:
        if slices.due():
            await slices.pause()
        tablet = want.tablet
        if tablet is None or tablet.deleted:
            code = want.error if tablet is None else ErrorCode.unknown_topic_or_partition
            parts.append((code, -1, -1, []))
            failed = True
            continue
        room = max_bytes - total
        if room <= 0:  # the response is full: this partition's data comes next time
            parts.append((ErrorCode.none, tablet.high_watermark, tablet.log_start_offset, []))
            continue
        try:
            result = await tablet.read(want.fetch_offset, min(want.max_bytes, room))
        except EXPECTED as exc:
            parts.append((error_code(exc), -1, -1, []))  # as Kafka: no offsets with an error
            failed = True
            continue
        if result.batches and total and result.nbytes > room:
            # Not the first data in the response, and over its budget: next time.
            result.batches = []
        total += result.nbytes
        parts.append((ErrorCode.none, result.high_watermark, result.log_start_offset,
                      result.batches))
    return parts, total, failed


async def _wait_for_data(tablets: list[PartitionLog], timeout: float) -> None:
    if len(tablets) == 1:
        await _wait_for_one(tablets[0], timeout)
        return
    waiters = [t.waiter() for t in tablets]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for tablet, waiter in zip(tablets, waiters, strict=True):
            if not waiter.done():
                waiter.cancel()
                tablet.forget_waiter(waiter)


async def _wait_for_one(tablet: PartitionLog, timeout: float) -> None:
    """One partition's waiter, awaited by the task itself: the task wakes in the
    loop pass after the high watermark moves, where ``asyncio.wait`` resolves a
    future of its own first and wakes it a pass later, after the producer's
    answer (docs/performance.md, "End-to-end median"). The timeout wakes it as
    a move would: the caller reads again and sees its time is up."""
    waiter = tablet.waiter()
    timer = asyncio.get_running_loop().call_later(timeout, _wake, waiter)
    try:
        await waiter
    finally:
        timer.cancel()
        if not waiter.done():  # the task was cancelled
            waiter.cancel()
        tablet.forget_waiter(waiter)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _response(version: int, wanted: list[_Wanted], parts: list[_Read],
              read_committed: bool) -> EncodedBody:
    topics: dict[str | UUID, list[PartitionResult]] = {}
    for want, (code, hw, log_start, batches) in zip(wanted, parts, strict=True):
        topics.setdefault(want.key, []).append((want.index, code.value, hw, log_start, batches))
    return encode(version, topics, read_committed)
