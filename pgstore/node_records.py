"""Node records (SCRAM credentials, ACLs) on PostgreSQL: the
``NodeRecordStore`` of the PostgreSQL engine (the embedded one:
``tablets/node_records.py``).

One ``node_records`` row per (kind, name) with an opaque value; the storage
layer does not know what the bytes mean. A kind's records are kept whole in
memory (read on every authentication or authorization, changed rarely); a
change of several records is one ``PgChange`` through the group-commit
writer, applied to memory once PostgreSQL committed it (in submission order),
never when it failed.

``change_now`` writes synchronously: only ``OfflinePgNodeRecords`` (the
security CLI, outside any event loop) has it. Online, every write goes
through the writer, so ``PgNodeRecords.change_now`` refuses.

Another gateway's changes reach this one's memory when it calls ``load``
again (the cluster's notification of a change is the cluster work's).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import asyncpg

from tablets.seam import NodeRecordKind

from .migrate import quoted
from .schema import DEFAULT_SCHEMA
from .writer import PgChange, PgWriter

# The kinds the seam names.
KINDS = ("acl", "scram")


def _check_kind(kind: NodeRecordKind) -> NodeRecordKind:
    if kind not in KINDS:
        raise ValueError(f"node record kind {kind!r}: one of {', '.join(KINDS)}")
    return kind


class _Statements:
    def __init__(self, schema: str) -> None:
        s = quoted(schema)
        self.load = f"SELECT name, value FROM {s}.node_records WHERE kind = $1"
        self.delete = (f"DELETE FROM {s}.node_records WHERE kind = $1 "
                       "AND name = ANY($2::bytea[])")
        self.put = (f"INSERT INTO {s}.node_records (kind, name, value) "
                    "SELECT $1, * FROM unnest($2::bytea[], $3::bytea[]) "
                    "ON CONFLICT (kind, name) DO UPDATE SET value = excluded.value")


class _Records:
    """What the online and the offline store share: memory and statements."""

    def __init__(self, schema: str, kind: NodeRecordKind) -> None:
        self.schema = schema
        self.kind = _check_kind(kind)
        self._sql = _Statements(schema)
        self.records: dict[bytes, bytes] = {}

    def get(self, name: bytes) -> bytes | None:
        return self.records.get(name)

    async def _read(self, conn: asyncpg.Connection) -> None:
        rows = await conn.fetch(self._sql.load, self.kind)
        self.records = {bytes(r["name"]): bytes(r["value"]) for r in rows}

    def _statements(self, puts: dict[bytes, bytes],
                    deletes: list[bytes]) -> list[tuple[str, tuple[object, ...]]]:
        """The change's statements: deletions first, then puts (a name both
        deleted and put ends up put, as with the embedded engine)."""
        out: list[tuple[str, tuple[object, ...]]] = []
        if deletes:
            out.append((self._sql.delete, (self.kind, deletes)))
        if puts:
            out.append((self._sql.put, (self.kind, list(puts), list(puts.values()))))
        return out

    def _applied(self, puts: dict[bytes, bytes], deletes: Iterable[bytes]) -> None:
        # A new dict, so a reader iterating ``records`` never sees it change.
        records = dict(self.records)
        for name in deletes:
            records.pop(name, None)
        records.update(puts)
        self.records = records


class PgNodeRecords(_Records):
    """One kind of node record of a running gateway."""

    def __init__(self, writer: PgWriter, schema: str, kind: NodeRecordKind) -> None:
        super().__init__(schema, kind)
        self.writer = writer

    async def load(self, conn: asyncpg.Connection) -> None:
        """Read every record of this kind (start-up, or again to see another
        gateway's changes)."""
        await self._read(conn)

    def stage(self, change: PgChange, puts: dict[bytes, bytes],
              deletes: Iterable[bytes] = ()) -> None:
        """Add the change to ``change``; memory follows once it is durable."""
        deletes = list(deletes)
        for sql, args in self._statements(puts, deletes):
            change.execute(sql, *args)
        change.on_durable(lambda: self._applied(puts, deletes))

    async def change(self, puts: dict[bytes, bytes], deletes: Iterable[bytes] = ()) -> None:
        """Write ``puts`` and delete ``deletes`` atomically; visible once committed."""
        change = self.writer.begin()
        self.stage(change, dict(puts), deletes)
        await self.writer.commit(change)

    def change_now(self, puts: dict[bytes, bytes], deletes: Iterable[bytes] = ()) -> None:
        """Only offline (``open_node_records``): a running gateway writes
        through its writer, without blocking the event loop."""
        raise RuntimeError("node records of a running gateway over PostgreSQL: use change() "
                           "(change_now is for the offline CLI: open_node_records)")


class OfflinePgNodeRecords(_Records):
    """One kind of node record, opened by the security CLI outside any event
    loop: its own connection and loop; ``change_now`` is one PostgreSQL
    transaction, committed when it returns. Gateways running over the same
    database see the change when they read the records again."""

    def __init__(self, dsn: str, schema: str, kind: NodeRecordKind) -> None:
        super().__init__(schema, kind)
        self._loop = asyncio.new_event_loop()
        try:
            self._conn: asyncpg.Connection = self._loop.run_until_complete(
                asyncpg.connect(dsn))
            self._loop.run_until_complete(self._read(self._conn))
        except BaseException:
            self._loop.close()
            raise

    def change_now(self, puts: dict[bytes, bytes], deletes: Iterable[bytes] = ()) -> None:
        """Write ``puts`` and delete ``deletes`` atomically, now."""
        deletes = list(deletes)
        statements = self._statements(puts, deletes)

        async def write() -> None:
            async with self._conn.transaction():
                for sql, args in statements:
                    await self._conn.execute(sql, *args)

        self._loop.run_until_complete(write())
        self._applied(puts, deletes)

    async def change(self, puts: dict[bytes, bytes], deletes: Iterable[bytes] = ()) -> None:
        raise RuntimeError("node records opened offline: use change_now()")

    def close(self) -> None:
        try:
            self._loop.run_until_complete(self._conn.close(timeout=5))
        finally:
            self._loop.close()


def open_node_records(dsn: str, kind: NodeRecordKind,
                      schema: str = DEFAULT_SCHEMA) -> OfflinePgNodeRecords:
    """One kind of node record ("acl", "scram") of a PostgreSQL store, for the
    security CLI; close it when done."""
    return OfflinePgNodeRecords(dsn, schema, kind)
