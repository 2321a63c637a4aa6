"""AddOffsetsToTxn (key 25), v0-3: a group's offsets will be part of a transaction.

Begins the transaction if needed; TxnOffsetCommit then stages the offsets.
PRODUCER_FENCED from v2 (KIP-588), INVALID_PRODUCER_EPOCH before.

Needs WRITE on the transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
and READ on the group (GROUP_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

from kio.schema.errors import ErrorCode

from ..codec import NO_THROTTLE, Request, build_response, response_schema
from ..context import HandlerContext
from ..contract import Response
from ..errors import EXPECTED, InvalidGroupId, error_code
from ..groups.coordinator import is_valid_group_id
from ..routing import authorize_txn_coordinated

if TYPE_CHECKING:
    from kio.schema.add_offsets_to_txn.v0 import request as v0
    from kio.schema.add_offsets_to_txn.v1 import request as v1
    from kio.schema.add_offsets_to_txn.v2 import request as v2
    from kio.schema.add_offsets_to_txn.v3 import request as v3

    # The request body at each version served: kio generates one class per version.
    AddOffsetsToTxnRequest: TypeAlias = (
        v0.AddOffsetsToTxnRequest | v1.AddOffsetsToTxnRequest | v2.AddOffsetsToTxnRequest
        | v3.AddOffsetsToTxnRequest
    )

API_KEY = 25
VERSIONS = (0, 3)


async def handle(broker: HandlerContext, request: Request[AddOffsetsToTxnRequest]) -> Response:
    body = request.body
    schema = response_schema(API_KEY, request.version)
    code = ErrorCode.none
    try:
        authorize_txn_coordinated(broker, request, body.transactional_id, body.group_id)
        if not is_valid_group_id(body.group_id, allow_empty=False):
            raise InvalidGroupId()
        await broker.txns.add_offsets(body.transactional_id, body.producer_id,
                                      body.producer_epoch, body.group_id, request.connection)
    except EXPECTED as exc:
        code = error_code(exc, API_KEY, request.version)
    return build_response(schema.AddOffsetsToTxnResponse, throttle_time=NO_THROTTLE,
                          error_code=code)
