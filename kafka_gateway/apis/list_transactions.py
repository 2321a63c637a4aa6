"""ListTransactions (key 66), v0: transactional ids, filtered by state names and
producer ids (``kafka-transactions list``). Unknown state names are echoed
back in ``unknown_state_filters``, as Kafka does.

Lists only the transactional ids the principal may DESCRIBE.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

from kio.schema.errors import ErrorCode

from txn.state import TxnState

from ..codec import NO_THROTTLE, Request, build, build_response, response_schema
from ..context import HandlerContext
from ..contract import Response
from ..security.acls import Operation, ResourceType
from ..security.authorizer import allowed

if TYPE_CHECKING:
    from kio.schema.list_transactions.v0 import request as v0

    # The request body at each version served: kio generates one class per version.
    ListTransactionsRequest: TypeAlias = v0.ListTransactionsRequest

API_KEY = 66
VERSIONS = (0, 0)

_BY_NAME = {state.value: state for state in TxnState}


async def handle(broker: HandlerContext, request: Request[ListTransactionsRequest]) -> Response:
    body = request.body
    schema = response_schema(API_KEY, request.version)
    unknown = tuple(name for name in body.state_filters if name not in _BY_NAME)
    states = {_BY_NAME[name] for name in body.state_filters if name in _BY_NAME}
    listed = [] if unknown and not states else broker.txns.list(
        states or None, set(body.producer_id_filters) or None)
    return build_response(
        schema.ListTransactionsResponse, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
        unknown_state_filters=unknown,
        transaction_states=tuple(build(schema.TransactionState,
                                       transactional_id=meta.transactional_id,
                                       producer_id=meta.producer_id,
                                       transaction_state=meta.state.value)
                                 for meta in sorted(listed, key=lambda m: m.transactional_id)
                                 if allowed(broker, request, Operation.DESCRIBE,
                                            ResourceType.TRANSACTIONAL_ID,
                                            meta.transactional_id)))
