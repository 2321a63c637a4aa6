"""AddPartitionsToTxn (key 24), v0-3: register partitions in a transaction.

The first AddPartitionsToTxn (or AddOffsetsToTxn) of a transaction begins it.
Partitions that do not exist get UNKNOWN_TOPIC_OR_PARTITION and the others
OPERATION_NOT_ATTEMPTED, as in Kafka; a fenced producer gets PRODUCER_FENCED
from v2 (KIP-588), INVALID_PRODUCER_EPOCH before.

Needs WRITE on the transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED for
every partition) and on each topic (TOPIC_AUTHORIZATION_FAILED, the others
OPERATION_NOT_ATTEMPTED).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

from kio.schema.errors import ErrorCode

from ..codec import NO_THROTTLE, Request, build, build_response, response_schema
from ..context import HandlerContext
from ..contract import Response
from ..errors import EXPECTED, code_of, error_code
from ..routing import authorize_txn_coordinated
from ..security.acls import Operation, ResourceType
from ..security.authorizer import denied_names
from ..slicing import sliced

if TYPE_CHECKING:
    from kio.schema.add_partitions_to_txn.v0 import request as v0
    from kio.schema.add_partitions_to_txn.v1 import request as v1
    from kio.schema.add_partitions_to_txn.v2 import request as v2
    from kio.schema.add_partitions_to_txn.v3 import request as v3

    # The request body at each version served: kio generates one class per version.
    AddPartitionsToTxnRequest: TypeAlias = (
        v0.AddPartitionsToTxnRequest | v1.AddPartitionsToTxnRequest | v2.AddPartitionsToTxnRequest
        | v3.AddPartitionsToTxnRequest
    )

API_KEY = 24
VERSIONS = (0, 3)


async def handle(broker: HandlerContext, request: Request[AddPartitionsToTxnRequest]) -> Response:
    body = request.body
    schema = response_schema(API_KEY, request.version)
    wanted = [tp async for tp in sliced((topic.name, index) for topic in body.v3_and_below_topics
                                        for index in topic.partitions)]
    unknown = {tp async for tp in sliced(wanted) if not broker.engine.has_partition(*tp)}
    codes: dict[tuple[str, int], ErrorCode]
    txn_denied = code_of(authorize_txn_coordinated, broker, request,
                         body.v3_and_below_transactional_id)
    denied = {} if txn_denied else denied_names(broker, request, Operation.WRITE,
                                                ResourceType.TOPIC, (t for t, _i in wanted))
    if txn_denied:
        codes = dict.fromkeys(wanted, txn_denied)
    elif denied:
        codes = {tp: denied.get(tp[0]) or (ErrorCode.unknown_topic_or_partition
                                           if tp in unknown else ErrorCode.operation_not_attempted)
                 for tp in wanted}
    elif unknown:
        codes = {tp: ErrorCode.unknown_topic_or_partition if tp in unknown
                 else ErrorCode.operation_not_attempted for tp in wanted}
    else:
        try:
            await broker.txns.add_partitions(
                body.v3_and_below_transactional_id, body.v3_and_below_producer_id,
                body.v3_and_below_producer_epoch, wanted, request.connection)
            code = ErrorCode.none
        except EXPECTED as exc:
            code = error_code(exc, API_KEY, request.version)
        codes = dict.fromkeys(wanted, code)
    by_topic: dict[str, list[Any]] = {}
    async for (topic, index), code in sliced(codes.items()):
        by_topic.setdefault(topic, []).append(build(
            schema.AddPartitionsToTxnPartitionResult, partition_index=index,
            partition_error_code=code))
    return build_response(schema.AddPartitionsToTxnResponse, throttle_time=NO_THROTTLE,
                          results_by_topic_v3_and_below=tuple(
                     build(schema.AddPartitionsToTxnTopicResult, name=name,
                           results_by_partition=tuple(parts))
                     for name, parts in by_topic.items()))
