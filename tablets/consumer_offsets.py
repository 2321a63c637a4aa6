"""Committed consumer offsets, kept in the store beside the partition tablets.

One key per (group, topic, partition) (``keys.consumer_offset_key``; YDB's
``c_<consumer>``) holding the committed offset, its leader epoch, the
client's metadata string, the commit timestamp and a *version*.

Versions come from one node-wide counter that every commit advances and
persists in the same write, so a (group, partition)'s version changes with
every commit to it and is never reused, not even after its offset was
deleted and the gateway restarted. The transaction coordinator compares
versions for its optimistic conflict checks.

Every offset is loaded into memory at start-up; reads never touch the disk.
A commit becomes visible to readers once it is in the WAL (the same moment
it is acknowledged), so nobody resumes from an offset a crash could lose.

Important consumers (``tablets/important.py``) read these offsets: a named
group holds retention at its commit, or from the log start where it never
committed. Deleting an important group's offsets (DeleteGroups, OffsetDelete)
leaves a *released* marker (``keys.RELEASED``) so the group, now without offsets, stops
holding instead of holding from the log start; its next commit clears it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping

from . import keys
from .seam import CommittedOffset, OffsetCommit, TopicPartition
from .store import GroupCommitWriter, Ops, RocksStore

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


class ConsumerOffsets:
    def __init__(self, store: RocksStore, writer: GroupCommitWriter) -> None:
        self.store = store
        self.writer = writer
        # Visible (durable) offsets: group -> (topic, partition) -> offset.
        self._groups: dict[str, dict[TopicPartition, CommittedOffset]] = {}
        self._last_version = 0
        # Commits staged but not yet in the WAL: the newest wins in ``latest``.
        self._in_flight: dict[tuple[str, TopicPartition], CommittedOffset] = {}
        # Groups (and partitions of groups) whose offsets were deleted: they
        # hold no retention until they commit again.
        self._released_groups: set[str] = set()
        self._released_partitions: set[tuple[str, str, int]] = set()
        # Releases written but not yet durable; a commit staged meanwhile
        # cancels its own (it lands after the release, so it wins).
        self._releasing: set[tuple[str, str | None, int]] = set()
        # Whether a group is an important consumer of a topic (None: of any;
        # set by the engine, which knows the topics' configs): offset expiry
        # spares them, and only their deletion leaves a released marker.
        self.is_important: Callable[[str, str | None], bool] = lambda group, topic: False

    def load(self) -> None:
        """Read every committed offset (start-up: small, sequential reads)."""
        raw = self.store.get(_VERSION_COUNTER)
        self._last_version = _COUNTER.unpack(raw)[0] if raw else 0
        start = keys.CONSUMER_OFFSET
        for key, value in self.store.scan(start, start + b"\xff"):
            group, topic, partition = keys.parse_consumer_offset_key(key)
            self._groups.setdefault(group, {})[(topic, partition)] = _decode(value)
        for key, _ in self.store.scan(keys.RELEASED, keys.RELEASED + b"\xff"):
            group, released_topic, partition = keys.parse_released_key(key)
            if released_topic is None:
                self._released_groups.add(group)
            else:
                self._released_partitions.add((group, released_topic, partition))

    # ------------------------------------------------------------ reading
    def groups(self) -> list[str]:
        """Groups with at least one committed offset."""
        return list(self._groups)

    def has_offsets(self, group: str) -> bool:
        return bool(self._groups.get(group))

    def committed(self, group: str, topic: str, partition: int) -> CommittedOffset | None:
        return self._groups.get(group, {}).get((topic, partition))

    def group_offsets(self, group: str) -> dict[TopicPartition, CommittedOffset]:
        """A copy of every committed offset of a group."""
        return dict(self._groups.get(group, {}))

    def is_released(self, group: str, topic: str, partition: int) -> bool:
        """The group's offsets (all, or this partition's) were deleted and it has
        not committed this partition since: it holds no retention there."""
        return (group in self._released_groups
                or (group, topic, partition) in self._released_partitions)

    def latest(self, group: str, topic: str, partition: int) -> CommittedOffset | None:
        """The newest commit of a partition, counting one staged but not yet
        durable: what a conflict check must compare with."""
        in_flight = self._in_flight.get((group, (topic, partition)))
        return in_flight or self.committed(group, topic, partition)

    @property
    def last_version(self) -> int:
        """The newest version any commit took: versions after it are newer commits."""
        return self._last_version

    def version(self, group: str, topic: str, partition: int) -> int:
        """The version of a partition's committed offset; 0 when there is none."""
        committed = self.committed(group, topic, partition)
        return committed.version if committed else 0

    # ------------------------------------------------------------ writing
    def stage(
        self, group: str, commits: Mapping[TopicPartition, OffsetCommit], now_ms: int, ops: Ops,
        committer: str = "", members: Mapping[TopicPartition, str] | None = None,
    ) -> dict[TopicPartition, CommittedOffset]:
        """Add a commit to ``ops`` (which may carry other changes, e.g. a
        transaction's, whose id is the ``committer``); call ``publish`` with
        the result once ``ops`` is durable.

        Versions are taken now, in call order, so two commits staged one after
        the other get increasing versions whatever order they land in.
        """
        staged: dict[TopicPartition, CommittedOffset] = {}
        # A commit makes a deleted group whole again: it holds retention anew.
        if group in self._released_groups or (group, None, 0) in self._releasing:
            self._released_groups.discard(group)
            self._releasing.discard((group, None, 0))
            ops.delete(keys.released_key(group))
        for (topic, partition), commit in commits.items():
            if ((group, topic, partition) in self._released_partitions
                    or (group, topic, partition) in self._releasing):
                self._released_partitions.discard((group, topic, partition))
                self._releasing.discard((group, topic, partition))
                ops.delete(keys.released_key(group, topic, partition))
            self._last_version += 1
            record = CommittedOffset(commit.offset, commit.leader_epoch, commit.metadata, now_ms,
                                     self._last_version, committer,
                                     (members or {}).get((topic, partition), ""))
            ops.put(keys.consumer_offset_key(group, topic, partition), _encode(record))
            staged[(topic, partition)] = record
            self._in_flight[(group, (topic, partition))] = record
        ops.put(_VERSION_COUNTER, _COUNTER.pack(self._last_version))
        return staged

    def publish(self, group: str, staged: Mapping[TopicPartition, CommittedOffset]) -> None:
        """Make durable commits visible. A staged record older than what is
        visible (a later commit landed first) is dropped, so the newest wins."""
        offsets = self._groups.setdefault(group, {})
        for tp, record in staged.items():
            if self._in_flight.get((group, tp)) is record:
                del self._in_flight[(group, tp)]
            current = offsets.get(tp)
            if current is None or current.version < record.version:
                offsets[tp] = record

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
        await self.writer.submit(ops)
        self.publish(group, staged)

    async def delete(self, group: str, partitions: Iterable[TopicPartition] | None = None,
                     release: bool = True) -> int:
        """Delete some (or, with None, all) offsets of a group; returns how many.
        With ``release`` (an operator's deletion) the group stops holding
        retention where it was an important consumer.

        They leave memory when the deletion is in the WAL. Writes land in
        submission order, so a commit staged before this deletion is published
        (and then removed) first, and one staged after it survives it.
        """
        offsets = self._groups.get(group, {})
        doomed = list(offsets) if partitions is None else [tp for tp in partitions
                                                            if tp in offsets]
        # Only an important consumer leaves a marker (other groups hold nothing).
        release = release and self.is_important(group, None)
        if not doomed and not (partitions is None and release):
            return 0  # (a whole group without offsets may still hold: released below)
        ops = Ops()
        if partitions is None:
            prefix = keys.consumer_group_prefix(group)
            ops.delete_range(prefix, prefix + b"\xff")
            if release:
                ops.put(keys.released_key(group), b"")
        else:
            for topic, partition in doomed:
                ops.delete(keys.consumer_offset_key(group, topic, partition))
                if release and self.is_important(group, topic):
                    ops.put(keys.released_key(group, topic, partition), b"")
        releases: list[tuple[str, str | None, int]] = []
        if release:
            releases = [(group, None, 0)] if partitions is None else [
                (group, *tp) for tp in doomed if self.is_important(group, tp[0])]
        self._releasing.update(releases)
        newest_deleted = self._last_version
        await self.writer.submit(ops)
        for item in releases:
            if item in self._releasing:  # no commit was staged since
                self._releasing.discard(item)
                if item[1] is None:
                    self._released_groups.add(group)
                else:
                    self._released_partitions.add((group, item[1], item[2]))
        offsets = self._groups.get(group, {})
        for tp in doomed:
            record = offsets.get(tp)
            if record is not None and record.version <= newest_deleted:
                del offsets[tp]
        if not offsets:
            self._groups.pop(group, None)
        return len(doomed)

    def drop_topic(self, topic: str, ops: Ops) -> None:
        """Add the deletion of every group's offsets of a deleted topic to ``ops``
        (a topic re-created under the same name starts without them, as in Kafka)."""
        for group, offsets in list(self._groups.items()):
            for tp in [tp for tp in offsets if tp[0] == topic]:
                del offsets[tp]
                ops.delete(keys.consumer_offset_key(group, *tp))
            if not offsets:
                del self._groups[group]
        for released in [r for r in self._released_partitions if r[1] == topic]:
            self._released_partitions.discard(released)
            ops.delete(keys.released_key(*released))

