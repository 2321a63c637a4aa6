"""CreatePartitions (key 37), v0-3: grow a topic to a new partition count.

The count can only grow (INVALID_PARTITIONS otherwise); manual assignments
must name this node. validate_only checks and changes nothing.

Needs ALTER on each topic (TOPIC_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

from kio.schema.errors import ErrorCode

from ..answers import answer_each
from ..codec import NO_THROTTLE, Request, build, build_response, response_schema
from ..context import HandlerContext
from ..contract import Response
from ..errors import InvalidReplicaAssignment, error_code, error_message
from ..security.acls import Operation, ResourceType
from ..security.authorizer import authorize

if TYPE_CHECKING:
    from kio.schema.create_partitions.v0 import request as v0
    from kio.schema.create_partitions.v1 import request as v1
    from kio.schema.create_partitions.v2 import request as v2
    from kio.schema.create_partitions.v3 import request as v3

    # The request body at each version served: kio generates one class per version.
    CreatePartitionsRequest: TypeAlias = (
        v0.CreatePartitionsRequest | v1.CreatePartitionsRequest | v2.CreatePartitionsRequest
        | v3.CreatePartitionsRequest
    )

    CreatePartitionsTopic: TypeAlias = (
        v0.CreatePartitionsTopic | v1.CreatePartitionsTopic | v2.CreatePartitionsTopic
        | v3.CreatePartitionsTopic
    )

API_KEY = 37
VERSIONS = (0, 3)


async def handle(broker: HandlerContext, request: Request[CreatePartitionsRequest]) -> Response:
    schema = response_schema(API_KEY, request.version)
    body = request.body

    def answer(topic: CreatePartitionsTopic, code: ErrorCode = ErrorCode.none,
               message: str | None = None) -> object:
        return build(schema.CreatePartitionsTopicResult, name=topic.name, error_code=code,
                     error_message=message)

    async def create(topic: CreatePartitionsTopic) -> object:
        authorize(broker, request, Operation.ALTER, ResourceType.TOPIC, topic.name,
                  "The topic authorization is failed.")
        for assignment in topic.assignments or ():
            if tuple(assignment.broker_ids) != (broker.node_id,):
                raise InvalidReplicaAssignment(
                    f"replicas must be [{broker.node_id}], the only broker")
        if body.validate_only:
            broker.engine.check_new_partitions(topic.name, topic.count)
        else:
            await broker.engine.create_partitions(topic.name, topic.count)
        return answer(topic)

    topics: tuple[CreatePartitionsTopic, ...] = body.topics
    results = await answer_each(topics, create, lambda topic, exc: answer(
        topic, error_code(exc), error_message(exc)))
    return build_response(schema.CreatePartitionsResponse, throttle_time=NO_THROTTLE,
                          results=tuple(results))
