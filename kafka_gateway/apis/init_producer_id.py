"""InitProducerId (key 22), v0-4: a producer id and epoch for a producer session.

- Without a transactional id (an idempotent producer): a fresh producer id.
- With one: its open transaction is aborted, the epoch bumped (fencing older
  sessions of that id), the state persisted; the timeout must be within
  ``transaction.max.timeout.ms`` (else INVALID_TRANSACTION_TIMEOUT).
- v3+ (KIP-360) name the current producer id and epoch: a producer bumps its
  own epoch to recover from an abortable error; a stale one is fenced.
- PRODUCER_FENCED from v4 (KIP-588), INVALID_PRODUCER_EPOCH before.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from ..codec import NO_THROTTLE, Request, build, response_schema
from ..errors import txn_error_code

API_KEY = 22
VERSIONS = (0, 4)


async def handle(broker: Any, request: Request) -> Any:
    body = request.body
    schema = response_schema(API_KEY, request.version)
    producer_id, epoch, code = -1, -1, ErrorCode.none
    if body.transactional_id == "":
        code = ErrorCode.invalid_request
    else:
        try:
            producer_id, epoch = await broker.txns.init_producer_id(
                body.transactional_id, int(body.transaction_timeout.total_seconds() * 1000),
                getattr(body, "producer_id", -1), getattr(body, "producer_epoch", -1))
        except Exception as exc:
            code = txn_error_code(exc, request.version, fenced_since=4)
    return build(schema.InitProducerIdResponse, throttle_time=NO_THROTTLE, error_code=code,
                 producer_id=producer_id, producer_epoch=epoch)
