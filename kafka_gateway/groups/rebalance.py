"""The timed half of a consumer group: join phases, generations, session expiry.

``Rebalancer`` owns the groups and moves them through Kafka's states on its
timers (``loop.call_later``); ``GroupCoordinator`` (coordinator.py) answers
the requests on top of it. See coordinator.py for the timers and what each
one bounds. Every move is checked against ``group.TRANSITIONS`` (Kafka's
GroupMetadata states; tests/test_group_state.py); the behaviour is asserted by
tests/test_group_coordinator.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TypeVar

from kio.schema.errors import ErrorCode

from common.logtext import client_text

from ..settings import GatewayConfig
from .group import Group, GroupState, JoinedMember, JoinResult, Member, SyncResult

log = logging.getLogger(__name__)
T = TypeVar("T")

EMPTY = GroupState.EMPTY
PREPARING = GroupState.PREPARING_REBALANCE
COMPLETING = GroupState.COMPLETING_REBALANCE
STABLE = GroupState.STABLE
DEAD = GroupState.DEAD


class Rebalancer:
    def __init__(self, config: GatewayConfig, clock: Callable[[], int]) -> None:
        self.config = config
        self.clock = clock
        self.groups: dict[str, Group] = {}
        self.rebalances = 0  # completed join phases, for metrics

    def _join_result(self, group: Group, member: Member, with_members: bool = True) -> JoinResult:
        is_leader = member.member_id == group.leader_id
        protocol = group.protocol_name or ""
        return JoinResult(
            error=ErrorCode.none,
            member_id=member.member_id,
            generation_id=group.generation_id,
            protocol_type=group.protocol_type,
            protocol_name=group.protocol_name,
            leader_id=group.leader_id or "",
            members=[
                JoinedMember(m.member_id, m.group_instance_id, m.metadata_for(protocol))
                for m in group.members.values()
            ] if is_leader and with_members else [],
        )

    # ------------------------------------------------------- rebalancing
    def _maybe_prepare_rebalance(self, group: Group) -> None:
        if group.is_(EMPTY, STABLE, COMPLETING):
            self._prepare_rebalance(group)

    def _prepare_rebalance(self, group: Group) -> None:
        loop = asyncio.get_running_loop()
        if group.is_(COMPLETING):
            # Assignments of the generation being abandoned will never come.
            for member in group.members.values():
                member.complete_sync(SyncResult(ErrorCode.rebalance_in_progress))
        self._cancel_group_timers(group)
        group.pending_sync.clear()
        rebalance_timeout = group.rebalance_timeout_ms
        if group.is_(EMPTY):
            delay = self.config.group_initial_rebalance_delay_ms
            group.join_timer_is_initial_delay = True
            group.initial_delay_remaining_ms = max(rebalance_timeout - delay, 0)
            group.join_timer = loop.call_later(delay / 1000, self._initial_delay_expired, group)
        else:
            group.join_timer_is_initial_delay = False
            group.join_timer = loop.call_later(rebalance_timeout / 1000, self._complete_join, group)
        self._transition(group, PREPARING)
        log.info("group %s: preparing rebalance of generation %d (%d members)",
                 client_text(group.group_id), group.generation_id, len(group.members))
        self._try_complete_join(group)

    def _initial_delay_expired(self, group: Group) -> None:
        remaining = group.initial_delay_remaining_ms
        if group.new_member_added and remaining > 0:
            # Members are still arriving: wait once more, within the rebalance timeout.
            group.new_member_added = False
            delay = min(self.config.group_initial_rebalance_delay_ms, remaining)
            group.initial_delay_remaining_ms = remaining - delay
            group.join_timer = asyncio.get_running_loop().call_later(
                delay / 1000, self._initial_delay_expired, group)
            return
        self._complete_join(group)

    def _try_complete_join(self, group: Group) -> None:
        if (group.is_(PREPARING) and not group.join_timer_is_initial_delay
                and group.all_members_joined):
            self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        """End the join phase: drop members that did not rejoin, start a generation."""
        if not group.is_(PREPARING):
            return
        self._cancel_group_timers(group)
        group.join_timer_is_initial_delay = False
        group.new_member_added = False
        for member in [m for m in group.members.values() if not m.awaiting_join]:
            log.info("group %s: member %s did not rejoin in time", client_text(group.group_id),
                     client_text(member.member_id))
            group.remove(member.member_id)
        group.generation_id += 1
        self.rebalances += 1
        if not group.members:
            group.protocol_name = None
            group.leader_id = None
            self._transition(group, EMPTY)
            log.info("group %s: generation %d is empty", client_text(group.group_id),
                     group.generation_id)
            return
        group.protocol_name = group.select_protocol()
        self._transition(group, COMPLETING)
        group.pending_sync = set(group.members)
        log.info("group %s: generation %d with %d members, protocol %s, leader %s",
                 client_text(group.group_id), group.generation_id, len(group.members),
                 client_text(group.protocol_name), client_text(group.leader_id))
        for member in list(group.members.values()):
            member.complete_join(self._join_result(group, member))
            self._schedule_session_expiry(group, member)
        group.sync_timer = asyncio.get_running_loop().call_later(
            group.rebalance_timeout_ms / 1000, self._sync_expired, group, group.generation_id)

    def _sync_expired(self, group: Group, generation_id: int) -> None:
        """Members that never sent SyncGroup for this generation are dropped."""
        group.sync_timer = None
        if group.generation_id != generation_id or not group.is_(COMPLETING, STABLE):
            return
        missing = list(group.pending_sync)
        if not missing:
            return
        log.info("group %s: members %s sent no SyncGroup for generation %d",
                 client_text(group.group_id), ", ".join(map(client_text, missing)), generation_id)
        for member_id in missing:
            member = group.members.get(member_id)
            if member is not None:
                member.complete_join(JoinResult(ErrorCode.unknown_member_id, member_id))
                member.complete_sync(SyncResult(ErrorCode.unknown_member_id))
                group.remove(member_id)
        self._maybe_prepare_rebalance(group)

    def _transition(self, group: Group, state: GroupState) -> None:
        group.move(state, self.clock())

    @staticmethod
    def _cancel_group_timers(group: Group) -> None:
        for timer in (group.join_timer, group.sync_timer):
            if timer is not None:
                timer.cancel()
        group.join_timer = group.sync_timer = None

    # ----------------------------------------------------- member expiry
    def _schedule_session_expiry(self, group: Group, member: Member) -> None:
        member.cancel_session_timer()
        member.session_timer = asyncio.get_running_loop().call_later(
            member.session_timeout_ms / 1000, self._session_expired, group, member)

    def _session_expired(self, group: Group, member: Member) -> None:
        member.session_timer = None
        if group.members.get(member.member_id) is not member:
            return
        if member.awaiting_join or member.awaiting_sync:
            self._schedule_session_expiry(group, member)  # its request is still waiting
            return
        log.info("group %s: member %s session timed out after %d ms",
                 client_text(group.group_id), client_text(member.member_id),
                 member.session_timeout_ms)
        self._remove_member(group, member)

    def _remove_member(self, group: Group, member: Member) -> None:
        member.complete_join(JoinResult(ErrorCode.unknown_member_id, member.member_id))
        member.complete_sync(SyncResult(ErrorCode.unknown_member_id))
        group.remove(member.member_id)
        if group.is_(STABLE, COMPLETING):
            self._maybe_prepare_rebalance(group)
        elif group.is_(PREPARING):
            self._try_complete_join(group)

    # ------------------------------------------------------ group removal
    def remove_group(self, group: Group) -> None:
        """Forget a group without members (DeleteGroups, offset expiry)."""
        self._cancel_group_timers(group)
        for timer in group.pending_members.values():
            timer.cancel()
        group.pending_members.clear()
        self._transition(group, DEAD)
        del self.groups[group.group_id]


def done(value: T) -> asyncio.Future[T]:
    """An already-answered future, for requests the group answers at once."""
    future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future
