"""One consumer group's membership: states, members, protocol selection.

This module holds the data and the small rules that read it; the transitions
(and their timers) are driven by ``GroupCoordinator``. States, as in Kafka's
classic protocol::

    Empty --join--> PreparingRebalance --all joined / timeout--> CompletingRebalance
      ^                 ^       |                                    |
      |                 |       +--no member left--> Empty           | leader's SyncGroup
      |                 +--join, leave, expiry, protocol change--+   v
      +----------------------- last member gone ------------ Stable
    Dead: deleted (DeleteGroups) or expired; a Dead group is never reused.
"""

from __future__ import annotations

import asyncio
import enum
from collections import Counter
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from .consumer_protocol import PROTOCOL_TYPE, subscribed_topics


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


# state -> the states it may move to: Kafka's GroupMetadata (validPreviousStates
# of each state) read the other way round. A group is created Empty; the first
# join prepares a rebalance; a join phase ends Completing (members) or Empty (none
# rejoined); the leader's SyncGroup makes it Stable; any change of membership
# prepares a rebalance again; removal (DeleteGroups, offset expiry) makes it Dead.
TRANSITIONS: dict[GroupState, frozenset[GroupState]] = {
    GroupState.EMPTY: frozenset({GroupState.PREPARING_REBALANCE, GroupState.DEAD}),
    GroupState.PREPARING_REBALANCE: frozenset({GroupState.COMPLETING_REBALANCE,
                                               GroupState.EMPTY, GroupState.DEAD}),
    GroupState.COMPLETING_REBALANCE: frozenset({GroupState.STABLE,
                                                GroupState.PREPARING_REBALANCE,
                                                GroupState.DEAD}),
    GroupState.STABLE: frozenset({GroupState.PREPARING_REBALANCE, GroupState.DEAD}),
    GroupState.DEAD: frozenset({GroupState.DEAD}),
}


class IllegalTransition(RuntimeError):
    """A bug: the coordinator tried a move the table does not allow."""


@dataclass(frozen=True, slots=True)
class JoinedMember:
    """A member as the leader sees it in its JoinGroup response."""

    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(slots=True)
class JoinResult:
    error: ErrorCode
    member_id: str
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str = ""
    members: list[JoinedMember] = field(default_factory=list)
    skip_assignment: bool = False


@dataclass(slots=True)
class SyncResult:
    error: ErrorCode
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass(eq=False, slots=True)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]  # (name, metadata), in the member's preference order
    assignment: bytes = b""
    # Set while a JoinGroup / SyncGroup of this member waits for the group.
    join_future: asyncio.Future[JoinResult] | None = None
    sync_future: asyncio.Future[SyncResult] | None = None
    session_timer: asyncio.TimerHandle | None = None

    @property
    def awaiting_join(self) -> bool:
        return self.join_future is not None and not self.join_future.done()

    @property
    def awaiting_sync(self) -> bool:
        return self.sync_future is not None and not self.sync_future.done()

    def metadata_for(self, protocol: str) -> bytes:
        return next((m for name, m in self.protocols if name == protocol), b"")

    def same_protocols(self, protocols: list[tuple[str, bytes]]) -> bool:
        return self.protocols == protocols

    def complete_join(self, result: JoinResult) -> None:
        if self.awaiting_join:
            assert self.join_future is not None
            self.join_future.set_result(result)
        self.join_future = None

    def complete_sync(self, result: SyncResult) -> None:
        if self.awaiting_sync:
            assert self.sync_future is not None
            self.sync_future.set_result(result)
        self.sync_future = None

    def cancel_session_timer(self) -> None:
        if self.session_timer is not None:
            self.session_timer.cancel()
            self.session_timer = None


@dataclass(eq=False, slots=True)
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    state_since_ms: int = 0  # when the group entered its current state
    generation_id: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    # Member ids handed out with MEMBER_ID_REQUIRED, not yet seen in a JoinGroup.
    pending_members: dict[str, asyncio.TimerHandle] = field(default_factory=dict)
    # Members of this generation that have not sent SyncGroup yet.
    pending_sync: set[str] = field(default_factory=set)
    # The initial delay of a new group is extended while members keep arriving.
    new_member_added: bool = False
    join_timer: asyncio.TimerHandle | None = None
    join_timer_is_initial_delay: bool = False
    initial_delay_remaining_ms: int = 0
    sync_timer: asyncio.TimerHandle | None = None
    # The write storing the generation this join phase ends in (an engine
    # that persists generations): members wait for it, as for the join. A
    # write that is no longer this one when it ends is stale: every member
    # left meanwhile, and the group went Empty without it.
    numbering: asyncio.Task[None] | None = None

    def is_(self, *states: GroupState) -> bool:
        return self.state in states

    def move(self, state: GroupState, now_ms: int) -> None:
        """Enter ``state`` at ``now_ms``, if TRANSITIONS allows it."""
        if state not in TRANSITIONS[self.state]:
            raise IllegalTransition(f"group {self.group_id}: {self.state.value} -> {state.value}")
        self.state = state
        self.state_since_ms = now_ms

    # ------------------------------------------------------------ members
    def add(self, member: Member) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        self.members[member.member_id] = member
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        if self.leader_id is None:
            self.leader_id = member.member_id

    def remove(self, member_id: str) -> Member | None:
        member = self.members.pop(member_id, None)
        if member is None:
            return None
        member.cancel_session_timer()
        if member.group_instance_id is not None and (
            self.static_members.get(member.group_instance_id) == member_id
        ):
            del self.static_members[member.group_instance_id]
        self.pending_sync.discard(member_id)
        if self.leader_id == member_id:
            # Prefer a member already waiting in JoinGroup: it will get the members list.
            candidates = [m for m in self.members.values() if m.awaiting_join]
            candidates = candidates or list(self.members.values())
            self.leader_id = candidates[0].member_id if candidates else None
        return member

    def replace_static_member(self, old: Member, new_member_id: str) -> None:
        """A static member came back under a new member id: same slot, same assignment."""
        del self.members[old.member_id]
        old_id, old.member_id = old.member_id, new_member_id
        self.members[new_member_id] = old
        assert old.group_instance_id is not None
        self.static_members[old.group_instance_id] = new_member_id
        if self.leader_id == old_id:
            self.leader_id = new_member_id
        if old_id in self.pending_sync:
            self.pending_sync.discard(old_id)
            self.pending_sync.add(new_member_id)

    def static_member_fenced(self, member_id: str, instance_id: str | None) -> bool:
        if instance_id is None:
            return False
        current = self.static_members.get(instance_id)
        return current is not None and current != member_id

    def validate_member(self, member_id: str, instance_id: str | None) -> ErrorCode:
        """Kafka's check that a request comes from the current holder of its ids."""
        if instance_id is not None:
            current = self.static_members.get(instance_id)
            if current is None:
                return ErrorCode.unknown_member_id
            if current != member_id:
                return ErrorCode.fenced_instance_id
            return ErrorCode.none
        return ErrorCode.none if member_id in self.members else ErrorCode.unknown_member_id

    @property
    def all_members_joined(self) -> bool:
        return not self.pending_members and all(
            m.awaiting_join for m in self.members.values()
        )

    @property
    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    # ----------------------------------------------------------- protocols
    def supports(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        """Whether a member with these protocols may join (Kafka's isProtocolSupported)."""
        if not protocol_type or not protocols:
            return False
        if not self.members:
            return True
        names = {name for name, _ in protocols}
        return protocol_type == self.protocol_type and bool(names & self.candidate_protocols())

    def candidate_protocols(self, members: list[Member] | None = None) -> set[str]:
        """Protocols every member supports."""
        members = list(self.members.values()) if members is None else members
        if not members:
            return set()
        common = {name for name, _ in members[0].protocols}
        for member in members[1:]:
            common &= {name for name, _ in member.protocols}
        return common

    def select_protocol(self, members: list[Member] | None = None) -> str | None:
        """Each member votes for its most preferred candidate; the most votes win
        (ties go to the candidate the leader prefers)."""
        members = list(self.members.values()) if members is None else members
        candidates = self.candidate_protocols(members)
        if not candidates:
            return None
        votes = Counter(
            next(name for name, _ in member.protocols if name in candidates)
            for member in members
        )
        leader = self.members.get(self.leader_id or "") or members[0]
        preference = [name for name, _ in leader.protocols if name in candidates]
        return max(preference, key=lambda name: (votes[name], -preference.index(name)))

    def subscribed_topics(self) -> set[str] | None:
        """Topics the members subscribe to (consumer protocol); None if unknown."""
        if self.protocol_type != PROTOCOL_TYPE or self.protocol_name is None:
            return None
        topics: set[str] = set()
        for member in self.members.values():
            subscribed = subscribed_topics(member.metadata_for(self.protocol_name))
            if subscribed is None:
                return None
            topics |= subscribed
        return topics
