"""Consumer groups: Kafka's classic group protocol.

- ``group.py``: one group and its members (state, protocols, static members);
- ``rebalance.py``: the timed state machine (join phases, generations, expiry);
- ``coordinator.py``: the membership requests (SyncGroup, Heartbeat, LeaveGroup,
  DescribeGroups, ListGroups) over ``join.py`` (JoinGroup) and ``fences.py``
  (who may sync, heartbeat or commit; valid group ids);
- ``offsets.py``: committed offsets (commit, fetch, delete, expiry), stored in
  the storage layer's ``ConsumerOffsets``.
"""

from .coordinator import GroupCoordinator, GroupDescription, JoinRequest, MemberDescription
from .group import Group, GroupState, JoinedMember, JoinResult, Member, SyncResult
from .offsets import GroupOffsets

__all__ = [
    "Group",
    "GroupCoordinator",
    "GroupDescription",
    "GroupOffsets",
    "GroupState",
    "JoinRequest",
    "JoinResult",
    "JoinedMember",
    "Member",
    "MemberDescription",
    "SyncResult",
]
