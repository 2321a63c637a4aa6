"""Metadata (key 3), v0-12: the live brokers and who leads each partition.

A node alone (RocksDB) is the only broker and the controller, and leads
every partition. In a cluster of gateways over PostgreSQL
(``kafka_gateway/routing.py``) the brokers are the live gateways, each
partition names its leader (LEADER_NOT_AVAILABLE while it has none, as
Kafka during an election), with its leader epoch (which grows with every
change of leader), and this gateway is named the controller. Each
partition's replica and ISR are its leader alone: the gateways share one log
in PostgreSQL.

Topics are reported with their ids (v10+, Fetch v13 uses them). A
requested topic that does not exist is auto-created when the request allows it
(v4+; always for v0-3) and ``auto.create.topics.enable`` is on; a bad name gets
INVALID_TOPIC_EXCEPTION.

With an authorizer, as Kafka: a listing of all topics leaves out those the
principal may not DESCRIBE; a named one it may not describe gets
TOPIC_AUTHORIZATION_FAILED (without its id, whether it exists or not); one
to auto-create needs CREATE on the cluster or the topic.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, TypeAlias
from uuid import UUID

from kio.schema.errors import ErrorCode

from tablets import check_topic_name
from tablets.errors import InvalidTopicName
from tablets.seam import TopicView

from ..codec import NO_THROTTLE, Request, build, build_response, response_schema
from ..context import HandlerContext
from ..contract import Response
from ..errors import EXPECTED, code_of, error_code
from ..routing import brokers, leader_epoch, partition_leader
from ..security.acls import Operation, ResourceType
from ..security.authorizer import allowed, authorize, cluster_allowed
from ..slicing import sliced

if TYPE_CHECKING:
    from kio.schema.metadata.v0 import request as v0
    from kio.schema.metadata.v1 import request as v1
    from kio.schema.metadata.v2 import request as v2
    from kio.schema.metadata.v3 import request as v3
    from kio.schema.metadata.v4 import request as v4
    from kio.schema.metadata.v5 import request as v5
    from kio.schema.metadata.v6 import request as v6
    from kio.schema.metadata.v7 import request as v7
    from kio.schema.metadata.v8 import request as v8
    from kio.schema.metadata.v9 import request as v9
    from kio.schema.metadata.v10 import request as v10
    from kio.schema.metadata.v11 import request as v11
    from kio.schema.metadata.v12 import request as v12

    # The request body at each version served: kio generates one class per version.
    MetadataRequest: TypeAlias = (
        v0.MetadataRequest | v1.MetadataRequest | v2.MetadataRequest | v3.MetadataRequest
        | v4.MetadataRequest | v5.MetadataRequest | v6.MetadataRequest | v7.MetadataRequest
        | v8.MetadataRequest | v9.MetadataRequest | v10.MetadataRequest | v11.MetadataRequest
        | v12.MetadataRequest
    )

API_KEY = 3
VERSIONS = (0, 12)
_NO_ID = UUID(int=0)


async def handle(broker: HandlerContext, request: Request[MetadataRequest]) -> Response:
    schema = response_schema(API_KEY, request.version)
    body = request.body
    version = request.version
    requested = body.topics
    if version == 0 and not requested:
        requested = None  # v0: an empty list means every topic
    allow_create = getattr(body, "allow_auto_topic_creation", True)

    topics = []
    secured = broker.authorizer is not None
    if requested is None:
        topics = [await _topic(schema, t, broker)
                  async for t in sliced(broker.engine.list_topics())
                  if not secured or allowed(broker, request, Operation.DESCRIBE,
                                            ResourceType.TOPIC, t.name)]
    else:
        async for wanted in sliced(requested):
            name = getattr(wanted, "name", None)
            topic_id = getattr(wanted, "topic_id", None)
            if name is None and topic_id not in (None, _NO_ID):
                topic = broker.engine.topic_by_id(topic_id)
                if topic is None:
                    topics.append(_error(schema, None, ErrorCode.unknown_topic_id, topic_id))
                elif secured and (code := _describe(broker, request, topic.name)):
                    topics.append(_error(schema, None, code, topic_id))  # ids are not secret
                else:
                    topics.append(await _topic(schema, topic, broker))
                continue
            if secured and (code := _describe(broker, request, name or "")):
                topics.append(_error(schema, name, code))
                continue
            topics.append(await _named(broker, request, schema, name or "", allow_create))

    return build_response(
        schema.MetadataResponse,
        throttle_time=NO_THROTTLE,
        brokers=tuple(build(schema.MetadataResponseBroker, node_id=b.node_id, host=b.host,
                            port=b.port, rack=None) for b in brokers(broker, request)),
        cluster_id=broker.cluster_id,
        controller_id=broker.node_id,
        topics=tuple(topics),
    )


def _describe(broker: HandlerContext, request: Request[object], name: str) -> ErrorCode:
    """The code of a topic the principal may not describe, else none."""
    return code_of(authorize, broker, request, Operation.DESCRIBE, ResourceType.TOPIC, name)


async def _named(broker: HandlerContext, request: Request[object], schema: ModuleType, name: str,
                 allow_create: bool) -> object:
    topic = broker.engine.find_topic(name)
    if topic is not None:
        return await _topic(schema, topic, broker)
    creating = allow_create and broker.config.auto_create_topics
    if creating and broker.authorizer is not None and not cluster_allowed(
            broker, request, Operation.CREATE) and (code := code_of(
                authorize, broker, request, Operation.CREATE, ResourceType.TOPIC, name)):
        return _error(schema, name, code)
    try:
        check_topic_name(name)
    except InvalidTopicName:
        return _error(schema, name, ErrorCode.invalid_topic_exception)
    if not creating:
        return _error(schema, name, ErrorCode.unknown_topic_or_partition)
    try:
        topic = await broker.auto_create(name)
    except EXPECTED as exc:
        return _error(schema, name, error_code(exc))
    return await _topic(schema, topic, broker)


async def _topic(schema: ModuleType, topic: TopicView, broker: HandlerContext) -> object:
    # A topic may have 10,000 partitions and a node hundreds of thousands: in slices.
    return build(
        schema.MetadataResponseTopic,
        error_code=ErrorCode.none,
        name=topic.name,
        topic_id=topic.topic_id,
        is_internal=False,
        partitions=tuple([
            _partition(schema, index, partition_leader(broker, topic.name, index),
                       leader_epoch(broker, topic.name, index))
            async for index in sliced(range(len(topic.partitions)))
        ]),
    )


def _partition(schema: ModuleType, index: int, leader: int | None, epoch: int) -> object:
    if leader is None:  # no live leader right now: clients retry, as during an election
        return build(schema.MetadataResponsePartition,
                     error_code=ErrorCode.leader_not_available, partition_index=index,
                     leader_id=-1, leader_epoch=-1, replica_nodes=(), isr_nodes=(),
                     offline_replicas=())
    return build(schema.MetadataResponsePartition, error_code=ErrorCode.none,
                 partition_index=index, leader_id=leader, leader_epoch=epoch,
                 replica_nodes=(leader,), isr_nodes=(leader,), offline_replicas=())


def _error(schema: ModuleType, name: str | None, code: ErrorCode,
           topic_id: UUID | None = None) -> object:
    return build(
        schema.MetadataResponseTopic,
        error_code=code,
        name=name,
        topic_id=topic_id or _NO_ID,
        is_internal=False,
        partitions=(),
    )
