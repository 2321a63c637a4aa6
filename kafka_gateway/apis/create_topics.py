"""CreateTopics (key 19), v2-7: topics with partitions and config overrides.

-1 partitions / replication factor mean the node's defaults. Replication
factor can only be 1 (one copy per partition). Manual assignments must name
this node. The engine checks name, collisions, configs, partitions and
replication factor in the order Kafka's controller does. validate_only checks
everything and creates nothing. v5+ answers with the topic's configs as
given, v7 with its id.

Needs CREATE on the cluster or on each topic (TOPIC_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

from collections import Counter
from types import ModuleType
from typing import TYPE_CHECKING, TypeAlias, cast
from uuid import UUID, uuid4

from kio.schema.errors import ErrorCode

from ..codec import NO_THROTTLE, Request, build, build_response, response_schema
from ..context import HandlerContext
from ..contract import Response
from ..errors import (
    EXPECTED,
    InvalidReplicaAssignment,
    InvalidRequest,
    error_code,
    error_message,
)
from ..security.acls import Operation, ResourceType
from ..security.authorizer import authorize, cluster_allowed
from ..slicing import sliced
from ..topic_configs import topic_entries

if TYPE_CHECKING:
    from kio.schema.create_topics.v2 import request as v2
    from kio.schema.create_topics.v3 import request as v3
    from kio.schema.create_topics.v4 import request as v4
    from kio.schema.create_topics.v5 import request as v5
    from kio.schema.create_topics.v6 import request as v6
    from kio.schema.create_topics.v7 import request as v7

    # The request body at each version served: kio generates one class per version.
    CreateTopicsRequest: TypeAlias = (
        v2.CreateTopicsRequest | v3.CreateTopicsRequest | v4.CreateTopicsRequest
        | v5.CreateTopicsRequest | v6.CreateTopicsRequest | v7.CreateTopicsRequest
    )

    CreatableTopic: TypeAlias = (
        v2.CreatableTopic | v3.CreatableTopic | v4.CreatableTopic | v5.CreatableTopic
        | v6.CreatableTopic | v7.CreatableTopic
    )

API_KEY = 19
VERSIONS = (2, 7)


async def handle(broker: HandlerContext, request: Request[CreateTopicsRequest]) -> Response:
    schema = response_schema(API_KEY, request.version)
    body = request.body
    counts = Counter(t.name for t in body.topics)
    # Without CREATE on the cluster, each topic needs its own (asked in the loop).
    per_topic = not cluster_allowed(broker, request, Operation.CREATE)
    results = []
    answered = set()
    described_by: dict[tuple[tuple[str, str], ...], tuple[object, ...]] = {}
    topics: tuple[CreatableTopic, ...] = body.topics
    async for topic in sliced(topics):
        if topic.name in answered:
            continue  # one answer per name, as Kafka
        answered.add(topic.name)
        try:
            if counts[topic.name] > 1:
                raise InvalidRequest(f"topic {topic.name} appears more than once in the request")
            if per_topic:
                authorize(broker, request, Operation.CREATE, ResourceType.TOPIC, topic.name,
                          "Authorization failed.")
            partitions, asked = _plan(broker, topic)
            broker.engine.check_new_topic(topic.name, partitions, topic.replication_factor,
                                          asked)
            # check_new_topic refused null values (INVALID_CONFIG), as Kafka does.
            configs = cast(dict[str, str], asked)
            if body.validate_only:
                topic_id = uuid4()  # as Kafka: an id, though nothing is created
            else:
                created = await broker.engine.create_topic(topic.name, partitions, configs)
                topic_id = created.topic_id
            results.append(_result(schema, broker, topic.name, topic_id, partitions, configs,
                                   described_by))
        except EXPECTED as exc:
            results.append(
                build(schema.CreatableTopicResult, name=topic.name, topic_id=UUID(int=0),
                      error_code=error_code(exc), error_message=error_message(exc),
                      num_partitions=-1, replication_factor=-1, configs=())
            )
    return build_response(schema.CreateTopicsResponse, throttle_time=NO_THROTTLE,
                          topics=tuple(results))


def _plan(broker: HandlerContext, topic: CreatableTopic) -> tuple[int, dict[str, str | None]]:
    partitions: int = topic.num_partitions
    if topic.assignments:
        if partitions != -1 or topic.replication_factor != -1:
            raise InvalidRequest("both partitions/replication factor "
                             "and manual assignments were given")
        for assignment in topic.assignments:
            if tuple(assignment.broker_ids) != (broker.node_id,):
                raise InvalidReplicaAssignment(
                    f"replicas must be [{broker.node_id}], the only broker")
        partitions = len(topic.assignments)
    elif partitions == -1:
        partitions = broker.config.num_partitions
    # A null value is refused (INVALID_CONFIG) by the engine's checks, as in Kafka.
    return partitions, {config.name: config.value for config in topic.configs}


def _result(schema: ModuleType, broker: HandlerContext, name: str, topic_id: UUID,
            partitions: int, configs: dict[str, str],
            described_by: dict[tuple[tuple[str, str], ...], tuple[object, ...]]
            ) -> object:
    """``described_by``: the configs answered so far, by overrides: topics with the
    same overrides share one (immutable) description, built once."""
    described = None
    key = tuple(sorted(configs.items(), key=lambda item: item[0]))
    if key in described_by:
        described = described_by[key]
    elif hasattr(schema, "CreatableTopicConfigs"):  # v5+; older versions have no configs
        described = described_by[key] = tuple(
            build(schema.CreatableTopicConfigs, name=e.name, value=e.value,
                  read_only=e.read_only, config_source=e.source, is_sensitive=e.sensitive)
            for e in topic_entries(configs, broker.config.topic_defaults(), include_internal=True)
        )
    return build(
        schema.CreatableTopicResult,
        name=name,
        topic_id=topic_id,
        error_code=ErrorCode.none,
        error_message=None,
        num_partitions=partitions,
        replication_factor=1,
        configs=described,
    )
