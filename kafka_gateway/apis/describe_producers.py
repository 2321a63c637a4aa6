"""DescribeProducers (key 61), v0: the idempotent and transactional producers a
partition knows (``kafka-transactions describe-producers``).

Each has its epoch, last sequence and last write time. No producer has an
open transaction in a log here (its data waits outside the log until its
commit), so the current transaction's start offset is always -1.

Needs READ on each topic (TOPIC_AUTHORIZATION_FAILED). In a cluster, a
partition another gateway leads gets NOT_LEADER_OR_FOLLOWER, as from a Kafka
broker that does not lead it (the admin client then asks its leader), never
the producers of a log this gateway does not write.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, TypeAlias

from kio.schema.errors import ErrorCode

from ..answers import each_partition, refuse_denied
from ..codec import NO_THROTTLE, Request, build, build_response, response_schema
from ..context import HandlerContext
from ..contract import Response
from ..errors import UnknownTopicOrPartition, error_code
from ..routing import check_leader
from ..security.acls import Operation, ResourceType
from ..security.authorizer import denied_names

if TYPE_CHECKING:
    from kio.schema.describe_producers.v0 import request as v0

    # The request body at each version served: kio generates one class per version.
    DescribeProducersRequest: TypeAlias = v0.DescribeProducersRequest

    TopicRequest: TypeAlias = v0.TopicRequest

API_KEY = 61
VERSIONS = (0, 0)


async def handle(broker: HandlerContext, request: Request[DescribeProducersRequest]) -> Response:
    schema = response_schema(API_KEY, request.version)
    denied = denied_names(broker, request, Operation.READ, ResourceType.TOPIC,
                          (topic.name for topic in request.body.topics))

    def answer(index: int, code: ErrorCode = ErrorCode.none,
               producers: Iterable[object] = ()) -> object:
        return build(schema.PartitionResponse, partition_index=index, error_code=code,
                     error_message=None, active_producers=tuple(producers))

    async def describe(topic: TopicRequest, index: int) -> object:
        refuse_denied(denied, topic.name)
        if not broker.engine.has_partition(topic.name, index):
            raise UnknownTopicOrPartition()
        check_leader(broker, topic.name, index)
        tablet = broker.engine.partition(topic.name, index)
        return answer(index, producers=[build(
            schema.ProducerState, producer_id=pid, producer_epoch=entry.epoch,
            last_sequence=entry.last_seq, last_timestamp=entry.last_timestamp,
            coordinator_epoch=-1, current_txn_start_offset=-1)
            for pid, entry in tablet.producers.items()])

    topics: tuple[TopicRequest, ...] = request.body.topics
    answered = await each_partition(topics, lambda topic: topic.partition_indexes,
                                    describe,
                                    lambda _topic, index, exc: answer(index, error_code(exc)))
    return build_response(schema.DescribeProducersResponse, throttle_time=NO_THROTTLE, topics=tuple(
        build(schema.TopicResponse, name=topic.name, partitions=tuple(parts))
        for topic, parts in answered))
