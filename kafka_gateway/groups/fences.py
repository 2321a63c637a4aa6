"""The fences of group requests: who may SyncGroup, Heartbeat or commit
offsets for a group (a live group, a known member and static instance, the
current generation; KIP-447 for commits), and which group ids are valid.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from ..errors import (
    CoordinatorNotAvailable,
    FencedInstanceId,
    IllegalGeneration,
    InvalidGroupId,
    RebalanceInProgress,
    UnknownMemberId,
    error_class,
)
from .group import Group, GroupState
from .rebalance import Rebalancer

EMPTY = GroupState.EMPTY
COMPLETING = GroupState.COMPLETING_REBALANCE
DEAD = GroupState.DEAD


def is_valid_group_id(group_id: str, allow_empty: bool) -> bool:
    # NUL separates the group from the topic in offset keys (tablets.keys).
    return "\x00" not in group_id and (allow_empty or bool(group_id))


def member_tag(generation_id: int, member_id: str) -> str:
    """Who a commit that passed the group fences came from, for the offset
    conflict checks: the member and its generation, or "" when the commit
    carried no membership (generation -1 or no member id: ``assign()``)."""
    return f"{generation_id}/{member_id}" if generation_id >= 0 and member_id else ""


class Fences(Rebalancer):
    """The member and generation checks, over the rebalancer's groups. Each
    fence raises the error Kafka answers (kafka_gateway/errors.py)."""

    def _fence_member(self, group_id: str, generation_id: int, member_id: str,
                      instance_id: str | None) -> Group:
        """The fence of SyncGroup and Heartbeat: a live group, a known member
        (and static instance), the current generation. Returns the group."""
        group = self.groups.get(group_id)
        if group is None:
            raise UnknownMemberId()
        if group.is_(DEAD):
            raise CoordinatorNotAvailable()
        error = group.validate_member(member_id, instance_id)
        if error is not ErrorCode.none:
            raise error_class(error)()
        if generation_id != group.generation_id:
            raise IllegalGeneration()
        return group

    def fence_commit(self, group_id: str, generation_id: int, member_id: str,
                     instance_id: str | None) -> None:
        """Whether an offset commit may proceed: Kafka's generation and member
        fences (KIP-447), shared by OffsetCommit and TxnOffsetCommit.

        Generation -1 with no member is a commit of a consumer that assigns
        partitions itself (``assign()``): allowed while the group has no members.
        """
        if not is_valid_group_id(group_id, allow_empty=True):
            raise InvalidGroupId()
        group = self.groups.get(group_id)
        if group is None:
            if generation_id < 0:
                return
            raise IllegalGeneration()
        if group.is_(DEAD):
            raise CoordinatorNotAvailable()
        if group.static_member_fenced(member_id, instance_id):
            raise FencedInstanceId()
        if generation_id < 0 and group.is_(EMPTY):
            return
        if member_id not in group.members:
            raise UnknownMemberId()
        if generation_id != group.generation_id:
            raise IllegalGeneration()
        if group.is_(COMPLETING):
            raise RebalanceInProgress()
        # Stable, or PreparingRebalance: the member learns of the rebalance
        # from its next heartbeat; what it processed so far may be committed.
        self._schedule_session_expiry(group, group.members[member_id])

    def fence_txn_commit(self, group_id: str, generation_id: int, member_id: str,
                         instance_id: str | None) -> None:
        """The group fences of a TxnOffsetCommit (KIP-447), as lenient as
        Kafka's: a member and a generation are checked only when sent (v3+
        clients with the consumer's group metadata). A group not known here
        is checked as Kafka checks the empty group it creates then: no
        members, generation 0."""
        group = self.groups.get(group_id)
        if group is None:
            if member_id:
                raise UnknownMemberId()
            if generation_id > 0:
                raise IllegalGeneration()
            return
        if group.is_(DEAD):
            raise CoordinatorNotAvailable()
        if group.static_member_fenced(member_id, instance_id):
            raise FencedInstanceId()
        if member_id and member_id not in group.members:
            raise UnknownMemberId()
        if generation_id >= 0 and generation_id != group.generation_id:
            raise IllegalGeneration()
