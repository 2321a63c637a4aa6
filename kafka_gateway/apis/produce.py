"""Produce (key 0), v0-9: append record batches to partition tablets.

Each partition's record set is validated whole, as Kafka's LogValidator does
(``tablets.validate``: one batch, CRC-32C, counts, every record, timestamps,
max.message.bytes), before anything of it is stored; a refused batch gets
CORRUPT_MESSAGE, INVALID_RECORD, INVALID_TIMESTAMP or MESSAGE_TOO_LARGE,
with record_errors (v8+) naming the records at fault. Offsets are assigned
in arrival order and the answer waits until the batches are in the WAL, for
acks 1 and -1 alike (one copy: there is no ISR to wait for).
acks=0 gets no answer at all, as in Kafka. A topic is not auto-created here
(Kafka creates topics on Metadata, which clients send first).

Idempotent producers' batches are checked against their sequences: a retry
is answered with its original offset, a gap with OUT_OF_ORDER_SEQUENCE_NUMBER.
A transactional batch is stored outside the log until its transaction
commits, so its answer carries base offset -1 (as YDB's Kafka API answers):
its offsets are assigned at commit. It is checked as Kafka 3.6+ verifies one
(KIP-890), with Kafka 3.6+'s answers to clients of these versions:

- a request with transactional batches and no transactional id: every
  partition TRANSACTIONAL_ID_AUTHORIZATION_FAILED (as Kafka, with or without
  an authorizer); with an empty one, INVALID_REQUEST;
- batches of more than one producer id: every partition
  INVALID_PRODUCER_ID_MAPPING;
- a producer id that is not the transactional id's (another id's producer
  writing into its transaction, which Kafka 3.4 allows):
  INVALID_PRODUCER_ID_MAPPING;
- an old epoch: INVALID_PRODUCER_EPOCH;
- while the transaction's commit waits for its in-flight batches:
  NOT_ENOUGH_REPLICAS (Kafka's translation of CONCURRENT_TRANSACTIONS,
  retriable for every client);
- a partition not added to the open transaction (AddPartitionsToTxn):
  INVALID_TXN_STATE.

A batch whose transaction ends (aborted, fenced, timed out) while its records
are checked on a worker thread stores nothing and gets the same answer
(INVALID_PRODUCER_EPOCH once the epoch moved, else INVALID_TXN_STATE); a
commit waits for such batches, so an acknowledged batch is always committed
with its transaction (``txn/pending.py``).

With an authorizer: a request with transactional batches needs WRITE on its
transactional id (else every partition gets
TRANSACTIONAL_ID_AUTHORIZATION_FAILED), and each topic needs WRITE
(TOPIC_AUTHORIZATION_FAILED, also for topics that do not exist); nothing of a
refused partition is stored.

v0-2 are answered too, as by Kafka 3.4: librdkafka before 2.11.1 compresses
(gzip, snappy, lz4) only for a broker that advertises Produce v0. A message
set in the old formats (magic 0 or 1) gets UNSUPPORTED_FOR_MESSAGE_FORMAT,
like any other. Requests of every version are read by
``produce_request.decode`` and answered by ``produce_response.encode`` (both
by hand: the hot path).

A request of many partitions appends in slices (slicing.py), holding its
connection's append lock: the requests of one connection still append in the
order sent, and the other connections are served in between.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeAlias

from kio.schema.errors import ErrorCode

from common.clock import now_ms
from tablets.batch import transactional_producer
from tablets.seam import AppendResult
from txn.remote_produce import RemoteTransactions
from txn.state import TxnMetadata

from ..answers import refuse_denied
from ..codec import Request
from ..context import HandlerContext
from ..contract import Response
from ..errors import (
    EXPECTED,
    CorruptMessage,
    InvalidProducerIdMapping,
    InvalidRequest,
    InvalidRequiredAcks,
    KafkaError,
    NotEnoughReplicas,
    TransactionalIdAuthorizationFailed,
    answer_class,
    error_message,
    record_errors,
)
from ..security.acls import Operation, ResourceType
from ..security.authorizer import authorize_txn, denied_names
from ..slicing import Slices, never_yields
from . import produce_response
from .produce_request import PartitionProduceData, ProduceRequest, TopicProduceData, decode
from .produce_response import PartitionAnswer

__all__ = ["API_KEY", "VERSIONS", "decode", "handle"]

API_KEY = 0
VERSIONS = (0, 9)
# A partition's append, pending until durable, or the error that refused it.
_Outcome: TypeAlias = Awaitable[AppendResult] | BaseException
# (broker, connection id) -> its append lock; an entry lives while a request holds it.
_APPEND_LOCKS: weakref.WeakValueDictionary[tuple[int, int], asyncio.Lock] = (
    weakref.WeakValueDictionary())


async def handle(broker: HandlerContext, request: Request[ProduceRequest]) -> Response:
    body = request.body
    acks = body.acks
    now = now_ms()
    pending: list[tuple[str, int, _Outcome]] = []
    refused = _refused(broker, request)
    denied = (_denied(broker, request) if broker.authorizer is not None and refused is None
              else None)
    # Offsets are taken in request order, and the requests of a connection take
    # theirs in the order sent: tasks start in creation order and take the lock
    # first (without waiting, unless an earlier one still appends in slices). A
    # request too small to append in slices, while no earlier one holds the lock,
    # appends without yielding: nothing can come between, so it needs no lock.
    if acks not in (-1, 0, 1):  # checked first: every partition gets this
        refused = InvalidRequiredAcks(f"acks must be -1, 0 or 1, not {acks}")
    parts = [(topic, part) for topic in body.topic_data for part in topic.partition_data]
    key = (id(broker), request.connection)
    lock = _APPEND_LOCKS.get(key)
    remote = _remote_txns(broker, request, refused)
    if lock is None and remote is None and never_yields(len(parts)):
        for topic_data, part in parts:
            pending.append(_append(broker, request, topic_data.name, part, now, refused,
                                   denied))
    else:
        if lock is None:
            lock = _APPEND_LOCKS[key] = asyncio.Lock()
        async with lock:
            stored = None
            if remote is not None:  # read under the lock: the connection's order holds
                try:
                    stored = _Stored(await remote.read(body.transactional_id or ""))
                except EXPECTED as exc:
                    refused = exc  # type: ignore[assignment]
            await _append_all(broker, request, parts, now, refused, denied, pending, stored)

    results: dict[str, list[PartitionAnswer]] = {}
    errors = broker.metrics.response_errors
    # Every append is made: the answers may be built in slices (slicing.py).
    slices = None if never_yields(len(pending)) else Slices()
    for name, index, outcome in pending:
        try:
            if isinstance(outcome, BaseException):
                raise outcome
            appended = await outcome
            answer = PartitionAnswer(index, 0, appended.base_offset, appended.log_append_time,
                                     appended.log_start_offset)
        except EXPECTED as exc:
            code, message = _error(exc, request.version)
            if acks != 0:  # counted here, as answered: the answer is encoded by hand
                errors[("produce", code.name.upper())] += 1
            answer = PartitionAnswer(index, code.value, -1, -1, -1, record_errors(exc), message)
        answers = results.get(name)
        if answers is None:
            results[name] = [answer]
        else:
            answers.append(answer)
        if slices is not None and slices.due():
            await slices.pause()
    if acks == 0:
        return None
    return produce_response.encode(request.version, results)


@dataclass(frozen=True, slots=True)
class _Stored:
    """The transactional id's stored state, read by a leader that does not
    coordinate it (None: no such id)."""

    meta: TxnMetadata | None


def _remote_txns(broker: HandlerContext, request: Request[ProduceRequest],
                 refused: BaseException | None) -> RemoteTransactions | None:
    """What reads the transaction's stored state, when this request carries
    transactional batches of an id another gateway of the cluster coordinates
    (``txn/remote_produce.py``); None otherwise (alone: always)."""
    remote = broker.txns.remote
    txn_id = request.body.transactional_id
    if remote is None or not txn_id or refused is not None or remote.coordinates(txn_id):
        return None
    if not any(part.records is not None and transactional_producer(part.records) is not None
               for topic in request.body.topic_data for part in topic.partition_data):
        return None
    return remote


def _refused(broker: HandlerContext, request: Request[ProduceRequest]) -> KafkaError | None:
    """The error of every partition of a request with transactional batches
    that Kafka refuses whole: no transactional id (whatever the authorizer),
    no WRITE on it, or batches of more than one producer id (Kafka 3.6+)."""
    body = request.body
    producers = {producer[0] for topic in body.topic_data for part in topic.partition_data
                 if part.records is not None
                 and (producer := transactional_producer(part.records)) is not None}
    if not producers:
        return None
    txn_id = body.transactional_id
    if txn_id is None:
        return TransactionalIdAuthorizationFailed("transactional batches need a transactional id")
    try:
        authorize_txn(broker, request, txn_id)
    except KafkaError as exc:
        return exc
    if len(producers) > 1:
        return InvalidProducerIdMapping("Transactional records contained more than one producer ID")
    return None


async def _append_all(broker: HandlerContext, request: Request[ProduceRequest],
                      parts: list[tuple[TopicProduceData, PartitionProduceData]], now: int,
                      refused: KafkaError | None, denied: dict[str, ErrorCode] | None,
                      pending: list[tuple[str, int, _Outcome]],
                      stored: _Stored | None = None) -> None:
    """Append every partition's records, in request order, in slices; each outcome
    to ``pending``."""
    slices = Slices()
    for topic_data, part in parts:
        pending.append(_append(broker, request, topic_data.name, part, now, refused, denied,
                               stored))
        if slices.due():
            await slices.pause()


def _append(broker: HandlerContext, request: Request[ProduceRequest], name: str,
            part: PartitionProduceData, now: int, refused: KafkaError | None,
            denied: dict[str, ErrorCode] | None,
            stored: _Stored | None = None) -> tuple[str, int, _Outcome]:
    """One partition's append (pending until durable), or the error refusing it."""
    try:
        if refused is not None:
            raise refused
        if denied:
            refuse_denied(denied, name)
        tablet = broker.engine.partition(name, part.index)
        records = part.records
        if records is None:
            raise CorruptMessage("null record set")
        sink = None
        if (producer := transactional_producer(records)) is not None:
            transactional_id = request.body.transactional_id
            if not transactional_id:
                raise InvalidRequest("a transactional id must not be empty")
            if stored is not None and broker.txns.remote is not None:
                # Another gateway coordinates it: checked on its stored state.
                sink = broker.txns.remote.sink(stored.meta, transactional_id, *producer, name,
                                               part.index, tablet.topic_id)
            else:
                sink = broker.txns.sink_for(transactional_id, *producer, name, part.index,
                                            request.connection)
        outcome = tablet.append(records, now, sink)
        size = len(records)
        metrics = broker.metrics
        metrics.produced_bytes += size
        metrics.topic_bytes_in[tablet.topic_id] += size
    except EXPECTED as exc:
        # Returned from here, not kept in a local: the error's traceback holds this
        # frame, and a local holding the error would make each a cycle, left to the
        # collector (a request of 50 000 refused partitions: that many).
        return name, part.index, exc
    return name, part.index, outcome


def _denied(broker: HandlerContext, request: Request[ProduceRequest]) -> dict[str, ErrorCode]:
    """Topic -> the code of a partition the principal may not write (Kafka's checks)."""
    names = [topic.name for topic in request.body.topic_data]
    return denied_names(broker, request, Operation.WRITE, ResourceType.TOPIC, names)


def _error(exc: BaseException, version: int) -> tuple[ErrorCode, str]:
    """A partition's code and message (errors.OVERRIDES: a fenced producer gets
    INVALID_PRODUCER_EPOCH; CONCURRENT_TRANSACTIONS becomes NOT_ENOUGH_REPLICAS,
    as Kafka 3.6+ translates a transaction verification's, with its message)."""
    answer = answer_class(exc, API_KEY, version)
    if answer is NotEnoughReplicas:
        return answer.code, (
            "Unable to verify the partition has been added to the transaction. Underlying "
            f"error: CONCURRENT_TRANSACTIONS ({error_message(exc)})")
    return answer.code, error_message(exc)
