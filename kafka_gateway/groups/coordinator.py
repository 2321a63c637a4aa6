"""The group coordinator: Kafka's classic consumer-group protocol, on asyncio.

Every operation runs on the event loop and changes a group synchronously, so
requests are applied in arrival order without locks; JoinGroup and SyncGroup
return a future the handler awaits while the group waits for its members.

Timers (``loop.call_later``):

- a member's session timeout, restarted by each heartbeat, commit and
  join/sync; on expiry the member is removed and the group rebalances. A
  member whose JoinGroup or SyncGroup is still waiting is kept alive: the
  rebalance's own timers bound that wait.
- a pending member (given an id with MEMBER_ID_REQUIRED) expires after its
  session timeout if it never joins with that id.
- the join phase ends when every member has rejoined, or after the group's
  rebalance timeout (the largest of its members'); members that did not
  rejoin are removed.
- a new (Empty) group's first rebalance waits ``group.initial.rebalance.delay.ms``
  for more members, extended while members keep arriving, within the
  rebalance timeout (Kafka's InitialDelayedJoin).
- after a generation starts, members that send no SyncGroup within the
  rebalance timeout are removed and the group rebalances.

Membership lives in memory only: after a gateway restart clients get
UNKNOWN_MEMBER_ID / ILLEGAL_GENERATION and rejoin. Committed offsets are the
other half of a group (``offsets.py``); they pass this coordinator's fences
(``fence_commit``) before they are written.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from kio.schema.errors import ErrorCode

from tablets.consumer_offsets import ConsumerOffsets
from tablets.tablet import now_ms

from ..config import GatewayConfig
from .group import Group, GroupState, JoinResult, Member, SyncResult
from .rebalance import Rebalancer

log = logging.getLogger(__name__)
T = TypeVar("T")

EMPTY = GroupState.EMPTY
PREPARING = GroupState.PREPARING_REBALANCE
COMPLETING = GroupState.COMPLETING_REBALANCE
STABLE = GroupState.STABLE
DEAD = GroupState.DEAD


@dataclass(frozen=True, slots=True)
class JoinRequest:
    group_id: str
    member_id: str  # "" for a member without an id yet
    group_instance_id: str | None
    client_id: str
    client_host: str
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    require_known_member_id: bool  # JoinGroup v4+: answer MEMBER_ID_REQUIRED first
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group_id: str
    state: str
    protocol_type: str
    protocol_data: str  # the selected protocol (assignor) while Stable
    members: list[MemberDescription]


def is_valid_group_id(group_id: str, allow_empty: bool) -> bool:
    # NUL separates the group from the topic in offset keys (tablets.keys).
    return "\x00" not in group_id and (allow_empty or bool(group_id))


def member_tag(generation_id: int, member_id: str) -> str:
    """Who a commit that passed the group fences came from, for the offset
    conflict checks: the member and its generation, or "" when the commit
    carried no membership (generation -1 or no member id: ``assign()``)."""
    return f"{generation_id}/{member_id}" if generation_id >= 0 and member_id else ""


class GroupCoordinator(Rebalancer):
    """The group requests (JoinGroup, SyncGroup, Heartbeat, LeaveGroup, the
    commit fence, DescribeGroups, ListGroups) over the rebalancer's groups.

    ``offsets`` is only read here: a group with committed offsets and no
    members is reported as Empty."""

    def __init__(self, config: GatewayConfig, offsets: ConsumerOffsets,
                 clock: Callable[[], int] = now_ms) -> None:
        super().__init__(config, clock)
        self.offsets = offsets
        self.started_ms = clock()

    # ----------------------------------------------------------- lifecycle
    def stop(self) -> None:
        """Answer every waiting JoinGroup/SyncGroup with NOT_COORDINATOR (the
        client looks for the coordinator again) and cancel every timer."""
        for group in self.groups.values():
            self._cancel_group_timers(group)
            for timer in group.pending_members.values():
                timer.cancel()
            for member in group.members.values():
                member.cancel_session_timer()
                member.complete_join(JoinResult(ErrorCode.not_coordinator, member.member_id))
                member.complete_sync(SyncResult(ErrorCode.not_coordinator))

    # ------------------------------------------------------------ JoinGroup
    async def join_group(self, request: JoinRequest) -> JoinResult:
        # Shielded: a client that disconnects mid-join must not cancel the
        # group's future; the member stays joined and expires like Kafka's.
        return await asyncio.shield(self._join(request))

    def _join(self, req: JoinRequest) -> asyncio.Future[JoinResult]:
        def fail(code: ErrorCode, member_id: str = req.member_id) -> asyncio.Future[JoinResult]:
            return _done(JoinResult(code, member_id))

        if not is_valid_group_id(req.group_id, allow_empty=False):
            return fail(ErrorCode.invalid_group_id)
        if not (self.config.group_min_session_timeout_ms <= req.session_timeout_ms
                <= self.config.group_max_session_timeout_ms):
            return fail(ErrorCode.invalid_session_timeout)
        group = self.groups.get(req.group_id)
        if group is None:
            if req.member_id:
                return fail(ErrorCode.unknown_member_id)
            group = self.groups[req.group_id] = Group(req.group_id, state_since_ms=self.clock())
        if group.is_(DEAD):
            return fail(ErrorCode.coordinator_not_available)
        if not group.supports(req.protocol_type, req.protocols):
            return fail(ErrorCode.inconsistent_group_protocol)

        if not req.member_id:
            new_id = f"{req.group_instance_id or req.client_id}-{uuid.uuid4()}"
            if req.group_instance_id is not None:
                existing = group.static_members.get(req.group_instance_id)
                if existing is not None:
                    return self._rejoin_static_member(group, group.members[existing], new_id, req)
            elif req.require_known_member_id:
                # KIP-394: the client must come back with this id, so a member
                # whose JoinGroup response is lost leaves no ghost behind.
                self._add_pending_member(group, new_id, req.session_timeout_ms)
                return fail(ErrorCode.member_id_required, new_id)
            return self._add_member_and_rebalance(group, new_id, req)

        pending = group.pending_members.pop(req.member_id, None)
        if pending is not None:
            pending.cancel()
            return self._add_member_and_rebalance(group, req.member_id, req)
        error = group.validate_member(req.member_id, req.group_instance_id)
        if error is not ErrorCode.none:
            return fail(error)
        member = group.members[req.member_id]
        if group.is_(PREPARING):
            return self._update_member_and_rebalance(group, member, req)
        if group.is_(COMPLETING):
            if member.same_protocols(req.protocols):
                # It lost its JoinGroup response: answer again for this generation.
                return _done(self._join_result(group, member))
            return self._update_member_and_rebalance(group, member, req)
        if group.is_(STABLE):
            if member.member_id == group.leader_id or not member.same_protocols(req.protocols):
                # The leader rejoins when its metadata changed (e.g. new partitions).
                return self._update_member_and_rebalance(group, member, req)
            self._schedule_session_expiry(group, member)
            return _done(self._join_result(group, member, with_members=False))
        return fail(ErrorCode.unknown_member_id)  # Empty: no members to be

    def _add_pending_member(self, group: Group, member_id: str, session_timeout_ms: int) -> None:
        loop = asyncio.get_running_loop()
        group.pending_members[member_id] = loop.call_later(
            session_timeout_ms / 1000, self._expire_pending_member, group, member_id)

    def _expire_pending_member(self, group: Group, member_id: str) -> None:
        if group.pending_members.pop(member_id, None) is not None:
            log.info("group %s: pending member %s never joined", group.group_id, member_id)
            self._try_complete_join(group)

    def _add_member_and_rebalance(self, group: Group, member_id: str,
                                  req: JoinRequest) -> asyncio.Future[JoinResult]:
        member = Member(
            member_id=member_id, group_instance_id=req.group_instance_id,
            client_id=req.client_id, client_host=req.client_host,
            session_timeout_ms=req.session_timeout_ms,
            rebalance_timeout_ms=req.rebalance_timeout_ms,
            protocol_type=req.protocol_type, protocols=list(req.protocols),
        )
        future = member.join_future = asyncio.get_running_loop().create_future()
        if group.is_(PREPARING) and group.generation_id == 0:
            group.new_member_added = True
        group.add(member)
        self._schedule_session_expiry(group, member)
        log.info("group %s: member %s joins (%s)", group.group_id, member_id,
                 req.reason or "new member")
        self._maybe_prepare_rebalance(group)
        self._try_complete_join(group)
        return future

    def _update_member_and_rebalance(self, group: Group, member: Member,
                                     req: JoinRequest) -> asyncio.Future[JoinResult]:
        # A JoinGroup still waiting for this member is superseded by this one.
        member.complete_join(JoinResult(ErrorCode.rebalance_in_progress, member.member_id))
        self._update_member(member, req)
        future = member.join_future = asyncio.get_running_loop().create_future()
        self._schedule_session_expiry(group, member)
        self._maybe_prepare_rebalance(group)
        self._try_complete_join(group)
        return future

    @staticmethod
    def _update_member(member: Member, req: JoinRequest) -> None:
        member.protocols = list(req.protocols)
        member.session_timeout_ms = req.session_timeout_ms
        member.rebalance_timeout_ms = req.rebalance_timeout_ms
        member.client_id = req.client_id
        member.client_host = req.client_host

    def _rejoin_static_member(self, group: Group, member: Member, new_id: str,
                              req: JoinRequest) -> asyncio.Future[JoinResult]:
        """A known group.instance.id joins without a member id: a restarted
        static member. It takes over its old slot (and assignment); the old
        incarnation is fenced. No rebalance unless the protocol would change."""
        old_id = member.member_id
        member.complete_join(JoinResult(ErrorCode.fenced_instance_id, old_id))
        member.complete_sync(SyncResult(ErrorCode.fenced_instance_id))
        group.replace_static_member(member, new_id)
        self._update_member(member, req)
        future = member.join_future = asyncio.get_running_loop().create_future()
        self._schedule_session_expiry(group, member)
        log.info("group %s: static member %s rejoins as %s (was %s)", group.group_id,
                 req.group_instance_id, new_id, old_id)
        if group.is_(STABLE):
            if group.select_protocol() == group.protocol_name:
                is_leader = group.leader_id == new_id
                # A returning leader gets the members (to know the group) but
                # must not reassign: skip_assignment (KIP-814).
                result = self._join_result(group, member, with_members=is_leader)
                result.skip_assignment = is_leader
                member.complete_join(result)
                return future
            self._maybe_prepare_rebalance(group)
        elif group.is_(COMPLETING):
            # The leader may be assigning with the old member id: start over.
            self._prepare_rebalance(group)
        self._try_complete_join(group)
        return future

    # ------------------------------------------------------------- fences
    def _fence_member(self, group_id: str, generation_id: int, member_id: str,
                      instance_id: str | None) -> tuple[Group | None, ErrorCode]:
        """The fence of SyncGroup and Heartbeat: a live group, a known member
        (and static instance), the current generation. Returns the group, or
        None with the error to answer."""
        group = self.groups.get(group_id)
        if group is None:
            return None, ErrorCode.unknown_member_id
        if group.is_(DEAD):
            return None, ErrorCode.coordinator_not_available
        error = group.validate_member(member_id, instance_id)
        if error is ErrorCode.none and generation_id != group.generation_id:
            error = ErrorCode.illegal_generation
        return (group, error) if error is ErrorCode.none else (None, error)

    def fence_commit(self, group_id: str, generation_id: int, member_id: str,
                     instance_id: str | None) -> ErrorCode:
        """Whether an offset commit may proceed: Kafka's generation and member
        fences (KIP-447), shared by OffsetCommit and TxnOffsetCommit.

        Generation -1 with no member is a commit of a consumer that assigns
        partitions itself (``assign()``): allowed while the group has no members.
        """
        if not is_valid_group_id(group_id, allow_empty=True):
            return ErrorCode.invalid_group_id
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.none if generation_id < 0 else ErrorCode.illegal_generation
        if group.is_(DEAD):
            return ErrorCode.coordinator_not_available
        if group.static_member_fenced(member_id, instance_id):
            return ErrorCode.fenced_instance_id
        if generation_id < 0 and group.is_(EMPTY):
            return ErrorCode.none
        if member_id not in group.members:
            return ErrorCode.unknown_member_id
        if generation_id != group.generation_id:
            return ErrorCode.illegal_generation
        if group.is_(COMPLETING):
            return ErrorCode.rebalance_in_progress
        # Stable, or PreparingRebalance: the member learns of the rebalance
        # from its next heartbeat; what it processed so far may be committed.
        self._schedule_session_expiry(group, group.members[member_id])
        return ErrorCode.none

    def fence_txn_commit(self, group_id: str, generation_id: int, member_id: str,
                         instance_id: str | None) -> ErrorCode:
        """The group fences of a TxnOffsetCommit (KIP-447), as lenient as
        Kafka's: a member and a generation are checked only when sent (v3+
        clients with the consumer's group metadata). A group not known here
        is checked as Kafka checks the empty group it creates then: no
        members, generation 0."""
        group = self.groups.get(group_id)
        if group is None:
            if member_id:
                return ErrorCode.unknown_member_id
            return ErrorCode.illegal_generation if generation_id > 0 else ErrorCode.none
        if group.is_(DEAD):
            return ErrorCode.coordinator_not_available
        if group.static_member_fenced(member_id, instance_id):
            return ErrorCode.fenced_instance_id
        if member_id and member_id not in group.members:
            return ErrorCode.unknown_member_id
        if generation_id >= 0 and generation_id != group.generation_id:
            return ErrorCode.illegal_generation
        return ErrorCode.none

    # ------------------------------------------------------------ SyncGroup
    async def sync_group(self, group_id: str, generation_id: int, member_id: str,
                         instance_id: str | None, protocol_type: str | None,
                         protocol_name: str | None,
                         assignments: Mapping[str, bytes]) -> SyncResult:
        return await asyncio.shield(self._sync(group_id, generation_id, member_id, instance_id,
                                               protocol_type, protocol_name, assignments))

    def _sync(self, group_id: str, generation_id: int, member_id: str, instance_id: str | None,
              protocol_type: str | None, protocol_name: str | None,
              assignments: Mapping[str, bytes]) -> asyncio.Future[SyncResult]:
        group, error = self._fence_member(group_id, generation_id, member_id, instance_id)
        if group is None:
            return _done(SyncResult(error))
        if (protocol_type is not None and protocol_type != group.protocol_type) or (
                protocol_name is not None and protocol_name != group.protocol_name):
            return _done(SyncResult(ErrorCode.inconsistent_group_protocol))
        if group.is_(EMPTY):
            return _done(SyncResult(ErrorCode.unknown_member_id))
        if group.is_(PREPARING):
            return _done(SyncResult(ErrorCode.rebalance_in_progress))
        member = group.members[member_id]
        self._schedule_session_expiry(group, member)
        self._synced(group, member_id)
        if group.is_(STABLE):
            return _done(self._sync_result(group, member))
        # CompletingRebalance: wait for the leader's assignment.
        member.complete_sync(SyncResult(ErrorCode.rebalance_in_progress))
        future = member.sync_future = asyncio.get_running_loop().create_future()
        if member_id == group.leader_id:
            for each in group.members.values():
                each.assignment = assignments.get(each.member_id, b"")
            self._transition(group, STABLE)
            log.info("group %s: generation %d is stable", group.group_id, group.generation_id)
            for each in group.members.values():
                each.complete_sync(self._sync_result(group, each))
        return future

    def _synced(self, group: Group, member_id: str) -> None:
        group.pending_sync.discard(member_id)
        if not group.pending_sync and group.sync_timer is not None:
            group.sync_timer.cancel()
            group.sync_timer = None

    @staticmethod
    def _sync_result(group: Group, member: Member) -> SyncResult:
        return SyncResult(ErrorCode.none, member.assignment, group.protocol_type,
                          group.protocol_name)

    # ------------------------------------------------------------ Heartbeat
    def heartbeat(self, group_id: str, generation_id: int, member_id: str,
                  instance_id: str | None) -> ErrorCode:
        group, error = self._fence_member(group_id, generation_id, member_id, instance_id)
        if group is None:
            return error
        if group.is_(EMPTY):
            return ErrorCode.unknown_member_id
        self._schedule_session_expiry(group, group.members[member_id])
        if group.is_(PREPARING):
            return ErrorCode.rebalance_in_progress  # the signal to rejoin
        return ErrorCode.none

    # ----------------------------------------------------------- LeaveGroup
    def leave_group(self, group_id: str,
                    members: list[tuple[str, str | None]]) -> tuple[ErrorCode, list[ErrorCode]]:
        """Remove members (member id, instance id); a static member may leave by
        instance id alone. Returns the group's error and one per member."""
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.none, [ErrorCode.unknown_member_id] * len(members)
        if group.is_(DEAD):
            code = ErrorCode.coordinator_not_available
            return code, [code] * len(members)
        return ErrorCode.none, [self._leave(group, m, i) for m, i in members]

    def _leave(self, group: Group, member_id: str, instance_id: str | None) -> ErrorCode:
        if not member_id and instance_id is not None:
            member_id = group.static_members.get(instance_id, "")
        pending = group.pending_members.pop(member_id, None)
        if pending is not None:
            pending.cancel()
            self._try_complete_join(group)
            return ErrorCode.none
        error = group.validate_member(member_id, instance_id)
        if error is not ErrorCode.none:
            return error
        log.info("group %s: member %s leaves", group.group_id, member_id)
        self._remove_member(group, group.members[member_id])
        return ErrorCode.none

    # ------------------------------------------------- Describe/List groups
    def describe(self, group_id: str) -> GroupDescription:
        group = self.groups.get(group_id)
        if group is None:
            state = EMPTY if self.offsets.has_offsets(group_id) else DEAD
            return GroupDescription(group_id, state.value, "", "", [])
        stable = group.is_(STABLE)
        protocol = group.protocol_name or ""
        return GroupDescription(
            group_id, group.state.value, group.protocol_type or "",
            protocol if stable else "",
            [MemberDescription(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                               m.metadata_for(protocol) if stable else b"",
                               m.assignment if stable else b"")
             for m in group.members.values()],
        )

    def list_groups(self, states: Iterable[str] = ()) -> list[tuple[str, str, str]]:
        """(group id, protocol type, state) of every group, or of those in ``states``."""
        wanted = {s.lower() for s in states}
        out = []
        for group_id in sorted(set(self.groups) | set(self.offsets.groups())):
            group = self.groups.get(group_id)
            state = group.state.value if group else EMPTY.value
            if wanted and state.lower() not in wanted:
                continue
            out.append((group_id, (group.protocol_type or "") if group else "", state))
        return out


def _done(value: T) -> asyncio.Future[T]:
    """An already-answered future, for requests the group answers at once."""
    future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future
