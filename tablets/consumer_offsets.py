"""Committed consumer offsets, kept in the store beside the partition tablets.

One key per (group, topic, partition) (``keys.consumer_offset_key``; YDB's
``c_<consumer>``) holding the committed offset, its leader epoch, the
client's metadata string, the commit timestamp and a *version*.

Versions come from one node-wide counter that every commit advances and
persists in the same write, so a (group, partition)'s version changes with
every commit to it and is never reused, not even after its offset was
deleted and the gateway restarted. The transaction coordinator compares
versions for its optimistic conflict checks.

Every offset is loaded into memory at start-up; reads never touch the disk
(the state in memory, versions and released markers: ``offset_state.py``,
shared with the PostgreSQL engine). A commit becomes visible to readers once
it is in the WAL (the same moment it is acknowledged), so nobody resumes from
an offset a crash could lose.

Important consumers (``tablets/important.py``) read these offsets: a named
group holds retention at its commit, or from the log start where it never
committed. Deleting an important group's offsets (DeleteGroups, OffsetDelete)
leaves a *released* marker (``keys.RELEASED``) so the group, now without offsets, stops
holding instead of holding from the log start; its next commit clears it.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterable, Mapping

from . import keys
from .offset_state import OffsetState
from .rocks_store import Ops, RocksStore
from .seam import CommittedOffset, OffsetCommit, TopicPartition
from .store import GroupCommitWriter

# offset, leader epoch, commit timestamp, version, committer length; then the
# committer (a transactional id, or empty) and the metadata.
_VALUE = struct.Struct(">qiqqH")
_VERSION_COUNTER = keys.COUNTER + b"consumer.offsets.version"
_COUNTER = struct.Struct(">q")

def _encode(record: CommittedOffset) -> bytes:
    committer = record.committer.encode()
    return (_VALUE.pack(record.offset, record.leader_epoch, record.commit_timestamp,
                        record.version, len(committer)) + committer + record.metadata.encode())


def _decode(value: bytes) -> CommittedOffset:
    offset, epoch, timestamp, version, length = _VALUE.unpack_from(value)
    end = _VALUE.size + length
    return CommittedOffset(offset, epoch, value[end:].decode(), timestamp, version,
                           value[_VALUE.size:end].decode())


class ConsumerOffsets(OffsetState):
    def __init__(self, store: RocksStore, writer: GroupCommitWriter) -> None:
        super().__init__()
        self.store = store
        self.writer = writer

    # One node alone: a group's generation lives in memory only (see the seam).
    persists_generations = False

    def generation(self, group: str) -> int:
        return 0

    async def next_generation(self, group: str, after: int) -> int:
        return after + 1

    def load(self) -> None:
        """Read every committed offset (start-up: small, sequential reads)."""
        raw = self.store.get(_VERSION_COUNTER)
        self.versions_from(_COUNTER.unpack(raw)[0] if raw else 0)
        start = keys.CONSUMER_OFFSET
        for key, value in self.store.scan(start, start + b"\xff"):
            group, topic, partition = keys.parse_consumer_offset_key(key)
            self.loaded(group, (topic, partition), _decode(value))
        for key, _ in self.store.scan(keys.RELEASED, keys.RELEASED + b"\xff"):
            group, released_topic, partition = keys.parse_released_key(key)
            self.loaded_release(group, None if released_topic is None
                                else (released_topic, partition))

    def stage(
        self, group: str, commits: Mapping[TopicPartition, OffsetCommit], now_ms: int, ops: Ops,
        committer: str = "", members: Mapping[TopicPartition, str] | None = None,
    ) -> dict[TopicPartition, CommittedOffset]:
        """Add a commit to ``ops`` (which may carry other changes, e.g. a
        transaction's, whose id is the ``committer``); call ``publish`` with
        the result once ``ops`` is durable."""
        staged = self.take(group, commits, now_ms, committer, members)
        if staged.unrelease_group:
            ops.delete(keys.released_key(group))
        for topic, partition in staged.unrelease:
            ops.delete(keys.released_key(group, topic, partition))
        for (topic, partition), record in staged.offsets.items():
            ops.put(keys.consumer_offset_key(group, topic, partition), _encode(record))
        ops.put(_VERSION_COUNTER, _COUNTER.pack(self.last_version))
        return staged.offsets

    async def commit(
        self, group: str, commits: Mapping[TopicPartition, OffsetCommit], now_ms: int,
        member: str = "",
    ) -> None:
        """Store offsets in one atomic write; visible once it is in the WAL."""
        if not commits:
            return
        ops = Ops()
        staged = self.stage(group, commits, now_ms, ops,
                            members=dict.fromkeys(commits, member) if member else None)
        # Published once written, even if the caller is cancelled meanwhile (the
        # writer writes a submitted change whatever becomes of its caller).
        written = self.writer.submit(ops)
        written.add_done_callback(lambda _: self.forget(group, staged) if _failed(written)
                                  else self.publish(group, staged))
        await asyncio.shield(written)

    async def delete(self, group: str, partitions: Iterable[TopicPartition] | None = None,
                     release: bool = True) -> int:
        """Delete some (or, with None, all) offsets of a group; returns how many.
        With ``release`` (an operator's deletion) the group stops holding
        retention where it was an important consumer. They leave memory when
        the deletion is in the WAL (``OffsetState.deleted``)."""
        deletion = self.plan_delete(group, partitions, release)
        if deletion is None:
            return 0
        ops = Ops()
        if deletion.whole_group:
            prefix = keys.consumer_group_prefix(group)
            ops.delete_range(prefix, prefix + b"\xff")
        else:
            for topic, partition in deletion.doomed:
                ops.delete(keys.consumer_offset_key(group, topic, partition))
        for _, released_topic, partition in deletion.releases:
            ops.put(keys.released_key(group) if released_topic is None
                    else keys.released_key(group, released_topic, partition), b"")
        written = self.writer.submit(ops)
        written.add_done_callback(lambda _: self.not_deleted(deletion) if _failed(written)
                                  else self.deleted(deletion))
        await asyncio.shield(written)
        return len(deletion.doomed)

    def drop_topic(self, topic: str, ops: Ops) -> None:
        """Add the deletion of every group's offsets of a deleted topic to ``ops``
        (a topic re-created under the same name starts without them, as in Kafka)."""
        offsets, markers = self.drop_topic_offsets(topic)
        for group, (offset_topic, partition) in offsets:
            ops.delete(keys.consumer_offset_key(group, offset_topic, partition))
        for released in markers:
            ops.delete(keys.released_key(*released))


def _failed(future: asyncio.Future[None]) -> bool:
    return future.cancelled() or future.exception() is not None
