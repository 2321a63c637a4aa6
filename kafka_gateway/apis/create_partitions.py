"""CreatePartitions (key 37), v0-3: grow a topic to a new partition count.

The count can only grow (INVALID_PARTITIONS otherwise); manual assignments
must name this node. validate_only checks and changes nothing.

Needs ALTER on each topic (TOPIC_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from ..answers import answer_each
from ..codec import NO_THROTTLE, Request, build, response_schema
from ..context import HandlerContext
from ..contract import Response
from ..errors import InvalidReplicaAssignment, error_code, error_message
from ..security.acls import Operation, ResourceType
from ..security.authorizer import authorize

API_KEY = 37
VERSIONS = (0, 3)


async def handle(broker: HandlerContext, request: Request) -> Response:
    schema = response_schema(API_KEY, request.version)
    body = request.body

    def answer(topic, code: ErrorCode = ErrorCode.none, message: str | None = None):
        return build(schema.CreatePartitionsTopicResult, name=topic.name, error_code=code,
                     error_message=message)

    async def create(topic):
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

    results = await answer_each(body.topics, create, lambda topic, exc: answer(
        topic, error_code(exc), error_message(exc)))
    return build(schema.CreatePartitionsResponse, throttle_time=NO_THROTTLE, results=tuple(results))
