"""CreateTopics (key 19), v2-7: topics with partitions and config overrides.

-1 partitions / replication factor mean the node's defaults. Replication
factor can only be 1 (one copy per partition). Manual assignments must name
this node. validate_only checks everything and creates nothing. v5+ answers
with the topic's configs, v7 with its id.

Needs CREATE on the cluster or on each topic (TOPIC_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

from collections import Counter
from uuid import UUID

from kio.schema.errors import ErrorCode

from ..codec import NO_THROTTLE, build, response_schema
from ..configs import topic_entries
from ..errors import KafkaError, error_code, error_message
from ..security.acls import Operation, ResourceType
from ..security.authorizer import authorize_cluster, denied_names

API_KEY = 19
VERSIONS = (2, 7)


async def handle(broker, request):
    schema = response_schema(API_KEY, request.version)
    body = request.body
    counts = Counter(t.name for t in body.topics)
    denied = {}
    if authorize_cluster(broker, request, Operation.CREATE, log=False):
        denied = denied_names(broker, request, Operation.CREATE, ResourceType.TOPIC, counts)
    results = []
    for topic in body.topics:
        try:
            if counts[topic.name] > 1:
                raise KafkaError(ErrorCode.invalid_request,
                                 f"topic {topic.name} appears more than once in the request")
            if code := denied.get(topic.name):
                raise KafkaError(code, "Authorization failed.")
            partitions, configs = _plan(broker, topic)
            if body.validate_only:
                broker.engine.check_new_topic(topic.name, partitions, 1, configs)
                topic_id = UUID(int=0)
            else:
                created = await broker.engine.create_topic(topic.name, partitions, configs)
                topic_id = created.topic_id
            results.append(_result(schema, broker, topic.name, topic_id, partitions, configs))
        except Exception as exc:
            results.append(
                build(schema.CreatableTopicResult, name=topic.name, topic_id=UUID(int=0),
                      error_code=error_code(exc), error_message=error_message(exc),
                      num_partitions=-1, replication_factor=-1, configs=None)
            )
    return build(schema.CreateTopicsResponse, throttle_time=NO_THROTTLE, topics=tuple(results))


def _plan(broker, topic) -> tuple[int, dict[str, str]]:
    partitions = topic.num_partitions
    if topic.assignments:
        if partitions != -1 or topic.replication_factor != -1:
            raise KafkaError(ErrorCode.invalid_request, "both partitions/replication factor "
                             "and manual assignments were given")
        for assignment in topic.assignments:
            if tuple(assignment.broker_ids) != (broker.node_id,):
                raise KafkaError(ErrorCode.invalid_replica_assignment,
                                 f"replicas must be [{broker.node_id}], the only broker")
        partitions = len(topic.assignments)
    elif partitions == -1:
        partitions = broker.config.num_partitions
    if topic.replication_factor not in (-1, 1):
        raise KafkaError(ErrorCode.invalid_replication_factor,
                         f"Replication factor {topic.replication_factor} is larger than the "
                         "1 available broker")
    configs: dict[str, str] = {}
    for config in topic.configs:
        if config.value is None:
            continue  # a null value means "use the default"
        configs[config.name] = config.value
    return partitions, configs


def _result(schema, broker, name, topic_id, partitions, configs):
    described = None
    if hasattr(schema, "CreatableTopicConfigs"):  # v5+; older versions have no configs
        described = tuple(
            build(schema.CreatableTopicConfigs, name=e.name, value=e.value,
                  read_only=e.read_only, config_source=e.source, is_sensitive=e.sensitive)
            for e in topic_entries(configs, broker.config.topic_defaults())
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
