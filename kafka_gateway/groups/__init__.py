"""Consumer groups: the classic group protocol's coordinator (membership in
memory, committed offsets in the storage layer's ``ConsumerOffsets``)."""

from .coordinator import GroupCoordinator, GroupDescription, JoinRequest, MemberDescription
from .group import Group, GroupState, JoinedMember, JoinResult, Member, SyncResult

__all__ = [
    "Group",
    "GroupCoordinator",
    "GroupDescription",
    "GroupState",
    "JoinRequest",
    "JoinResult",
    "JoinedMember",
    "Member",
    "MemberDescription",
    "SyncResult",
]
