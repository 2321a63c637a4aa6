"""One module per Kafka API, named after it (as in franz-go's kfake).

Each module declares ``API_KEY``, ``VERSIONS`` (the range this gateway
supports, within Kafka 3.4's) and ``async def handle(broker: HandlerContext,
request: Request) -> Response``, a ``contract.Handler``: the response body
(or None for a Produce with acks=0).
ApiVersions advertises exactly what this registry holds (handed to it below).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..contract import Handler
from . import (
    add_offsets_to_txn,
    add_partitions_to_txn,
    alter_configs,
    alter_user_scram_credentials,
    api_versions,
    create_acls,
    create_partitions,
    create_topics,
    delete_acls,
    delete_groups,
    delete_records,
    delete_topics,
    describe_acls,
    describe_cluster,
    describe_configs,
    describe_groups,
    describe_producers,
    describe_transactions,
    describe_user_scram_credentials,
    end_txn,
    fetch,
    find_coordinator,
    heartbeat,
    incremental_alter_configs,
    init_producer_id,
    join_group,
    leave_group,
    list_groups,
    list_offsets,
    list_transactions,
    metadata,
    offset_commit,
    offset_delete,
    offset_fetch,
    offset_for_leader_epoch,
    produce,
    sasl_authenticate,
    sasl_handshake,
    sync_group,
    txn_offset_commit,
)


@dataclass(frozen=True, slots=True)
class Api:
    key: int
    name: str
    min_version: int
    max_version: int
    handle: Handler
    # (frame, body position, version, max array items) -> request body, for an
    # API that reads its own requests (a measured hot path); the others go
    # through kio.
    decode: Callable[[Any, int, int, int], Any] | None = None
    # Served one at a time per connection, and only while the client reads its
    # answers (their size is the client's to choose: see connection.py).
    one_at_a_time: bool = False


class ApiModule(Protocol):
    """What each module of apis/ declares (mypy checks each module against it)."""

    API_KEY: int
    VERSIONS: tuple[int, int]
    __name__: str

    @property
    def handle(self) -> Handler: ...


def _api(module: ApiModule) -> Api:
    low, high = module.VERSIONS
    name = module.__name__.rsplit(".", 1)[-1]
    return Api(module.API_KEY, name, low, high, module.handle, getattr(module, "decode", None),
               getattr(module, "ONE_AT_A_TIME", False))


APIS: dict[int, Api] = {
    api.key: api
    for api in (
        _api(produce),
        _api(fetch),
        _api(list_offsets),
        _api(metadata),
        _api(offset_for_leader_epoch),
        _api(api_versions),
        _api(create_topics),
        _api(delete_topics),
        _api(delete_records),
        _api(describe_configs),
        _api(alter_configs),
        _api(create_partitions),
        _api(incremental_alter_configs),
        _api(describe_cluster),
        _api(find_coordinator),
        _api(join_group),
        _api(sync_group),
        _api(heartbeat),
        _api(leave_group),
        _api(offset_commit),
        _api(offset_fetch),
        _api(describe_groups),
        _api(list_groups),
        _api(delete_groups),
        _api(offset_delete),
        _api(init_producer_id),
        _api(add_partitions_to_txn),
        _api(add_offsets_to_txn),
        _api(end_txn),
        _api(txn_offset_commit),
        _api(describe_producers),
        _api(describe_transactions),
        _api(list_transactions),
        _api(sasl_handshake),
        _api(sasl_authenticate),
        _api(describe_user_scram_credentials),
        _api(alter_user_scram_credentials),
        _api(describe_acls),
        _api(create_acls),
        _api(delete_acls),
    )
}

api_versions.advertise(APIS.values())
