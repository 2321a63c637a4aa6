"""DescribeTransactions (key 65), v0: the state of transactional ids
(``kafka-transactions describe``): Kafka's state name, producer id and epoch,
timeout, when the (last) transaction began, and the open one's partitions.

Needs DESCRIBE on each transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED);
only partitions of topics the principal may DESCRIBE are listed. In a
cluster, an id another gateway coordinates gets NOT_COORDINATOR, as from a
Kafka broker that is not its coordinator: the admin client then asks
FindCoordinator again, rather than reading TRANSACTIONAL_ID_NOT_FOUND from a
gateway that does not hold the id.
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, TypeAlias

from kio.schema.errors import ErrorCode
from kio.static.primitive import i32Timedelta

from txn.state import TxnState

from ..codec import NO_THROTTLE, Request, build, build_response, response_schema
from ..context import HandlerContext
from ..contract import Response
from ..errors import EXPECTED, error_code
from ..routing import check_coordinator
from ..security.acls import Operation, ResourceType
from ..security.authorizer import allowed, authorize

if TYPE_CHECKING:
    from kio.schema.describe_transactions.v0 import request as v0

    # The request body at each version served: kio generates one class per version.
    DescribeTransactionsRequest: TypeAlias = v0.DescribeTransactionsRequest

API_KEY = 65
VERSIONS = (0, 0)


async def handle(broker: HandlerContext, request: Request[DescribeTransactionsRequest]) -> Response:
    schema = response_schema(API_KEY, request.version)
    states = []
    for transactional_id in request.body.transactional_ids:
        try:
            authorize(broker, request, Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID,
                      transactional_id)
            check_coordinator(broker, transactional_id)
            meta = broker.txns.describe(transactional_id)
        except EXPECTED as exc:
            states.append(build(
                schema.TransactionState, error_code=error_code(exc),
                transactional_id=transactional_id, transaction_state="",
                transaction_timeout=i32Timedelta.parse(datetime.timedelta(0)),
                transaction_start_time=_time(-1), producer_id=-1, producer_epoch=-1,
                topics=()))
            continue
        by_topic: dict[str, list[int]] = {}
        for topic, index in sorted(meta.partitions if meta.is_open else ()):
            if allowed(broker, request, Operation.DESCRIBE, ResourceType.TOPIC, topic):
                by_topic.setdefault(topic, []).append(index)
        states.append(build(
            schema.TransactionState, error_code=ErrorCode.none,
            transactional_id=transactional_id, transaction_state=meta.state.value,
            transaction_timeout=i32Timedelta.parse(datetime.timedelta(milliseconds=meta.timeout_ms)),
            # Kept after completion, as Kafka does, until the next InitProducerId.
            transaction_start_time=_time(-1 if meta.state is TxnState.EMPTY
                                         else meta.started_ms),
            producer_id=meta.producer_id, producer_epoch=meta.epoch,
            topics=tuple(build(schema.TopicData, topic=topic, partitions=tuple(parts))
                         for topic, parts in by_topic.items())))
    return build_response(schema.DescribeTransactionsResponse, throttle_time=NO_THROTTLE,
                          transaction_states=tuple(states))


def _time(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
