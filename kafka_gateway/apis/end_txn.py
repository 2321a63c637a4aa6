"""EndTxn (key 26), v0-3: commit or abort a transaction, in one store write.

- A commit writes, atomically: the transaction's batches into each of its
  partitions' logs (references to the blobs stored at Produce time), a COMMIT
  marker after them, its consumer offsets, and its new state.
- An abort deletes the blobs: aborted data never enters a log.
- A retry of a completed EndTxn succeeds again; a delayed EndTxn of an earlier
  transaction cannot end a later one (INVALID_TXN_STATE; see txn/coordinator.py).
- A commit that fails the offset-range check is aborted and answered
  UNKNOWN_PRODUCER_ID, which the Java client and librdkafka both treat as
  abortable with an epoch bump (KIP-360): the application aborts and goes on.
- PRODUCER_FENCED from v2 (KIP-588), INVALID_PRODUCER_EPOCH before.

Needs WRITE on the transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

from kio.schema.errors import ErrorCode

from ..codec import NO_THROTTLE, Request, build_response, response_schema
from ..context import HandlerContext
from ..contract import Response
from ..errors import EXPECTED, error_code
from ..routing import authorize_txn_coordinated

if TYPE_CHECKING:
    from kio.schema.end_txn.v0 import request as v0
    from kio.schema.end_txn.v1 import request as v1
    from kio.schema.end_txn.v2 import request as v2
    from kio.schema.end_txn.v3 import request as v3

    # The request body at each version served: kio generates one class per version.
    EndTxnRequest: TypeAlias = (
        v0.EndTxnRequest | v1.EndTxnRequest | v2.EndTxnRequest | v3.EndTxnRequest
    )

API_KEY = 26
VERSIONS = (0, 3)


async def handle(broker: HandlerContext, request: Request[EndTxnRequest]) -> Response:
    body = request.body
    schema = response_schema(API_KEY, request.version)
    code = ErrorCode.none
    try:
        authorize_txn_coordinated(broker, request, body.transactional_id)
        await broker.txns.end_txn(body.transactional_id, body.producer_id, body.producer_epoch,
                                  body.committed, request.connection)
    except EXPECTED as exc:
        code = error_code(exc, API_KEY, request.version)
    return build_response(schema.EndTxnResponse, throttle_time=NO_THROTTLE, error_code=code)
