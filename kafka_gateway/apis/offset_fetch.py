"""OffsetFetch (key 9), v1-8: a group's committed offsets.

- Named partitions, or (v2+, topics null) every partition the group has an
  offset for. A partition without one answers offset -1 and metadata "".
- v5+ returns the committed leader epoch; v8 asks for several groups at once.
- require_stable (v7+): a partition whose offset an open transaction has
  staged answers UNSTABLE_OFFSET_COMMIT, so the consumer retries instead of
  starting from an offset about to move.
- Offsets are read from memory (loaded at start-up), whatever the group's
  membership state; an unknown group simply has none.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from ..codec import NO_THROTTLE, build, response_schema

API_KEY = 9
VERSIONS = (1, 8)


async def handle(broker, request):
    schema = response_schema(API_KEY, request.version)
    body = request.body
    if request.version >= 8:
        return build(schema.OffsetFetchResponse, throttle_time=NO_THROTTLE, groups=tuple(
            _group(broker, schema, g.group_id, g.topics, body.require_stable)
            for g in body.groups
        ))
    topics = _topics(broker, schema, body.group_id, body.topics,
                     getattr(body, "require_stable", False), "OffsetFetchResponseTopic",
                     "OffsetFetchResponsePartition")
    return build(schema.OffsetFetchResponse, throttle_time=NO_THROTTLE, topics=topics,
                 error_code=ErrorCode.none)


def _group(broker, schema, group_id, topics, require_stable):
    return build(
        schema.OffsetFetchResponseGroup, group_id=group_id, error_code=ErrorCode.none,
        topics=_topics(broker, schema, group_id, topics, require_stable,
                       "OffsetFetchResponseTopics", "OffsetFetchResponsePartitions"),
    )


def _topics(broker, schema, group_id, topics, require_stable, topic_cls, partition_cls):
    wanted = None if topics is None else [
        (t.name, p) for t in topics for p in t.partition_indexes
    ]
    found = broker.group_offsets.fetch_offsets(group_id, wanted, require_stable)
    by_topic: dict[str, list] = {}
    for (topic, partition), (committed, code) in found.items():
        by_topic.setdefault(topic, []).append(build(
            getattr(schema, partition_cls),
            partition_index=partition,
            committed_offset=committed.offset if committed else -1,
            committed_leader_epoch=committed.leader_epoch if committed else -1,
            metadata=committed.metadata if committed else "",
            error_code=code,
        ))
    return tuple(
        build(getattr(schema, topic_cls), name=name, partitions=tuple(partitions))
        for name, partitions in by_topic.items()
    )
