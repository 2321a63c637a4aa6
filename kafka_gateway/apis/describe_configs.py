"""DescribeConfigs (key 32), v1-4: every topic config with its value and source.

Topics report all Kafka 3.4 topic configs (override, node default or Kafka
default; synonyms on request), and the gateway's own where the topic sets
them or the request names them; the broker resource reports this node's
settings, read-only. Unknown topics get UNKNOWN_TOPIC_OR_PARTITION.

Needs DESCRIBE_CONFIGS on the topic, or on the cluster for a broker
(TOPIC_/CLUSTER_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, TypeAlias

from kio.schema.errors import ErrorCode

from tablets import check_topic_name

from .. import routing
from ..codec import NO_THROTTLE, Request, build, build_response, response_schema
from ..context import HandlerContext
from ..contract import Response
from ..errors import EXPECTED, InvalidRequest, KafkaError, error_code, error_message
from ..security.acls import Operation
from ..security.authorizer import authorize_config
from ..settings import GatewayConfig
from ..slicing import sliced
from ..topic_configs import (
    RESOURCE_BROKER,
    RESOURCE_BROKER_LOGGER,
    RESOURCE_TOPIC,
    SOURCE_DEFAULT,
    ConfigEntry,
    broker_entries,
    topic_entries,
)

if TYPE_CHECKING:
    from kio.schema.describe_configs.v1 import request as v1
    from kio.schema.describe_configs.v2 import request as v2
    from kio.schema.describe_configs.v3 import request as v3
    from kio.schema.describe_configs.v4 import request as v4

    # The request body at each version served: kio generates one class per version.
    DescribeConfigsRequest: TypeAlias = (
        v1.DescribeConfigsRequest | v2.DescribeConfigsRequest | v3.DescribeConfigsRequest
        | v4.DescribeConfigsRequest
    )

    DescribeConfigsResource: TypeAlias = (
        v1.DescribeConfigsResource | v2.DescribeConfigsResource | v3.DescribeConfigsResource
        | v4.DescribeConfigsResource
    )

API_KEY = 32
VERSIONS = (1, 4)

_DEFAULTS = GatewayConfig().properties()  # a node's settings when none is given


async def handle(broker: HandlerContext, request: Request[DescribeConfigsRequest]) -> Response:
    schema = response_schema(API_KEY, request.version)
    body = request.body
    results = []
    resources: tuple[DescribeConfigsResource, ...] = body.resources
    if any(r.resource_type == RESOURCE_TOPIC for r in resources):
        await routing.topics_current(broker)
    async for resource in sliced(resources):
        try:
            authorize_config(broker, request, Operation.DESCRIBE_CONFIGS,
                             resource.resource_type, resource.resource_name)
            keys = resource.configuration_keys
            entries = _entries(broker, resource.resource_type, resource.resource_name,
                               keys or ())
            if keys:
                wanted = set(keys)
                entries = [e for e in entries if e.name in wanted]
            code, message = ErrorCode.none, None
        except EXPECTED as exc:
            entries, code, message = [], error_code(exc), error_message(exc)
        results.append(
            build(
                schema.DescribeConfigsResult,
                error_code=code,
                error_message=message,
                resource_type=resource.resource_type,
                resource_name=resource.resource_name,
                configs=tuple(_entry(schema, e, body.include_synonyms) for e in entries),
            )
        )
    return build_response(schema.DescribeConfigsResponse, throttle_time=NO_THROTTLE,
                          results=tuple(results))


def _entries(broker: HandlerContext, resource_type: int, name: str,
             keys: tuple[str, ...]) -> list[ConfigEntry]:
    if resource_type == RESOURCE_TOPIC:
        check_topic_name(name)  # INVALID_TOPIC_EXCEPTION before "unknown", as Kafka
        topic = broker.engine.topic(name)
        return topic_entries(topic.configs, broker.config.topic_defaults(), named=keys)
    if resource_type == RESOURCE_BROKER:
        if name not in ("", str(broker.node_id)):
            raise _invalid(f"unknown broker {name}: this is broker {broker.node_id}")
        return broker_entries(broker.config.properties(), _DEFAULTS)
    if resource_type == RESOURCE_BROKER_LOGGER:
        return []
    raise _invalid(f"unsupported resource type {resource_type}")


def _invalid(message: str) -> KafkaError:
    return InvalidRequest(message)


def _entry(schema: ModuleType, entry: ConfigEntry, include_synonyms: bool) -> object:
    return build(
        schema.DescribeConfigsResourceResult,
        name=entry.name,
        value=entry.value,
        read_only=entry.read_only,
        config_source=entry.source,
        is_default=entry.source == SOURCE_DEFAULT,
        is_sensitive=entry.sensitive,
        synonyms=tuple(
            build(schema.DescribeConfigsSynonym, name=n, value=v, source=s)
            for n, v, s in (entry.synonyms if include_synonyms else ())
        ),
        config_type=entry.config_type,
        documentation=None,
    )
