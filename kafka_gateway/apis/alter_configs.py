"""AlterConfigs (key 33), v0-2: replace a topic's whole set of overrides.

Configs not named go back to their defaults, as in Kafka. Broker settings
are static here (flags or the config file): altering them is refused.

Needs ALTER_CONFIGS on the topic, or on the cluster for a broker
(TOPIC_/CLUSTER_AUTHORIZATION_FAILED); IncrementalAlterConfigs shares this.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Protocol, TypeAlias, TypeVar

from kio.schema.errors import ErrorCode

from tablets import check_topic_name
from tablets.topic_config import validate_all

from .. import routing
from ..codec import NO_THROTTLE, Request, build, build_response, response_schema
from ..context import HandlerContext
from ..contract import Response
from ..errors import EXPECTED, InvalidRequest, error_code, error_message
from ..security.acls import Operation
from ..security.authorizer import authorize_config
from ..slicing import sliced
from ..topic_configs import RESOURCE_TOPIC

if TYPE_CHECKING:
    from kio.schema.alter_configs.v0 import request as v0
    from kio.schema.alter_configs.v1 import request as v1
    from kio.schema.alter_configs.v2 import request as v2

    # The request body at each version served: kio generates one class per version.
    AlterConfigsRequest: TypeAlias = (
        v0.AlterConfigsRequest | v1.AlterConfigsRequest | v2.AlterConfigsRequest
    )

    AlterConfigsResource: TypeAlias = (
        v0.AlterConfigsResource | v1.AlterConfigsResource | v2.AlterConfigsResource
    )

API_KEY = 33
VERSIONS = (0, 2)


async def handle(broker: HandlerContext, request: Request[AlterConfigsRequest]) -> Response:
    def replace(_current: dict[str, str],
                resource: AlterConfigsResource) -> dict[str, str | None]:
        refuse_null_values(resource.configs)
        return {c.name: c.value for c in resource.configs}

    resources: tuple[AlterConfigsResource, ...] = request.body.resources
    return await alter(broker, request, API_KEY, resources, request.body.validate_only, replace)


class NamedValue(Protocol):
    """A config of either API's request."""

    @property
    def name(self) -> str: ...

    @property
    def value(self) -> str | None: ...


class ConfigResource(Protocol):
    """A resource of either API's request."""

    @property
    def resource_type(self) -> int: ...

    @property
    def resource_name(self) -> str: ...


Resource = TypeVar("Resource", bound=ConfigResource)


def refuse_null_values(configs: Iterable[NamedValue]) -> None:
    """A null value is a malformed request here (Kafka: INVALID_REQUEST)."""
    for config in configs:
        if config.value is None:
            raise InvalidRequest(f"Null value not supported for : {config.name}")


async def alter(broker: HandlerContext, request: Request[object], api_key: int,
                resources: Iterable[Resource], validate_only: bool,
                change: Callable[[dict[str, str], Resource], Mapping[str, str | None]]
                ) -> Response:
    """Apply ``change`` (current overrides, a resource of the request) -> new overrides."""
    schema = response_schema(api_key, request.version)
    responses = []
    resources = list(resources)
    if any(r.resource_type == RESOURCE_TOPIC for r in resources):
        await routing.topics_current(broker)
    async for resource in sliced(resources):
        try:
            authorize_config(broker, request, Operation.ALTER_CONFIGS,
                             resource.resource_type, resource.resource_name)
            if resource.resource_type != RESOURCE_TOPIC:
                raise InvalidRequest("only topic configs can be altered; broker settings are set "
                                 "with flags or the config file")
            check_topic_name(resource.resource_name)  # INVALID_TOPIC_EXCEPTION, as Kafka
            topic = broker.engine.topic(resource.resource_name)
            overrides = validate_all(change(dict(topic.configs), resource))
            if not validate_only:
                await broker.engine.set_topic_configs(topic.name, overrides)
            code, message = ErrorCode.none, None
        except EXPECTED as exc:
            code, message = error_code(exc), error_message(exc)
        responses.append(build(schema.AlterConfigsResourceResponse, error_code=code,
                               error_message=message, resource_type=resource.resource_type,
                               resource_name=resource.resource_name))
    return build_response(schema.AlterConfigsResponse if api_key == API_KEY
                          else schema.IncrementalAlterConfigsResponse,
                          throttle_time=NO_THROTTLE, responses=tuple(responses))
