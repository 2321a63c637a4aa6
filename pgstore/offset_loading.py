"""Committed offsets read back into memory: the reads of
``PgConsumerOffsets.load`` (start-up: every group) and ``load_group`` (one
group again, when this gateway gains its coordination or a compare-and-set
was refused), each in one read-only snapshot, and how the rows read become
records in memory (``take_rows``).

Versions follow commit order within one gateway (submission order is commit
order). Across gateways each has its own counter, so a version in memory is
this gateway's: a row another gateway committed, read again by
``load_group``, takes the next version of this gateway's counter, as if
committed when seen, and its database version is kept apart (the
``db_versions`` the caller owns) for the compare-and-set. A transaction's
*begin* version (this gateway's ``last_version`` when it began, as in the
embedded engine) is then comparable with every version in memory
(docs/cluster-design.md, "Offsets written by a commit that crosses
gateways").

What it needs of the offsets' memory is ``LoadTarget`` (``OffsetState``'s
loading methods).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

import asyncpg

from tablets.seam import CommittedOffset, TopicPartition

from .group_counters import GroupCounters
from .migrate import Connection
from .offset_statements import VERSION_COUNTER, WHOLE_GROUP, OffsetStatements, from_text

# (the read transaction's connection, the group read or None for every group)
LoadedHook = Callable[[Connection, "str | None"], Awaitable[None]]


class LoadTarget(Protocol):
    """What ``take_rows`` needs of the offsets in memory."""

    def versions_from(self, counter: int) -> None: ...

    def in_flight(self, group: str, tp: TopicPartition) -> CommittedOffset | None: ...

    def loaded(self, group: str, tp: TopicPartition, record: CommittedOffset) -> None: ...

    def loaded_release(self, group: str, tp: TopicPartition | None) -> None: ...

    def next_version(self) -> int: ...


async def read_all(conn: asyncpg.Connection, sql: OffsetStatements, counters: GroupCounters,
                   hook: LoadedHook | None,
                   ) -> tuple[int | None, list[asyncpg.Record], list[asyncpg.Record],
                              list[asyncpg.Record]]:
    """(the version counter's row value or None, every offset row, every
    release row, every generation row), in one snapshot; ``hook`` runs last
    in it."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        counter = await conn.fetchval(sql.load_counter, VERSION_COUNTER)
        rows = await conn.fetch(sql.load_offsets)
        released = await conn.fetch(sql.load_released)
        generations = await conn.fetch(counters.generations_sql)
        if hook is not None:
            await hook(conn, None)
    return counter, rows, released, generations


async def read_group(conn: Connection, sql: OffsetStatements, counters: GroupCounters,
                     group: str, hook: LoadedHook | None,
                     ) -> tuple[list[asyncpg.Record], list[asyncpg.Record], int]:
    """(the group's offset rows, its release rows, its stored generation), in
    one snapshot; ``hook`` runs last in it."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        rows = await conn.fetch(sql.load_group_offsets, group)
        released = await conn.fetch(sql.load_group_released, group)
        generation = await counters.generation(conn, group)
        if hook is not None:
            await hook(conn, group)
    return rows, released, generation


def take_rows(target: LoadTarget, db_versions: dict[tuple[str, TopicPartition], int],
              rows: list[asyncpg.Record], released: list[asyncpg.Record],
              known: dict[TopicPartition, tuple[int, CommittedOffset]] | None) -> None:
    """Take rows read; ``known``: with ``load_group``, the group's rows as
    memory had them (their database version and record): a row changed
    since takes a version of this gateway's (``db_versions`` keeps the
    row's own)."""
    target.versions_from(max((int(row["version"]) for row in rows), default=0))
    for row in rows:
        tp = (row["topic"], row["partition"])
        version = int(row["version"])
        seen = None if known is None else known.get(tp)
        if seen is not None and seen[0] == version:
            target.loaded(row["group_id"], tp, seen[1])
            if seen[1].version != version:
                db_versions[(row["group_id"], tp)] = version
            continue
        mine = target.in_flight(row["group_id"], tp)
        if known is not None and mine is not None and mine.version == version:
            # This gateway's own commit, landed and about to be published.
            target.loaded(row["group_id"], tp, mine)
            continue
        if known is not None:  # (load_group) committed elsewhere since
            db_versions[(row["group_id"], tp)] = version
            version = target.next_version()
        record = CommittedOffset(row["committed_offset"], row["leader_epoch"],
                                 from_text(row["metadata"]), row["commit_timestamp"],
                                 version,
                                 row["committer"], from_text(row["member"]))
        target.loaded(row["group_id"], tp, record)
    for row in released:
        tp = (row["topic"], row["partition"])
        target.loaded_release(row["group_id"], None if tp == WHOLE_GROUP else tp)
