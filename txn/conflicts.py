"""The optimistic offset-range check (YDB-style) of a transaction's offsets.

Kafka clients send a new offset, not the range they consumed, so the range is
derived: a transaction that commits offset ``new`` for a group's partition
claims [the offset committed when it began, new). It conflicts, and can only
abort, when

- the partition's offset was committed after the transaction began (its
  version is newer than ``begin_version``): another commit claimed a range
  that overlaps this one; or
- ``new`` does not move past the offset committed now: that range was
  already processed (the hung worker whose successor committed first) -
  unless this transactional id committed that offset itself: re-committing
  its own offset claims an empty range (clients send the positions of every
  assigned partition, also of those with no new records).

The check runs at TxnOffsetCommit and again, in the same event-loop step as
the commit's write is staged, at EndTxn(commit).
"""

from __future__ import annotations

from collections.abc import Mapping

from tablets.consumer_offsets import ConsumerOffsets, OffsetCommit, TopicPartition


def offset_conflict(offsets: ConsumerOffsets, group: str,
                    commits: Mapping[TopicPartition, OffsetCommit],
                    begin_version: int, transactional_id: str) -> str | None:
    """Why these offsets cannot be committed by this transaction, or None."""
    for (topic, partition), commit in commits.items():
        current = offsets.latest(group, topic, partition)
        if current is None:
            continue
        if current.version > begin_version:
            return (f"group {group} {topic}-{partition}: offset {current.offset} was committed "
                    f"after this transaction began (version {current.version} > "
                    f"{begin_version})")
        if commit.offset < current.offset or (
                commit.offset == current.offset and current.committer != transactional_id):
            return (f"group {group} {topic}-{partition}: new offset {commit.offset} does not move "
                    f"past the committed {current.offset}: that range was already processed")
    return None
