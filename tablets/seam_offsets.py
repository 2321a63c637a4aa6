"""The storage seam (``tablets.seam``), its node-wide records: committed
consumer offsets and node records.

``ConsumerOffsetStore`` -- Kafka's __consumer_offsets: commit (``OffsetCommit``
  in, ``CommittedOffset`` kept), fetch, delete, a transaction's offsets
  published once its commit is durable, and the groups' generations.

``NodeRecordStore`` -- small node-wide records of one kind
  (``NodeRecordKind``: ACLs, SCRAM credentials), whole in memory, changed
  atomically; ``OfflineNodeRecordStore`` the same opened on a stopped
  gateway's data directory (the security CLI).

Callers import them from ``tablets.seam``, the seam's one public entry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class OffsetCommit:
    """What a client asks to commit for one partition."""

    offset: int
    leader_epoch: int = -1
    metadata: str = ""


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp: int  # ms since the epoch
    version: int
    # The transactional id whose transaction committed it ("" for OffsetCommit):
    # the offset-range check lets a transaction re-commit its own offset.
    committer: str = ""
    # Who committed it, as the caller names it (the gateway: the group member
    # and its generation, of a plain commit or of a transaction's member-fenced
    # TxnOffsetCommit); "" when unknown.
    # The embedded engine keeps it in memory only: a restart forgets it, which
    # makes the conflict checks stricter, never looser (PostgreSQL stores it,
    # for the gateways that read the row).
    member: str = ""


class ConsumerOffsetStore(Protocol):
    """Committed consumer offsets (Kafka's __consumer_offsets)."""

    is_important: Callable[[str, str | None], bool]

    def groups(self) -> list[str]: ...
    def has_offsets(self, group: str) -> bool: ...
    def committed(self, group: str, topic: str, partition: int) -> CommittedOffset | None: ...
    def group_offsets(self, group: str) -> dict[TopicPartition, CommittedOffset]: ...
    def latest(self, group: str, topic: str, partition: int) -> CommittedOffset | None: ...
    @property
    def last_version(self) -> int: ...
    def version(self, group: str, topic: str, partition: int) -> int: ...

    async def commit(
        self, group: str, commits: Mapping[TopicPartition, OffsetCommit], now_ms: int,
        member: str = "",
    ) -> None:
        """Commit offsets (OffsetCommit); visible and acknowledged once durable."""
        ...

    async def delete(self, group: str, partitions: Iterable[TopicPartition] | None = None,
                     release: bool = True) -> int:
        """Delete some (None: all) offsets of a group; returns how many."""
        ...

    def publish(self, group: str, staged: Mapping[TopicPartition, CommittedOffset]) -> None: ...

    # A group's generation. An engine shared by several gateways persists it,
    # so that it never goes back when the group's coordinator moves
    # (``persists_generations``): ``generation`` is the stored one (read at
    # start-up and when the coordinator gains the group's slot), and
    # ``next_generation`` stores a new one, above ``after`` and the stored one,
    # before JoinGroup answers with it. The embedded engine keeps none: 0, and
    # ``after + 1`` without a write (the generation restarts with the process).
    @property
    def persists_generations(self) -> bool: ...
    def generation(self, group: str) -> int: ...
    async def next_generation(self, group: str, after: int) -> int: ...


NodeRecordKind = str  # "acl" or "scram"


class NodeRecordStore(Protocol):
    """Records of one kind (ACLs, SCRAM credentials): name -> opaque value."""

    @property
    def records(self) -> Mapping[bytes, bytes]: ...
    def get(self, name: bytes) -> bytes | None: ...

    async def change(self, puts: dict[bytes, bytes], deletes: Iterable[bytes] = ()) -> None:
        """Write ``puts`` and delete ``deletes`` atomically."""
        ...

    def change_now(self, puts: dict[bytes, bytes], deletes: Iterable[bytes] = ()) -> None:
        """The same, synchronously: only opened offline (``open_node_records``)."""
        ...


class OfflineNodeRecordStore(NodeRecordStore, Protocol):
    """The records of one kind of a stopped gateway's data directory (the
    security CLI): ``tablets.open_node_records``."""

    def close(self) -> None: ...
