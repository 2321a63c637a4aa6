"""The leader rows of one table as a gateway last read them, and the SQL that
moves them (``pgstore.leadership`` runs it; the rules: its docstring and
docs/cluster-design.md, "Leadership, fencing and leases").

Every statement is a compare-and-set on the row's epoch, and bumps it:

- ``take_sql``: the rows whose leader is none, or a node whose lease is
  over by the database's clock, to this gateway while its own lease is alive;
- ``release_sql``: rows this gateway leads, to a live node;
- ``give_up_sql``: a clean stop, everything this incarnation leads back to
  no leader.

Each takes ``$1`` (this node id) and ``$2`` (its incarnation), the moves
their keys, the epochs read (and the targets) as arrays; each returns the
rows it changed, for ``apply``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg

from .migrate import quoted


@dataclass(frozen=True, slots=True)
class Lead:
    leader_node: int | None  # None: no leader
    epoch: int


class LeaderRows:
    """The leader rows of one table (``partitions`` by log id, or
    ``coordinator_slots`` by slot) as last read, and the statements that move them."""

    def __init__(self, schema: str, table: str, key: str, key_type: str) -> None:
        s = quoted(schema)
        self.name = table
        self.view: dict[int, Lead] = {}
        self.read_sql = f"SELECT {key} AS key, leader_node, leader_epoch FROM {s}.{table}"
        me_alive = (f"EXISTS (SELECT 1 FROM {s}.nodes me WHERE me.node_id = $1 "
                    f"AND me.incarnation = $2 AND me.lease_expires_at > now())")
        # Orphans only: no leader, or one whose lease is over by the database's clock.
        self.take_sql = f"""
            UPDATE {s}.{table} t SET leader_node = $1, leader_epoch = t.leader_epoch + 1
              FROM unnest($3::{key_type}[], $4::integer[]) AS c(key, seen)
             WHERE t.{key} = c.key AND t.leader_epoch = c.seen AND {me_alive}
               AND (t.leader_node IS NULL OR NOT EXISTS (
                    SELECT 1 FROM {s}.nodes n
                     WHERE n.node_id = t.leader_node AND n.lease_expires_at > now()))
            RETURNING t.{key} AS key, t.leader_node, t.leader_epoch"""
        # To a live node, from this one.
        self.release_sql = f"""
            UPDATE {s}.{table} t SET leader_node = c.target,
                   leader_epoch = t.leader_epoch + 1
              FROM unnest($3::{key_type}[], $4::integer[], $5::integer[]) AS c(key, seen, target)
             WHERE t.{key} = c.key AND t.leader_epoch = c.seen AND t.leader_node = $1
               AND {me_alive}
               AND EXISTS (SELECT 1 FROM {s}.nodes n
                            WHERE n.node_id = c.target AND n.lease_expires_at > now())
            RETURNING t.{key} AS key, t.leader_node, t.leader_epoch"""
        # A clean stop: everything this incarnation leads goes back to no leader.
        self.give_up_sql = f"""
            UPDATE {s}.{table} t SET leader_node = NULL, leader_epoch = t.leader_epoch + 1
             WHERE t.leader_node = $1 AND EXISTS (
                   SELECT 1 FROM {s}.nodes me WHERE me.node_id = $1 AND me.incarnation = $2)
            RETURNING t.{key} AS key, t.leader_node, t.leader_epoch"""

    def load(self, rows: Sequence[asyncpg.Record]) -> None:
        self.view = {int(r["key"]): _lead(r) for r in rows}

    def apply(self, rows: Sequence[asyncpg.Record]) -> None:
        for r in rows:
            self.view[int(r["key"])] = _lead(r)

    def led_by(self, node_id: int) -> dict[int, int]:
        return {key: lead.epoch for key, lead in self.view.items()
                if lead.leader_node == node_id}


def _lead(row: asyncpg.Record) -> Lead:
    node = row["leader_node"]
    return Lead(None if node is None else int(node), int(row["leader_epoch"]))
