"""JoinGroup: how a member joins a group, by whether it has a member id yet, is
static (``group.instance.id``) or known, and by the group's state (Kafka's
GroupCoordinator.handleJoinGroup). The member's answer is a future the group
completes when the join phase ends (rebalance.py); ``coordinator.py`` puts the
other group requests on top.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from common.logtext import client_text

from .fences import is_valid_group_id
from .group import Group, GroupState, JoinResult, Member, SyncResult
from .rebalance import Rebalancer, done

log = logging.getLogger(__name__)

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


class JoinPhase(Rebalancer):
    """The JoinGroup request over the rebalancer's groups."""

    async def join_group(self, request: JoinRequest) -> JoinResult:
        # Shielded: a client that disconnects mid-join must not cancel the
        # group's future; the member stays joined and expires like Kafka's.
        return await asyncio.shield(self._join(request))

    def _join(self, req: JoinRequest) -> asyncio.Future[JoinResult]:
        group, error = self._group_to_join(req)
        if group is None:
            return done(JoinResult(error, req.member_id))
        if not req.member_id:
            return self._join_without_id(group, req)
        return self._join_with_id(group, req)

    def _group_to_join(self, req: JoinRequest) -> tuple[Group | None, ErrorCode]:
        """The group a JoinGroup joins (created for a member without an id), or
        None with the error to answer."""
        if not is_valid_group_id(req.group_id, allow_empty=False):
            return None, ErrorCode.invalid_group_id
        if not (self.config.group_min_session_timeout_ms <= req.session_timeout_ms
                <= self.config.group_max_session_timeout_ms):
            return None, ErrorCode.invalid_session_timeout
        group = self.groups.get(req.group_id)
        if group is None:
            if req.member_id:
                return None, ErrorCode.unknown_member_id
            group = self._new_group(req.group_id)
        if group.is_(DEAD):
            return None, ErrorCode.coordinator_not_available
        if not group.supports(req.protocol_type, req.protocols):
            return None, ErrorCode.inconsistent_group_protocol
        return group, ErrorCode.none

    def _join_without_id(self, group: Group, req: JoinRequest) -> asyncio.Future[JoinResult]:
        """A new member, a restarted static member, or one told to come back with
        the id it is given (MEMBER_ID_REQUIRED)."""
        new_id = f"{req.group_instance_id or req.client_id}-{uuid.uuid4()}"
        if req.group_instance_id is not None:
            existing = group.static_members.get(req.group_instance_id)
            if existing is not None:
                return self._rejoin_static_member(group, group.members[existing], new_id, req)
        elif req.require_known_member_id:
            # KIP-394: the client must come back with this id, so a member
            # whose JoinGroup response is lost leaves no ghost behind.
            self._add_pending_member(group, new_id, req.session_timeout_ms)
            return done(JoinResult(ErrorCode.member_id_required, new_id))
        return self._add_member_and_rebalance(group, new_id, req)

    def _join_with_id(self, group: Group, req: JoinRequest) -> asyncio.Future[JoinResult]:
        """A pending member coming back with its id, or a member rejoining."""
        pending = group.pending_members.pop(req.member_id, None)
        if pending is not None:
            pending.cancel()
            return self._add_member_and_rebalance(group, req.member_id, req)
        error = group.validate_member(req.member_id, req.group_instance_id)
        if error is not ErrorCode.none:
            return done(JoinResult(error, req.member_id))
        return self._rejoin(group, group.members[req.member_id], req)

    def _rejoin(self, group: Group, member: Member,
                req: JoinRequest) -> asyncio.Future[JoinResult]:
        """A known member's JoinGroup, by the group's state."""
        if group.is_(PREPARING):
            return self._update_member_and_rebalance(group, member, req)
        if group.is_(COMPLETING):
            if member.same_protocols(req.protocols):
                # It lost its JoinGroup response: answer again for this generation.
                return done(self._join_result(group, member))
            return self._update_member_and_rebalance(group, member, req)
        if group.is_(STABLE):
            if member.member_id == group.leader_id or not member.same_protocols(req.protocols):
                # The leader rejoins when its metadata changed (e.g. new partitions).
                return self._update_member_and_rebalance(group, member, req)
            self._schedule_session_expiry(group, member)
            return done(self._join_result(group, member, with_members=False))
        return done(JoinResult(ErrorCode.unknown_member_id, req.member_id))  # Empty: none

    def _add_pending_member(self, group: Group, member_id: str, session_timeout_ms: int) -> None:
        loop = asyncio.get_running_loop()
        group.pending_members[member_id] = loop.call_later(
            session_timeout_ms / 1000, self._expire_pending_member, group, member_id)

    def _expire_pending_member(self, group: Group, member_id: str) -> None:
        if group.pending_members.pop(member_id, None) is not None:
            log.info("group %s: pending member %s never joined", client_text(group.group_id),
                     client_text(member_id))
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
        log.info("group %s: member %s joins (%s)", client_text(group.group_id),
                 client_text(member_id), client_text(req.reason or "new member"))
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
        log.info("group %s: static member %s rejoins as %s (was %s)", client_text(group.group_id),
                 client_text(req.group_instance_id), client_text(new_id), client_text(old_id))
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
