"""A consumer group's two counters that must outlive its coordinator
(docs/cluster-design.md, "Leadership, fencing and leases"), read and moved
inside the caller's transaction on the caller's asyncpg connection.

    counters = GroupCounters(schema)
    generation = await counters.next_generation(conn, "my-group")   # JoinGroup's new one
    async with conn.transaction():
        version = await counters.next_offset_version(conn, "my-group")
        ...  # the offsets' rows, locked FOR UPDATE, checked, written with `version`

- **The generation** (``group_generations``). A group's coordinator moves
  when its slot's leader changes; the new one must go on from the last
  generation, never back, or KIP-447's fences and the offset-range check
  would take a zombie for a member. ``next_generation`` adds one and returns
  it; ``advance_generation`` raises the stored value to at least the one
  given (a coordinator that numbered a generation in memory); a trigger of
  the schema refuses any write that would lower it. The gateway's
  coordinator uses ``generation_after_sql`` (``pgstore.consumer_offsets``:
  one statement of a change fenced by the group's coordinator slot).
- **The offset version** (``group_offset_versions``). Offset commits are
  numbered, and the offset-range conflict check (``txn/conflicts.py``)
  compares those numbers, so they must follow commit order; a sequence's
  ``nextval`` does not (it is taken, not committed, in order). The counter is
  one row per group, moved by ``next_offset_version`` inside the committing
  transaction: the update locks the row until that transaction ends, so two
  transactions committing offsets of one group, through two gateways,
  serialise there, and the second gets the first's number plus one, and
  sees the first's offset rows. That is what makes "two gateways commit
  overlapping ranges: exactly one wins" hold.

A group with no row reads as generation 0 and offset version 0 (Kafka's
first generation after a JoinGroup is 1).
"""

from __future__ import annotations

from .migrate import Connection, quoted


class NotInTransaction(RuntimeError):
    """A counter that orders commits was moved outside a transaction: its
    row lock would end with the statement, ordering nothing."""


class GroupCounters:
    """The statements over one schema's counters (see the module's docstring)."""

    def __init__(self, schema: str) -> None:
        s = quoted(schema)
        self.schema = schema
        self._generation_sql = (f"SELECT generation FROM {s}.group_generations "
                                f"WHERE group_id = $1")
        self._next_generation_sql = f"""
            INSERT INTO {s}.group_generations AS g (group_id, generation) VALUES ($1, 1)
            ON CONFLICT (group_id) DO UPDATE SET generation = g.generation + 1
            RETURNING generation"""
        # A coordinator's next generation, as one statement of its change
        # (``pgstore.consumer_offsets``: fenced by its slot in the same
        # transaction): above both the stored one and the one it last gave
        # ($2 is that plus one), whichever is higher.
        self.generation_after_sql = f"""
            INSERT INTO {s}.group_generations AS g (group_id, generation) VALUES ($1, $2)
            ON CONFLICT (group_id) DO UPDATE
               SET generation = greatest(g.generation + 1, EXCLUDED.generation)
            RETURNING generation"""
        self.generations_sql = f"SELECT group_id, generation FROM {s}.group_generations"
        self._advance_generation_sql = f"""
            INSERT INTO {s}.group_generations AS g (group_id, generation) VALUES ($1, $2)
            ON CONFLICT (group_id) DO UPDATE
               SET generation = greatest(g.generation, EXCLUDED.generation)
            RETURNING generation"""
        self._version_sql = (f"SELECT version FROM {s}.group_offset_versions "
                             f"WHERE group_id = $1")
        self._next_version_sql = f"""
            INSERT INTO {s}.group_offset_versions AS v (group_id, version) VALUES ($1, 1)
            ON CONFLICT (group_id) DO UPDATE SET version = v.version + 1
            RETURNING version"""

    # ------------------------------------------------------------ generations
    async def generation(self, conn: Connection, group_id: str) -> int:
        """The group's stored generation (0: none yet)."""
        value = await conn.fetchval(self._generation_sql, group_id)
        return 0 if value is None else int(value)

    async def next_generation(self, conn: Connection, group_id: str) -> int:
        """One more than the stored generation (1 for a new group), stored and
        returned. In a transaction, the row stays locked until it ends."""
        return int(await conn.fetchval(self._next_generation_sql, group_id))

    async def advance_generation(self, conn: Connection, group_id: str, at_least: int) -> int:
        """Raise the stored generation to ``at_least`` unless it is higher
        already; the generation stored now."""
        if at_least < 0:
            raise ValueError(f"group {group_id!r}: generation {at_least} is negative")
        return int(await conn.fetchval(self._advance_generation_sql, group_id, at_least))

    # ------------------------------------------------------------ offset versions
    async def offset_version(self, conn: Connection, group_id: str) -> int:
        """The number of the group's last committed offset commit (0: none yet),
        without locking anything."""
        value = await conn.fetchval(self._version_sql, group_id)
        return 0 if value is None else int(value)

    async def next_offset_version(self, conn: Connection, group_id: str) -> int:
        """The number of the offset commit this transaction makes: one more
        than the last committed one. The counter row stays locked until the
        caller's transaction ends, so a concurrent commit of the same group
        waits here and then gets the next number. Raises ``NotInTransaction``
        outside a transaction."""
        if not conn.is_in_transaction():
            raise NotInTransaction(
                f"group {group_id!r}: the offset version is moved inside the transaction "
                "that commits the offsets (its row lock orders the commits)")
        return int(await conn.fetchval(self._next_version_sql, group_id))
