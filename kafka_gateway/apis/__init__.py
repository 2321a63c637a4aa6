"""One module per Kafka API, named after it (as in franz-go's kfake).

Each module declares ``API_KEY``, ``VERSIONS`` (the range this gateway
supports, within Kafka 3.4's) and ``async def handle(broker: HandlerContext,
request: Request[<its body type>]) -> Response``, a ``contract.Handler``: the
response body (or None for a Produce with acks=0). Its body type is the union
of kio's request classes for those versions, or what its own ``decode``
returns (``Api`` ties the two: mypy checks each entry below).
ApiVersions advertises exactly what this registry holds (handed to it below).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from ..contract import Decoder, Handler
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

Body = TypeVar("Body")
Body_contra = TypeVar("Body_contra", contravariant=True)


@dataclass(frozen=True, slots=True)
class Api(Generic[Body]):
    key: int
    name: str
    min_version: int
    max_version: int
    handle: Handler[Body]
    # The API's own reader of its requests (a measured hot path: Produce),
    # returning the body its handler takes; the others go through kio.
    decode: Decoder[Body] | None = None
    # Served one at a time per connection, and only while the client reads its
    # answers (their size is the client's to choose: see connection.py).
    one_at_a_time: bool = False


class ApiModule(Protocol[Body_contra]):
    """What each module of apis/ declares (mypy checks each module against it)."""

    API_KEY: int
    VERSIONS: tuple[int, int]
    __name__: str

    @property
    def handle(self) -> Handler[Body_contra]: ...


def _api(module: ApiModule[Body], decode: Decoder[Body] | None = None,
         one_at_a_time: bool = False) -> Api[Body]:
    low, high = module.VERSIONS
    name = module.__name__.rsplit(".", 1)[-1]
    return Api(module.API_KEY, name, low, high, module.handle, decode, one_at_a_time)


# Api[Any]: each entry's body type is its own (checked where it is built);
# dispatch hands a handler the request its entry's decoder, or kio, read.
APIS: dict[int, Api[Any]] = {
    api.key: api
    for api in (
        _api(produce, decode=produce.decode),
        _api(fetch, one_at_a_time=fetch.ONE_AT_A_TIME),
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
