"""TxnOffsetCommit (key 28), v0-3: stage a group's offsets in a transaction.

The offsets become visible only when the transaction commits, in the same
store write as its data; meanwhile OffsetFetch with require_stable answers
UNSTABLE_OFFSET_COMMIT for them. Checked in order:

- KIP-447 (v3): the group's generation and member, when the client sends them
  (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, FENCED_INSTANCE_ID);
- the producer's id and epoch against its transaction (INVALID_PRODUCER_EPOCH,
  fatal for every client), and that AddOffsetsToTxn named the group;
- the optimistic offset-range check (``txn.conflicts``; a commit that sent a
  generation and a member id and passed the fences is member-fenced, and an
  unchanged offset then passes): a conflict dooms the transaction and is
  answered ILLEGAL_GENERATION, abortable in the Java client
  (CommitFailedException) and in librdkafka alike.

In a cluster, when another gateway coordinates the transactional id (Kafka
clients send this request to the group's coordinator, EndTxn to the id's),
the offsets are staged in the store for that gateway's commit instead, after
the same KIP-447 fences: the store checks the transaction's stored state
(``txn/remote_offsets.py`` says what each refusal answers) and the offset-range
check is the commit's compare-and-set.

Past the group checks, a partition whose metadata is longer than
``offset.metadata.max.bytes`` gets OFFSET_METADATA_TOO_LARGE and is not
staged; the others are (Kafka's GroupMetadataManager.storeOffsets).

Needs WRITE on the transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
READ on the group (GROUP_AUTHORIZATION_FAILED), both for every partition,
and READ on each topic (TOPIC_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

from kio.schema.errors import ErrorCode

from tablets.seam import OffsetCommit

from ..codec import NO_THROTTLE, Request, build, build_response, response_schema
from ..context import HandlerContext
from ..contract import Response
from ..errors import EXPECTED, code_of, error_code
from ..groups.coordinator import is_valid_group_id, member_tag
from ..routing import authorize_txn_offsets
from ..security.acls import Operation, ResourceType
from ..security.authorizer import denied_names
from ..slicing import sliced

if TYPE_CHECKING:
    from kio.schema.txn_offset_commit.v0 import request as v0
    from kio.schema.txn_offset_commit.v1 import request as v1
    from kio.schema.txn_offset_commit.v2 import request as v2
    from kio.schema.txn_offset_commit.v3 import request as v3

    # The request body at each version served: kio generates one class per version.
    TxnOffsetCommitRequest: TypeAlias = (
        v0.TxnOffsetCommitRequest | v1.TxnOffsetCommitRequest | v2.TxnOffsetCommitRequest
        | v3.TxnOffsetCommitRequest
    )

API_KEY = 28
VERSIONS = (0, 3)


async def handle(broker: HandlerContext, request: Request[TxnOffsetCommitRequest]) -> Response:
    body = request.body
    schema = response_schema(API_KEY, request.version)
    wanted: dict[tuple[str, int], OffsetCommit] = {
        (topic.name, part.partition_index): OffsetCommit(
            part.committed_offset, getattr(part, "committed_leader_epoch", -1),
            part.committed_metadata or "")
        async for topic, part in sliced((t, p) for t in body.topics for p in t.partitions)}
    refused = code_of(authorize_txn_offsets, broker, request, body.transactional_id, body.group_id)
    denied = denied_names(broker, request, Operation.READ, ResourceType.TOPIC,
                          (topic for topic, _index in wanted)) if not refused else {}
    codes = {tp: refused or denied[tp[0]] for tp in wanted if refused or tp[0] in denied}
    codes.update({tp: ErrorCode.unknown_topic_or_partition async for tp in sliced(wanted)
                  if tp not in codes and not broker.engine.has_partition(*tp)})
    commits = {tp: commit for tp, commit in wanted.items() if tp not in codes}
    code = ErrorCode.none
    generation, member_id = getattr(body, "generation_id", -1), getattr(body, "member_id", "")
    if not is_valid_group_id(body.group_id, allow_empty=False):
        code = ErrorCode.invalid_group_id
    else:
        code = code_of(broker.groups.fence_txn_commit, body.group_id, generation, member_id,
                       getattr(body, "group_instance_id", None))
    if code is ErrorCode.none:
        # As Kafka's GroupMetadataManager.storeOffsets: past the group checks, a
        # partition whose metadata is too long is refused alone, the rest stored.
        max_metadata = broker.config.offset_metadata_max_bytes
        too_large = [tp for tp, commit in commits.items()
                     if len(commit.metadata.encode()) > max_metadata]
        codes.update(dict.fromkeys(too_large, ErrorCode.offset_metadata_too_large))
        for tp in too_large:
            del commits[tp]
    if code is ErrorCode.none and commits:
        cluster = broker.engine.cluster()
        # Member-fenced (a generation and a member, and the fence passed):
        # the range check lets an unchanged offset pass (txn.conflicts).
        member = member_tag(generation, member_id or "")
        try:
            if cluster is not None and not cluster.coordinates(body.transactional_id):
                await broker.txns.txn_offset_commit_elsewhere(
                    body.transactional_id, body.producer_id, body.producer_epoch,
                    body.group_id, commits, member)
            else:
                await broker.txns.txn_offset_commit(
                    body.transactional_id, body.producer_id, body.producer_epoch,
                    body.group_id, commits, request.connection, member)
        except EXPECTED as exc:
            code = error_code(exc, API_KEY, request.version)
    codes.update(dict.fromkeys(commits, code))
    by_topic: dict[str, list[Any]] = {}
    async for (topic, index), each in sliced(codes.items()):
        by_topic.setdefault(topic, []).append(build(
            schema.TxnOffsetCommitResponsePartition, partition_index=index, error_code=each))
    return build_response(schema.TxnOffsetCommitResponse, throttle_time=NO_THROTTLE, topics=tuple(
        build(schema.TxnOffsetCommitResponseTopic, name=name, partitions=tuple(parts))
        for name, parts in by_topic.items()))
