"""A group's committed offsets: commit, fetch, delete and expiry.

The other half of a consumer group (membership is ``coordinator.py``). Offsets
live in the storage layer (``tablets.consumer_offsets``) and survive restarts;
a commit passes the membership's fences first (``fence_commit``: generation,
member, static instance). Offsets of a group without members expire after
``offsets.retention.minutes``, except an important consumer's (a topic's
``gateway.important.consumer.groups``), which retention waits for.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping

from kio.schema.errors import ErrorCode

from common.clock import now_ms
from common.logtext import client_text
from tablets.seam import CommittedOffset, ConsumerOffsetStore, OffsetCommit, TopicPartition
from txn.pending_offsets import PendingOffsets

from ..errors import EXPECTED, KafkaError, error_code
from ..settings import GatewayConfig
from .consumer_protocol import PROTOCOL_TYPE
from .coordinator import GroupCoordinator
from .fences import is_valid_group_id, member_tag
from .group import GroupState

log = logging.getLogger(__name__)

EMPTY = GroupState.EMPTY
STABLE = GroupState.STABLE
DEAD = GroupState.DEAD


class GroupOffsets:
    def __init__(self, config: GatewayConfig, membership: GroupCoordinator,
                 offsets: ConsumerOffsetStore, clock: Callable[[], int] = now_ms,
                 pending: PendingOffsets | None = None) -> None:
        self.config = config
        self.membership = membership
        self.offsets = offsets
        # Offsets open transactions staged (the transaction coordinator's).
        self.pending = pending if pending is not None else PendingOffsets()
        self.clock = clock
        self._expiry_task: asyncio.Task[None] | None = None

    # ----------------------------------------------------------- lifecycle
    def start(self) -> None:
        self._expiry_task = asyncio.get_running_loop().create_task(self._expiry_loop())

    def stop(self) -> None:
        if self._expiry_task is not None:
            self._expiry_task.cancel()

    async def _expiry_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.offsets_retention_check_interval_ms / 1000)
            try:
                await self.expire_offsets()
            except Exception:
                log.exception("offset expiry pass failed")

    # --------------------------------------------------------- OffsetCommit
    async def commit_offsets(self, group_id: str, generation_id: int, member_id: str,
                             instance_id: str | None,
                             commits: Mapping[TopicPartition, OffsetCommit]) -> ErrorCode:
        try:
            self.membership.fence_commit(group_id, generation_id, member_id, instance_id)
        except KafkaError as exc:
            return exc.code
        # The member is kept with the offsets: a transaction of the same
        # member (auto-commit left on in an EOS loop) does not take this
        # commit for a rival's (txn.conflicts).
        await self.offsets.commit(group_id, commits, self.clock(),
                                  member_tag(generation_id, member_id))
        return ErrorCode.none

    # ---------------------------------------------------------- OffsetFetch
    def fetch_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None, require_stable: bool
    ) -> dict[TopicPartition, tuple[CommittedOffset | None, ErrorCode]]:
        """Committed offsets of the given partitions (None: every committed one)."""
        committed = self.offsets.group_offsets(group_id)
        wanted = sorted(committed) if partitions is None else partitions
        out: dict[TopicPartition, tuple[CommittedOffset | None, ErrorCode]] = {}
        for tp in wanted:
            if require_stable and self.pending.is_pending(group_id, *tp):
                out[tp] = (None, ErrorCode.unstable_offset_commit)
            else:
                out[tp] = (committed.get(tp), ErrorCode.none)
        return out

    # --------------------------------------------- DeleteGroups/OffsetDelete
    async def delete_group(self, group_id: str) -> ErrorCode:
        if not is_valid_group_id(group_id, allow_empty=True):
            return ErrorCode.invalid_group_id
        if self.pending.has_pending(group_id):
            # An open transaction will commit offsets for it: Kafka refuses too.
            return ErrorCode.non_empty_group
        group = self.membership.groups.get(group_id)
        if group is not None:
            if not group.is_(EMPTY):
                return ErrorCode.non_empty_group
            self.membership.remove_group(group)
        elif not self.offsets.has_offsets(group_id):
            return ErrorCode.group_id_not_found
        try:
            await self.offsets.delete(group_id)
        except EXPECTED as exc:  # the store refused it (NOT_COORDINATOR: the slot moved)
            return error_code(exc)
        log.info("group %s deleted", client_text(group_id))
        return ErrorCode.none

    def check_offset_delete(self, group_id: str) -> tuple[ErrorCode, set[str] | None]:
        """The group's error for OffsetDelete, and the topics whose offsets are
        protected because members subscribe to them (None: every topic)."""
        if not is_valid_group_id(group_id, allow_empty=True):
            return ErrorCode.invalid_group_id, set()
        group = self.membership.groups.get(group_id)
        if group is None:
            if self.offsets.has_offsets(group_id):
                return ErrorCode.none, set()
            return ErrorCode.group_id_not_found, set()
        if group.is_(DEAD):
            return ErrorCode.group_id_not_found, set()
        if not group.members:
            return ErrorCode.none, set()
        if group.protocol_type != PROTOCOL_TYPE:
            return ErrorCode.non_empty_group, set()
        return ErrorCode.none, group.subscribed_topics()

    # ------------------------------------------------------ offset expiry
    async def expire_offsets(self) -> int:
        """Delete expired offsets (``offsets.retention.minutes``); forget empty
        groups without offsets. Returns how many offsets were deleted.

        A group without members keeps its offsets for the retention period
        after the later of each commit and the moment it last had members
        (or the gateway started: membership is not persisted). A stable
        consumer group loses offsets of topics it no longer subscribes to
        once they are that old.
        """
        now = self.clock()
        retention = self.config.offsets_retention_minutes * 60_000
        groups = self.membership.groups
        deleted = 0
        for group_id in set(self.offsets.groups()) | set(groups):
            if not self.membership.coordinates(group_id):
                continue  # another gateway's group: its coordinator expires it
            group = groups.get(group_id)
            committed = self.offsets.group_offsets(group_id)
            expired: list[TopicPartition] = []
            if group is None or group.is_(EMPTY):
                empty_since = group.state_since_ms if group else self.membership.started_ms
                expired = [tp for tp, c in committed.items()
                           if now - max(c.commit_timestamp, empty_since) >= retention]
            elif group.is_(STABLE):
                subscribed = group.subscribed_topics()
                if subscribed is not None:
                    expired = [tp for tp, c in committed.items() if tp[0] not in subscribed
                               and now - c.commit_timestamp >= retention]
            # An important consumer's offsets never expire: retention waits for them.
            expired = [tp for tp in expired if not self.pending.is_pending(group_id, *tp)
                       and not self.offsets.is_important(group_id, tp[0])]
            if expired:
                deleted += await self.offsets.delete(group_id, expired, release=False)
                log.info("group %s: %d committed offsets expired", client_text(group_id),
                         len(expired))
            group = groups.get(group_id)  # the await may have let it change
            if (group is not None and group.is_(EMPTY) and not group.pending_members
                    and not self.offsets.has_offsets(group_id)):
                self.membership.remove_group(group)
        return deleted
