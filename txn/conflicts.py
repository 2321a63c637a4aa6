"""The optimistic offset-range check (YDB-style) of a transaction's offsets.

Kafka clients send a new offset, not the range they consumed, so the range is
derived: a transaction that commits offset ``new`` for a group's partition
claims [the offset committed when it began, new). It conflicts, and can only
abort, when

1. the partition's offset was committed after the transaction began (its
   version is newer than ``begin_version``): another commit claimed a range
   that overlaps this one; or
2. ``new`` does not move past the offset committed now: that range was
   already processed (the hung worker whose successor committed first) -
   unless this transactional id committed that offset itself: re-committing
   its own offset claims an empty range (clients send the positions of every
   assigned partition, also of those with no new records).

A commit that carried the group's current generation and one of its members
(KIP-447; ``members`` names the member per partition, "" or absent for a
commit without membership) is *member-fenced*: the generation already fences
the hung worker, so

- an unchanged offset (``new`` == the committed offset) claims an empty range
  and passes, whoever committed it: after a rebalance an EOS v2 application
  re-sends, for a partition it took over and has no new records of, the
  offset its predecessor's transactional id committed. When that offset was
  committed after this transaction began, it passes only when the commit is
  known to come from another member (the predecessor) or from this member's
  own plain commit; the same member through another transactional id (two
  producers of one consumer both claim the range that ends there), a commit
  without membership, or one whose member a restart forgot: rule 1;
- a plain OffsetCommit of the same member in the same generation is not a
  rival's commit (rule 1 skips it): it is this consumer's own auto-commit,
  left on in an EOS loop. Kafka lets both land; so does the gateway.

An offset below the committed one conflicts always.

The check runs at TxnOffsetCommit and again, in the same event-loop step as
the commit's write is staged, at EndTxn(commit).
"""

from __future__ import annotations

from collections.abc import Mapping

from tablets.seam import CommittedOffset, ConsumerOffsetStore, OffsetCommit, TopicPartition


def moved_but_exempt(current: CommittedOffset, commit: OffsetCommit, member: str,
                     transactional_id: str) -> bool:
    """Whether ``offset_conflict`` lets ``commit`` pass although ``current``
    was committed after the transaction began (rule 1's exceptions above):
    an unchanged, member-fenced offset of a predecessor or of this id, or
    the member's own auto-commit. The group's coordinator in a cluster,
    which stages offsets for a transaction another gateway coordinates,
    sends this along: the store compares the begin point itself
    (``pgstore.txn_staged_offsets``)."""
    same_member = bool(member) and current.member == member
    own_auto_commit = same_member and not current.committer
    predecessor = bool(member) and bool(current.member) and not same_member
    return own_auto_commit or (bool(member) and commit.offset == current.offset and (
        predecessor or current.committer == transactional_id))


def offset_conflict(offsets: ConsumerOffsetStore, group: str,
                    commits: Mapping[TopicPartition, OffsetCommit],
                    begin_version: int, transactional_id: str,
                    members: Mapping[TopicPartition, str] | None = None) -> str | None:
    """Why these offsets cannot be committed by this transaction, or None."""
    members = members or {}
    for (topic, partition), commit in commits.items():
        current = offsets.latest(group, topic, partition)
        if current is None:
            continue
        member = members.get((topic, partition), "")
        moved = current.version > begin_version
        same_member = bool(member) and current.member == member
        own_auto_commit = same_member and not current.committer
        predecessor = bool(member) and bool(current.member) and not same_member
        if member and commit.offset == current.offset and (
                not moved or predecessor or own_auto_commit
                or current.committer == transactional_id):
            continue  # an empty range, and the generation fences the hung worker
        if moved and not own_auto_commit:
            return (f"group {group} {topic}-{partition}: offset {current.offset} was committed "
                    f"after this transaction began (version {current.version} > "
                    f"{begin_version})")
        if commit.offset < current.offset or (
                commit.offset == current.offset and current.committer != transactional_id):
            return (f"group {group} {topic}-{partition}: new offset {commit.offset} does not move "
                    f"past the committed {current.offset}: that range was already processed")
    return None
