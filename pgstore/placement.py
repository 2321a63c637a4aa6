"""Where each key goes, computed without I/O: the slot of a group or
transactional id, and the plan that balances leaders over the live gateways.
``pgstore.leadership`` reads the rows, calls ``plan`` and carries out its own
part of it (``pgstore.leader_rows``: the statements that move the rows).

**Coordinator slots.** A group or transactional id is placed by
``coordinator_slot``: Java's ``String.hashCode`` of the id, made
non-negative as Kafka's ``Utils.abs`` does, modulo ``COORDINATOR_SLOTS``
(50). That is how Kafka picks the partition of ``__consumer_offsets`` (and
of ``__transaction_state``) for a key, so the slot number is the partition
Kafka would use. The hash is stable: fixed by Java's definition, the same
in every process and version (unlike Python's ``hash``). Groups and
transactional ids share the one set of slots.

**The plan** (``plan``): the same answer on every gateway that read the same
rows; see its docstring for the rule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .schema import COORDINATOR_SLOTS

_INT32 = 1 << 32


# ---------------------------------------------------------------- placement by key
def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode``: s[0]*31^(n-1) + ... + s[n-1] over UTF-16
    code units, in 32-bit two's complement."""
    h = 0
    units = text.encode("utf-16-be")
    for i in range(0, len(units), 2):
        h = (31 * h + (units[i] << 8 | units[i + 1])) % _INT32
    return h - _INT32 if h >= 1 << 31 else h


def coordinator_slot(key: str, slots: int = COORDINATOR_SLOTS) -> int:
    """The slot of a group or transactional id: Kafka's
    ``Utils.abs(key.hashCode) % slots`` (``abs`` of Integer.MIN_VALUE is 0)."""
    h = java_string_hash(key)
    return (0 if h == -(1 << 31) else abs(h)) % slots


# ---------------------------------------------------------------- the plan
@dataclass(frozen=True, slots=True)
class Move:
    key: int
    from_node: int | None  # None, a node not live (a take), or a live node (a release)
    to_node: int


def plan(live: Sequence[int], leaders: Mapping[int, int | None]) -> list[Move]:
    """The moves that balance ``leaders`` (key -> leading node) over ``live``:
    every key whose leader is not live goes to a live node; keys move
    between live nodes only while counts differ by more than one. The same
    input gives the same moves on every gateway.

    Each node's quota is len(keys) // len(live), plus one for the
    len(keys) % len(live) nodes that hold the most now (ties: lower node id),
    so the fewest keys move. Nodes over quota give up their highest keys;
    nodes under it get the orphans (lowest key first), then the keys given
    up, one at a time in node id order, round after round."""
    nodes = sorted(set(live))
    if not nodes:
        return []
    held: dict[int, list[int]] = {n: [] for n in nodes}
    orphans: list[int] = []
    for key in sorted(leaders):
        leader = leaders[key]
        if leader is not None and leader in held:
            held[leader].append(key)
        else:
            orphans.append(key)
    base, extra = divmod(len(leaders), len(nodes))
    by_load = sorted(nodes, key=lambda n: (-len(held[n]), n))
    quota = {n: base + (1 if i < extra else 0) for i, n in enumerate(by_load)}
    supply: list[tuple[int, int | None]] = [(key, leaders[key]) for key in orphans]
    for n in nodes:
        excess = len(held[n]) - quota[n]
        if excess > 0:
            supply += [(key, n) for key in held[n][-excess:]]
    # One key per node under quota in turn (not each node's whole deficit at
    # once), so that a newcomer does not get every partition of a topic
    # created at the same time.
    deficit = {n: quota[n] - len(held[n]) for n in nodes if quota[n] > len(held[n])}
    moves: list[Move] = []
    given = iter(supply)
    while deficit:
        for n in list(deficit):
            key, source = next(given)
            moves.append(Move(key, source, n))
            deficit[n] -= 1
            if not deficit[n]:
                del deficit[n]
    return moves
