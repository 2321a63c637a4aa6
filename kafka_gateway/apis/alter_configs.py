"""AlterConfigs (key 33), v0-2: replace a topic's whole set of overrides.

Configs not named go back to their defaults, as in Kafka. Broker settings
are static here (flags or the config file): altering them is refused.

Needs ALTER_CONFIGS on the topic, or on the cluster for a broker
(TOPIC_/CLUSTER_AUTHORIZATION_FAILED); IncrementalAlterConfigs shares this.
"""

from __future__ import annotations

from collections.abc import Callable

from kio.schema.errors import ErrorCode

from tablets import check_topic_name
from tablets.topic_config import validate_all

from ..codec import NO_THROTTLE, Request, build, response_schema
from ..context import HandlerContext
from ..contract import Response
from ..errors import EXPECTED, InvalidRequest, error_code, error_message
from ..security.acls import Operation
from ..security.authorizer import authorize_config
from ..slicing import sliced
from ..topic_configs import RESOURCE_TOPIC

API_KEY = 33
VERSIONS = (0, 2)


async def handle(broker: HandlerContext, request: Request) -> Response:
    def replace(_current: dict[str, str], configs) -> dict[str, str]:
        refuse_null_values(configs)
        return {c.name: c.value for c in configs}

    return await alter(broker, request, API_KEY, replace)


def refuse_null_values(configs) -> None:
    """A null value is a malformed request here (Kafka: INVALID_REQUEST)."""
    for config in configs:
        if config.value is None:
            raise InvalidRequest(f"Null value not supported for : {config.name}")


async def alter(broker, request, api_key: int,
                change: Callable[[dict[str, str], tuple], dict[str, str]]):
    """Apply ``change`` (current overrides, request configs) -> new overrides."""
    schema = response_schema(api_key, request.version)
    body = request.body
    responses = []
    async for resource in sliced(body.resources):
        try:
            authorize_config(broker, request, Operation.ALTER_CONFIGS,
                             resource.resource_type, resource.resource_name)
            if resource.resource_type != RESOURCE_TOPIC:
                raise InvalidRequest("only topic configs can be altered; broker settings are set "
                                 "with flags or the config file")
            check_topic_name(resource.resource_name)  # INVALID_TOPIC_EXCEPTION, as Kafka
            topic = broker.engine.topic(resource.resource_name)
            overrides = validate_all(change(dict(topic.configs), resource.configs))
            if not body.validate_only:
                await broker.engine.set_topic_configs(topic.name, overrides)
            code, message = ErrorCode.none, None
        except EXPECTED as exc:
            code, message = error_code(exc), error_message(exc)
        responses.append(build(schema.AlterConfigsResourceResponse, error_code=code,
                               error_message=message, resource_type=resource.resource_type,
                               resource_name=resource.resource_name))
    return build(schema.AlterConfigsResponse if api_key == API_KEY
                 else schema.IncrementalAlterConfigsResponse,
                 throttle_time=NO_THROTTLE, responses=tuple(responses))
