"""The timed half of a consumer group: join phases, generations, session expiry.

``Rebalancer`` owns the groups and moves them through Kafka's states on its
timers (``loop.call_later``); ``GroupCoordinator`` (coordinator.py) answers
the requests on top of it. See coordinator.py for the timers and what each
one bounds. Every move is checked against ``group.TRANSITIONS`` (Kafka's
GroupMetadata states; tests/test_group_state.py); the behaviour is asserted by
tests/test_group_coordinator.py.

**Generations across coordinators.** Where the engine persists generations
(``ConsumerOffsetStore.persists_generations``: several gateways over
PostgreSQL, where a group's coordinator moves), a group created here starts
from the stored generation, and each new generation is stored before any
member hears of it: the join phase ends (members that did not rejoin
removed), the group waits (``numbering``, still PreparingRebalance: joins and
leaves are taken, the phase is not ended twice), then the generation starts
with the number stored. A join phase that ends with no member (the last
one left, even while a write was in flight) is not stored: nobody hears of
that generation, and the group is Empty at once, as Kafka's is when its last
member leaves. That is one write per rebalance and none per heartbeat;
reserving numbers ahead would save that write but leave gaps and a ceiling
to keep, for a step that already waits for every member. A failed
write (this gateway lost the group's coordinator slot: NOT_COORDINATOR;
the store failed: COORDINATOR_NOT_AVAILABLE) drops the group from memory and
answers its waiting members with that code; they find the coordinator and
join again. ``drop_groups`` drops the groups of keys this gateway stopped
coordinating (members, generation, pending joins), so that gaining them back
starts from storage. The embedded engine keeps generations in memory only,
as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TypeVar

from kio.schema.errors import ErrorCode

from common.logtext import client_text
from tablets.errors import CoordinatorMoved
from tablets.seam import ConsumerOffsetStore

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
        # The store of generations, where the engine persists them (else None).
        self.generations: ConsumerOffsetStore | None = None
        self._numbering: set[asyncio.Task[None]] = set()

    def _new_group(self, group_id: str) -> Group:
        """A group this coordinator does not have in memory: at the stored
        generation (0 where none is stored)."""
        stored = self.generations.generation(group_id) if self.generations is not None else 0
        group = self.groups[group_id] = Group(group_id, state_since_ms=self.clock(),
                                              generation_id=stored)
        return group

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
        if not group.is_(PREPARING) or (group.numbering is not None and group.members):
            return
        self._cancel_group_timers(group)
        group.join_timer_is_initial_delay = False
        group.new_member_added = False
        self._drop_late_members(group)
        if self.generations is None or not group.members:
            # No member hears of an empty generation, so it is not stored (the
            # next stored one is above it) and the group is Empty at once, as
            # in Kafka: a DeleteGroups right after the last LeaveGroup finds it
            # Empty. A write in flight for members who left since is stale.
            group.numbering = None
            self._start_generation(group, group.generation_id + 1)
            return
        task = asyncio.get_running_loop().create_task(
            self._number(group, self.generations), name=f"generation of {group.group_id}")
        group.numbering = task
        self._numbering.add(task)
        task.add_done_callback(self._numbering.discard)

    @staticmethod
    def _drop_late_members(group: Group) -> None:
        for member in [m for m in group.members.values() if not m.awaiting_join]:
            log.info("group %s: member %s did not rejoin in time", client_text(group.group_id),
                     client_text(member.member_id))
            group.remove(member.member_id)

    async def _number(self, group: Group, generations: ConsumerOffsetStore) -> None:
        """Store the group's next generation, then start it (see the module's
        docstring)."""
        try:
            generation = await generations.next_generation(group.group_id, group.generation_id)
        except Exception as exc:
            if group.numbering is not asyncio.current_task():
                return  # stale: the group went Empty without it
            group.numbering = None
            if self.groups.get(group.group_id) is group:
                moved = isinstance(exc, CoordinatorMoved)
                log.warning("group %s: its next generation was not stored (%r)",
                            client_text(group.group_id), exc)
                self.drop_group(group, ErrorCode.not_coordinator if moved
                                else ErrorCode.coordinator_not_available)
            return
        if group.numbering is not asyncio.current_task():
            return  # stale: the group went Empty without it
        group.numbering = None
        if self.groups.get(group.group_id) is not group or not group.is_(PREPARING):
            return  # dropped meanwhile (its slot lost)
        self._drop_late_members(group)  # (left while the write was in flight)
        self._start_generation(group, generation)

    def _start_generation(self, group: Group, generation: int) -> None:
        group.generation_id = generation
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
    def drop_group(self, group: Group, code: ErrorCode) -> None:
        """Forget a group's membership at once: its waiting JoinGroup and
        SyncGroup requests are answered with ``code``, its timers cancelled."""
        self._cancel_group_timers(group)
        for timer in group.pending_members.values():
            timer.cancel()
        group.pending_members.clear()
        members = list(group.members.values())
        group.members.clear()  # (a session timer that still fires finds nothing)
        for member in members:
            member.cancel_session_timer()
            member.complete_join(JoinResult(code, member.member_id))
            member.complete_sync(SyncResult(code))
        group.numbering = None
        self._transition(group, DEAD)
        if self.groups.get(group.group_id) is group:
            del self.groups[group.group_id]

    def drop_groups(self, was_here: Callable[[str], bool]) -> None:
        """This gateway stopped coordinating some keys (``ClusterView.
        watch_coordination``): their groups' members, generations and pending
        joins are forgotten; their waiting requests answer NOT_COORDINATOR."""
        gone = [group for group_id, group in self.groups.items() if was_here(group_id)]
        for group in gone:
            self.drop_group(group, ErrorCode.not_coordinator)
        if gone:
            log.info("dropped %d groups whose coordinator slot moved away", len(gone))

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
