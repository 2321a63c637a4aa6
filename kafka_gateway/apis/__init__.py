"""One module per Kafka API, named after it (as in franz-go's kfake).

Each module declares ``API_KEY``, ``VERSIONS`` (the range this gateway
supports, within Kafka 3.4's) and ``async def handle(broker, request)``
returning the response body (or None for a Produce with acks=0).
ApiVersions advertises exactly what this registry holds (handed to it below).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

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

Handler = Callable[[Any, Any], Awaitable[Any]]


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


def _api(module: ModuleType) -> Api:
    low, high = module.VERSIONS
    name = module.__name__.rsplit(".", 1)[-1]
    return Api(module.API_KEY, name, low, high, module.handle, getattr(module, "decode", None),
               getattr(module, "ONE_AT_A_TIME", False))


APIS: dict[int, Api] = {
    api.key: api
    for api in map(
        _api,
        (
            produce,
            fetch,
            list_offsets,
            metadata,
            offset_for_leader_epoch,
            api_versions,
            create_topics,
            delete_topics,
            delete_records,
            describe_configs,
            alter_configs,
            create_partitions,
            incremental_alter_configs,
            describe_cluster,
            find_coordinator,
            join_group,
            sync_group,
            heartbeat,
            leave_group,
            offset_commit,
            offset_fetch,
            describe_groups,
            list_groups,
            delete_groups,
            offset_delete,
            init_producer_id,
            add_partitions_to_txn,
            add_offsets_to_txn,
            end_txn,
            txn_offset_commit,
            describe_producers,
            describe_transactions,
            list_transactions,
            sasl_handshake,
            sasl_authenticate,
            describe_user_scram_credentials,
            alter_user_scram_credentials,
            describe_acls,
            create_acls,
            delete_acls,
        ),
    )
}

api_versions.advertise(APIS.values())
