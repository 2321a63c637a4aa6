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
UNKNOWN_MEMBER_ID / ILLEGAL_GENERATION and rejoin. Where the engine persists
generations (several gateways), the generation survives the coordinator:
see rebalance.py. Committed offsets are the
other half of a group (``offsets.py``); they pass this coordinator's fences
(``fence_commit``) before they are written.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from common.clock import now_ms
from common.logtext import client_text
from tablets.seam import ConsumerOffsetStore

from ..errors import KafkaError
from ..settings import GatewayConfig
from .fences import Fences
from .fences import is_valid_group_id as is_valid_group_id  # the handlers' import
from .fences import member_tag as member_tag
from .group import Group, GroupState, JoinResult, Member, SyncResult
from .join import JoinPhase
from .join import JoinRequest as JoinRequest  # re-exported, as the package does
from .rebalance import done

log = logging.getLogger(__name__)

EMPTY = GroupState.EMPTY
PREPARING = GroupState.PREPARING_REBALANCE
STABLE = GroupState.STABLE
DEAD = GroupState.DEAD


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


class GroupCoordinator(JoinPhase, Fences):
    """The group requests (JoinGroup, SyncGroup, Heartbeat, LeaveGroup, the
    commit fence, DescribeGroups, ListGroups) over the rebalancer's groups.

    ``offsets`` is only read here: a group with committed offsets and no
    members is reported as Empty."""

    def __init__(self, config: GatewayConfig, offsets: ConsumerOffsetStore,
                 clock: Callable[[], int] = now_ms) -> None:
        super().__init__(config, clock)
        self.offsets = offsets
        if offsets.persists_generations:
            self.generations = offsets
        # Whether this gateway coordinates a group now (a cluster's routing;
        # every group on a node alone): offset expiry passes over the others.
        self.coordinates: Callable[[str], bool] = lambda _group_id: True
        self.started_ms = clock()

    # ----------------------------------------------------------- lifecycle
    def stop(self) -> None:
        """Answer every waiting JoinGroup/SyncGroup with NOT_COORDINATOR (the
        client looks for the coordinator again) and cancel every timer."""
        for task in self._numbering:  # generations being stored
            task.cancel()
        for group in self.groups.values():
            self._cancel_group_timers(group)
            for timer in group.pending_members.values():
                timer.cancel()
            for member in group.members.values():
                member.cancel_session_timer()
                member.complete_join(JoinResult(ErrorCode.not_coordinator, member.member_id))
                member.complete_sync(SyncResult(ErrorCode.not_coordinator))

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
        try:
            group = self._fence_member(group_id, generation_id, member_id, instance_id)
        except KafkaError as exc:
            return done(SyncResult(exc.code))
        if (protocol_type is not None and protocol_type != group.protocol_type) or (
                protocol_name is not None and protocol_name != group.protocol_name):
            return done(SyncResult(ErrorCode.inconsistent_group_protocol))
        if group.is_(EMPTY):
            return done(SyncResult(ErrorCode.unknown_member_id))
        if group.is_(PREPARING):
            return done(SyncResult(ErrorCode.rebalance_in_progress))
        member = group.members[member_id]
        self._schedule_session_expiry(group, member)
        self._synced(group, member_id)
        if group.is_(STABLE):
            return done(self._sync_result(group, member))
        # CompletingRebalance: wait for the leader's assignment.
        member.complete_sync(SyncResult(ErrorCode.rebalance_in_progress))
        future = member.sync_future = asyncio.get_running_loop().create_future()
        if member_id == group.leader_id:
            for each in group.members.values():
                each.assignment = assignments.get(each.member_id, b"")
            self._transition(group, STABLE)
            log.info("group %s: generation %d is stable", client_text(group.group_id),
                     group.generation_id)
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
        try:
            group = self._fence_member(group_id, generation_id, member_id, instance_id)
        except KafkaError as exc:
            return exc.code
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
        log.info("group %s: member %s leaves", client_text(group.group_id), client_text(member_id))
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
