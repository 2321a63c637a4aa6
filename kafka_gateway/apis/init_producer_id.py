"""InitProducerId (key 22), v0-4: a producer id and epoch for a producer session.

- Without a transactional id (an idempotent producer): a fresh producer id.
- With one: its open transaction is aborted, the epoch bumped (fencing older
  sessions of that id), the state persisted; the timeout must be within
  ``transaction.max.timeout.ms`` (else INVALID_TRANSACTION_TIMEOUT).
- v3+ (KIP-360) name the current producer id and epoch: a producer bumps its
  own epoch to recover from an abortable error; a stale one is fenced.
- PRODUCER_FENCED from v4 (KIP-588), INVALID_PRODUCER_EPOCH before.
- An empty transactional id is INVALID_REQUEST, as in Kafka; so is one longer
  than ``gateway.transactional.id.max.bytes`` (UTF-8): each id is kept, in
  memory and on disk, for ``transactional.id.expiration.ms``. Kafka's only
  bound is the protocol's (32767 bytes, refused by the parser; body_bounds.py does
  the same); the Java producer takes INVALID_REQUEST as fatal.

Needs WRITE on the transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED);
an idempotent producer needs IDEMPOTENT_WRITE on the cluster or WRITE on any
topic (CLUSTER_AUTHORIZATION_FAILED), as Kafka 3.x (KIP-679).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

from kio.schema.errors import ErrorCode

from ..codec import NO_THROTTLE, Request, build_response, response_schema
from ..context import HandlerContext
from ..contract import Response
from ..errors import EXPECTED, error_code
from ..routing import authorize_txn_coordinated
from ..security.acls import Operation, ResourceType
from ..security.authorizer import (
    authorize_any,
    authorize_cluster,
    cluster_allowed,
)

if TYPE_CHECKING:
    from kio.schema.init_producer_id.v0 import request as v0
    from kio.schema.init_producer_id.v1 import request as v1
    from kio.schema.init_producer_id.v2 import request as v2
    from kio.schema.init_producer_id.v3 import request as v3
    from kio.schema.init_producer_id.v4 import request as v4

    # The request body at each version served: kio generates one class per version.
    InitProducerIdRequest: TypeAlias = (
        v0.InitProducerIdRequest | v1.InitProducerIdRequest | v2.InitProducerIdRequest
        | v3.InitProducerIdRequest | v4.InitProducerIdRequest
    )

API_KEY = 22
VERSIONS = (0, 4)


def _authorize(broker: HandlerContext, request: Request[object],
               transactional_id: str | None) -> None:
    if transactional_id is not None:
        authorize_txn_coordinated(broker, request, transactional_id)
    elif cluster_allowed(broker, request, Operation.IDEMPOTENT_WRITE):
        pass
    elif authorize_any(broker, request, Operation.WRITE, ResourceType.TOPIC):
        pass  # KIP-679: WRITE on any topic allows idempotence
    else:
        authorize_cluster(broker, request, Operation.IDEMPOTENT_WRITE)


async def handle(broker: HandlerContext, request: Request[InitProducerIdRequest]) -> Response:
    body = request.body
    schema = response_schema(API_KEY, request.version)
    producer_id, epoch, code = -1, -1, ErrorCode.none
    transactional_id = body.transactional_id
    if transactional_id == "" or (
            transactional_id is not None
            and len(transactional_id.encode()) > broker.config.transactional_id_max_bytes):
        code = ErrorCode.invalid_request
    else:
        try:
            _authorize(broker, request, body.transactional_id)
            producer_id, epoch = await broker.txns.init_producer_id(
                body.transactional_id, int(body.transaction_timeout.total_seconds() * 1000),
                getattr(body, "producer_id", -1), getattr(body, "producer_epoch", -1))
        except EXPECTED as exc:
            code = error_code(exc, API_KEY, request.version)
    return build_response(schema.InitProducerIdResponse, throttle_time=NO_THROTTLE, error_code=code,
                          producer_id=producer_id, producer_epoch=epoch)
