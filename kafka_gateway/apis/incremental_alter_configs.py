"""IncrementalAlterConfigs (key 44), v0-1: SET, DELETE, APPEND, SUBTRACT.

Only the named configs change. APPEND and SUBTRACT apply to list configs
(cleanup.policy, the throttled-replica lists) and are INVALID_CONFIG on
others, as in Kafka.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

from tablets.topic_config import TOPIC_CONFIGS, ConfigType, InvalidConfig

from ..codec import Request
from ..context import HandlerContext
from ..contract import Response
from ..errors import InvalidRequest
from .alter_configs import alter, refuse_null_values

if TYPE_CHECKING:
    from kio.schema.incremental_alter_configs.v0 import request as v0
    from kio.schema.incremental_alter_configs.v1 import request as v1

    # The request body at each version served: kio generates one class per version.
    IncrementalAlterConfigsRequest: TypeAlias = (
        v0.IncrementalAlterConfigsRequest | v1.IncrementalAlterConfigsRequest
    )

    AlterConfigsResource: TypeAlias = v0.AlterConfigsResource | v1.AlterConfigsResource

API_KEY = 44
VERSIONS = (0, 1)

SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3


async def handle(broker: HandlerContext,
                 request: Request[IncrementalAlterConfigsRequest]) -> Response:
    resources: tuple[AlterConfigsResource, ...] = request.body.resources
    return await alter(broker, request, API_KEY, resources, request.body.validate_only, _apply)


def _apply(current: dict[str, str], resource: AlterConfigsResource) -> dict[str, str]:
    configs = resource.configs
    names = [c.name for c in configs]
    if len(names) != len(set(names)):
        raise InvalidRequest("a config appears more than once")
    refuse_null_values(c for c in configs if c.config_operation == SET)
    for config in configs:
        op, name, value = config.config_operation, config.name, config.value
        definition = TOPIC_CONFIGS.get(name)
        if op == DELETE:  # Kafka deletes even a name it does not know: nothing to do
            current.pop(name, None)
            continue
        if definition is None:
            raise InvalidConfig(f"Unknown topic config name: {name}")
        if op == SET:
            assert value is not None  # refused above
            current[name] = value
        elif op in (APPEND, SUBTRACT):
            if definition.type is not ConfigType.LIST:
                raise InvalidConfig(f"Config value append/subtract is not allowed for config "
                                    f"key {name} of type {definition.type.name}")
            items = [v for v in current.get(name, definition.default or "").split(",") if v]
            for item in (value or "").split(","):
                if op == APPEND and item and item not in items:
                    items.append(item)
                elif op == SUBTRACT and item in items:
                    items.remove(item)
            current[name] = ",".join(items)
        else:
            raise InvalidRequest(f"unknown config operation {op}")
    return current
