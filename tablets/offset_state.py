"""Committed consumer offsets in memory: what every engine's offset store
keeps and how it changes, whatever persists it.

The embedded engine (``tablets/consumer_offsets.py``, RocksDB keys) and the
PostgreSQL one (``pgstore/consumer_offsets.py``, rows) both hold every
committed offset in memory, loaded at start-up, and answer every read from
it. They differ only in how a change is written. This module is that shared
part, engine-free (it imports only the seam):

- **visible** offsets: group -> (topic, partition) -> ``CommittedOffset``,
  durable ones only, so nobody resumes from an offset a crash could lose;
- **versions**, taken from one counter in call order when a commit is
  staged (``take``), so two commits staged one after the other get
  increasing versions whatever order they land in; ``txn/conflicts.py``
  compares them;
- **in flight**: commits staged but not yet durable; the newest wins in
  ``latest``, what a conflict check compares with;
- **released** markers of important consumers (``tablets/important.py``):
  a group (or partition) whose offsets an operator deleted holds no
  retention until it commits again; a release not yet durable is
  *releasing*, and a commit staged meanwhile cancels it (it lands after the
  release, so it wins).

An engine stages a commit with ``take`` (and writes what it returns),
calls ``publish`` once the write is durable or ``forget`` when it failed; a
deletion is ``plan_delete`` then, once durable, ``deleted``.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass

from .seam import CommittedOffset, OffsetCommit, TopicPartition

# (group, topic or None for the whole group, partition): a release.
Release = tuple[str, str | None, int]


@dataclass(frozen=True, slots=True)
class Staged:
    """A commit taken by ``take``: what to write, and what it un-releases."""

    offsets: dict[TopicPartition, CommittedOffset]
    unrelease_group: bool  # delete the whole group's released marker
    unrelease: list[TopicPartition]  # delete these partitions' markers


@dataclass(frozen=True, slots=True)
class Deletion:
    """A deletion planned by ``plan_delete``: the offsets it removes, the
    markers it leaves, and the newest version it covers."""

    group: str
    whole_group: bool
    doomed: list[TopicPartition]
    releases: list[Release]
    newest_deleted: int


class OffsetState:
    def __init__(self) -> None:
        # Visible (durable) offsets: group -> (topic, partition) -> offset.
        self._groups: dict[str, dict[TopicPartition, CommittedOffset]] = {}
        self._last_version = 0
        self._in_flight: dict[tuple[str, TopicPartition], CommittedOffset] = {}
        self._released_groups: set[str] = set()
        self._released_partitions: set[tuple[str, str, int]] = set()
        self._releasing: set[Release] = set()
        # Whether a group is an important consumer of a topic (None: of any;
        # set by the engine, which knows the topics' configs): offset expiry
        # spares them, and only their deletion leaves a released marker.
        self.is_important: Callable[[str, str | None], bool] = lambda group, topic: False

    # ------------------------------------------------------------ loading
    def clear(self) -> None:
        self._groups.clear()
        self._released_groups.clear()
        self._released_partitions.clear()

    def loaded(self, group: str, tp: TopicPartition, record: CommittedOffset) -> None:
        """One offset read at start-up; the counter rises above its version."""
        self._groups.setdefault(group, {})[tp] = record
        self._last_version = max(self._last_version, record.version)

    def loaded_release(self, group: str, tp: TopicPartition | None) -> None:
        """One released marker read at start-up (None: the whole group)."""
        if tp is None:
            self._released_groups.add(group)
        else:
            self._released_partitions.add((group, *tp))

    def next_version(self) -> int:
        """Take a version (an offset this gateway learns of, as if committed now)."""
        self._last_version += 1
        return self._last_version

    def versions_from(self, counter: int) -> None:
        """The persisted counter: versions are never reused."""
        self._last_version = max(self._last_version, counter)

    def forget_group(self, group: str) -> None:
        """Drop a group's visible offsets and markers (before reading it again)."""
        self._groups.pop(group, None)
        self._released_groups.discard(group)
        self._released_partitions -= {r for r in self._released_partitions if r[0] == group}

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

    def in_flight(self, group: str, tp: TopicPartition) -> CommittedOffset | None:
        """The newest commit of a partition staged and not yet durable, if any."""
        return self._in_flight.get((group, tp))

    @property
    def last_version(self) -> int:
        """The newest version any commit took: versions after it are newer commits."""
        return self._last_version

    def version(self, group: str, topic: str, partition: int) -> int:
        """The version of a partition's committed offset; 0 when there is none."""
        committed = self.committed(group, topic, partition)
        return committed.version if committed else 0

    # ------------------------------------------------------------ committing
    def take(self, group: str, commits: Mapping[TopicPartition, OffsetCommit], now_ms: int,
             committer: str = "", members: Mapping[TopicPartition, str] | None = None,
             ) -> Staged:
        """Take versions for a commit (in flight from now on) and clear the
        releases it ends: a commit makes a deleted group whole again."""
        unrelease_group = group in self._released_groups or (group, None, 0) in self._releasing
        if unrelease_group:
            self._released_groups.discard(group)
            self._releasing.discard((group, None, 0))
        unrelease: list[TopicPartition] = []
        staged: dict[TopicPartition, CommittedOffset] = {}
        for (topic, partition), commit in commits.items():
            if ((group, topic, partition) in self._released_partitions
                    or (group, topic, partition) in self._releasing):
                self._released_partitions.discard((group, topic, partition))
                self._releasing.discard((group, topic, partition))
                unrelease.append((topic, partition))
            self._last_version += 1
            record = CommittedOffset(commit.offset, commit.leader_epoch, commit.metadata, now_ms,
                                     self._last_version, committer,
                                     (members or {}).get((topic, partition), ""))
            staged[(topic, partition)] = record
            self._in_flight[(group, (topic, partition))] = record
        return Staged(staged, unrelease_group, unrelease)

    def publish(self, group: str, staged: Mapping[TopicPartition, CommittedOffset],
                overwrote: Container[TopicPartition] = ()) -> None:
        """Make durable commits visible. A staged record older than what is
        visible (a later commit landed first) is dropped, so the newest wins;
        except over what it is known to have ``overwrote`` (a row another
        gateway committed, which this commit replaced)."""
        offsets = self._groups.setdefault(group, {})
        for tp, record in staged.items():
            if self._in_flight.get((group, tp)) is record:
                del self._in_flight[(group, tp)]
            current = offsets.get(tp)
            if current is None or current.version < record.version or tp in overwrote:
                offsets[tp] = record
        if not offsets:
            del self._groups[group]

    def forget(self, group: str, staged: Mapping[TopicPartition, CommittedOffset]) -> None:
        """A staged commit that failed: ``latest`` stops counting it. (A release
        it cleared stays cleared in memory until a restart reads the marker
        again: the group then retains more, never less.)"""
        for tp, record in staged.items():
            if self._in_flight.get((group, tp)) is record:
                del self._in_flight[(group, tp)]

    # ------------------------------------------------------------ deleting
    def plan_delete(self, group: str, partitions: Iterable[TopicPartition] | None,
                    release: bool) -> Deletion | None:
        """What deleting some (None: all) of a group's offsets removes; None
        when nothing. With ``release`` (an operator's deletion) an important
        group leaves released markers; they are *releasing* from now on."""
        offsets = self._groups.get(group, {})
        doomed = list(offsets) if partitions is None else [tp for tp in partitions
                                                            if tp in offsets]
        # Only an important consumer leaves a marker (other groups hold nothing).
        release = release and self.is_important(group, None)
        if not doomed and not (partitions is None and release):
            return None  # (a whole group without offsets may still hold: released below)
        releases: list[Release] = []
        if release:
            releases = [(group, None, 0)] if partitions is None else [
                (group, *tp) for tp in doomed if self.is_important(group, tp[0])]
        self._releasing.update(releases)
        return Deletion(group, partitions is None, doomed, releases, self._last_version)

    def deleted(self, deletion: Deletion) -> None:
        """The deletion is durable. Changes land in submission order, so a
        commit staged before it was published (and is removed now: its version
        is at or below the newest the deletion covers) and one staged after it
        survives it."""
        group = deletion.group
        for item in deletion.releases:
            if item in self._releasing:  # no commit was staged since
                self._releasing.discard(item)
                if item[1] is None:
                    self._released_groups.add(group)
                else:
                    self._released_partitions.add((group, item[1], item[2]))
        remaining = self._groups.get(group, {})
        gone = list(remaining) if deletion.whole_group else deletion.doomed
        for tp in gone:
            record = remaining.get(tp)
            if record is not None and record.version <= deletion.newest_deleted:
                del remaining[tp]
        if not remaining:
            self._groups.pop(group, None)

    def not_deleted(self, deletion: Deletion) -> None:
        """The deletion failed: its markers are not releasing any more."""
        self._releasing.difference_update(deletion.releases)

    def drop_topic_offsets(self, topic: str) -> tuple[list[tuple[str, TopicPartition]],
                                                      list[tuple[str, str, int]]]:
        """Forget every group's offsets and released markers of a deleted topic
        (a topic re-created under the same name starts without them, as in
        Kafka); returns the offsets, (group, partition), and the markers,
        (group, topic, partition), dropped."""
        offsets_dropped: list[tuple[str, TopicPartition]] = []
        for group, offsets in list(self._groups.items()):
            for tp in [tp for tp in offsets if tp[0] == topic]:
                del offsets[tp]
                offsets_dropped.append((group, tp))
            if not offsets:
                del self._groups[group]
        markers = [r for r in self._released_partitions if r[1] == topic]
        self._released_partitions.difference_update(markers)
        return offsets_dropped, markers
