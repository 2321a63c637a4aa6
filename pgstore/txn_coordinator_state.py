"""The transaction coordinator's own state on PostgreSQL, in memory as
durable: what ``pgstore.txn_storage`` answers the seam's ``counter`` /
``set_counter``, ``txn_states`` / ``put_txn_state`` / ``delete_txn_state``
and ``txn_partitions`` / ``put_txn_partition`` / ``delete_txn_partition``
with, and how it takes the rows ``load`` and ``load_ids`` read.

- **Counters** (producer ids, transaction instances) are ``counters`` rows,
  set as a compare-and-set from the value this gateway last set or loaded:
  two gateways taking one block of ids from one view cannot both land.
- **The coordinator's state**: ``txn_states`` (one row per transactional id)
  and ``txn_partitions`` (one per partition of an open transaction), loaded
  at start-up and kept in memory as each change lands.

In a cluster, every change of an id's state begins with the fence of the
id's coordinator slot (``txn_slots.fence_coordinator``), whose holder is
read at each write from ``SlotHolding`` (the storage).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from uuid import UUID

from asyncpg import Record

from tablets.errors import CounterMoved
from tablets.seam import AtomicChange, TopicPartition

from .txn_publication import as_txn_change
from .txn_slots import SlotHolding, fence_coordinator
from .txn_statements import TxnStatements


class CoordinatorState:
    """The counters, ``txn_states`` and ``txn_partitions`` of this gateway's
    coordinator: read from memory, written through the caller's change."""

    def __init__(self, sql: TxnStatements, slots: SlotHolding) -> None:
        self._sql = sql
        self._slots = slots
        # In memory, as durable (the counters: as last staged, for the
        # compare-and-set of the next).
        self._counters: dict[str, int] = {}
        self._states: dict[str, bytes] = {}
        self._txn_partitions: dict[tuple[str, int], dict[tuple[UUID, int], str]] = {}

    # ------------------------------------------------------------ loading
    def loaded(self, counters: Sequence[Record], states: Sequence[Record],
               partitions: Sequence[Record]) -> None:
        """Take what ``load`` read (start-up): it replaces everything."""
        self._counters = {row["name"]: int(row["value"]) for row in counters}
        self._states = {}
        self._txn_partitions = {}
        self._take(states, partitions)

    def reloaded(self, keep: Callable[[str], bool], counters: Sequence[Record],
                 states: Sequence[Record], partitions: Sequence[Record]) -> None:
        """Take what ``load_ids`` read of the ids ``keep`` selects: it replaces
        what memory held of them."""
        for row in counters:  # never back: a change of this gateway may be in flight
            name, value = row["name"], int(row["value"])
            self._counters[name] = max(self._counters.get(name, value), value)
        for transactional_id in [t for t in self._states if keep(t)]:
            del self._states[transactional_id]  # deleted (expired) by another gateway
        for key in [k for k in self._txn_partitions if keep(k[0])]:
            del self._txn_partitions[key]
        self._take(states, partitions)

    def _take(self, states: Sequence[Record], partitions: Sequence[Record]) -> None:
        self._states.update(
            (row["transactional_id"], bytes(row["state"])) for row in states)
        for row in partitions:
            key = (row["transactional_id"], int(row["instance"]))
            self._txn_partitions.setdefault(key, {})[(row["topic_id"], row["partition"])] = (
                row["topic"])

    # ------------------------------------------------------------ counters
    def counter(self, name: str) -> int | None:
        return self._counters.get(name)

    def set_counter(self, change: AtomicChange, name: str, value: int) -> None:
        expected = self._counters.get(name)
        pg = as_txn_change(change)
        # The row as the database has it, read first (and locked): when another
        # gateway moved it, the compare-and-set below refuses this change, and
        # the next one starts from what was read here, so a lagging gateway
        # loses one attempt, not one per value the other took.
        seen: list[int] = []
        pg.fetch(self._sql.read_counter, name,
                 into=lambda rows: seen.extend(int(row["value"]) for row in rows))
        pg.fence(self._sql.counter, name, value, expected, refused=lambda: (
            CounterMoved(f"counter {name}: not at {expected} any more (another gateway "
                         f"set it); {value} not written")))
        self._counters[name] = value

        def failed() -> None:  # not written (in doubt: the next set is refused)
            if self._counters.get(name) == value:
                newest = max([*seen, *([] if expected is None else [expected])], default=None)
                if newest is None:
                    self._counters.pop(name, None)
                else:
                    self._counters[name] = newest

        pg.on_failure(failed)

    # ------------------------------------------------------------ states
    def txn_states(self) -> Iterator[tuple[str, bytes]]:
        yield from list(self._states.items())

    def put_txn_state(self, change: AtomicChange, transactional_id: str, value: bytes) -> None:
        pg = as_txn_change(change)
        fence_coordinator(pg, self._sql, self._slots.slot_holder, transactional_id)
        pg.execute(self._sql.put_state, transactional_id, value)
        pg.on_durable(lambda: self._states.__setitem__(transactional_id, value))

    def delete_txn_state(self, change: AtomicChange, transactional_id: str) -> None:
        pg = as_txn_change(change)
        fence_coordinator(pg, self._sql, self._slots.slot_holder, transactional_id)
        pg.execute(self._sql.delete_state, transactional_id)

        def durable() -> None:
            self._states.pop(transactional_id, None)

        pg.on_durable(durable)

    # ------------------------------------------------------------ partitions
    def txn_partitions(self, transactional_id: str,
                       instance: int) -> Iterator[tuple[TopicPartition, UUID]]:
        rows = self._txn_partitions.get((transactional_id, instance), {})
        for (topic_id, partition), topic in sorted(rows.items(), key=lambda r: (r[1], r[0][1])):
            yield (topic, partition), topic_id

    def put_txn_partition(self, change: AtomicChange, transactional_id: str, instance: int,
                          tp: TopicPartition, topic_id: UUID) -> None:
        pg = as_txn_change(change)
        fence_coordinator(pg, self._sql, self._slots.slot_holder, transactional_id)
        pg.execute(self._sql.put_partition, transactional_id, instance, topic_id, tp[1], tp[0])

        def durable() -> None:
            self._txn_partitions.setdefault((transactional_id, instance), {})[
                (topic_id, tp[1])] = tp[0]

        pg.on_durable(durable)

    def delete_txn_partition(self, change: AtomicChange, transactional_id: str, instance: int,
                             tp: TopicPartition, topic_id: UUID) -> None:
        pg = as_txn_change(change)
        fence_coordinator(pg, self._sql, self._slots.slot_holder, transactional_id)
        pg.execute(self._sql.delete_partition, transactional_id, instance, topic_id, tp[1])

        def durable() -> None:
            key = (transactional_id, instance)
            rows = self._txn_partitions.get(key, {})
            rows.pop((topic_id, tp[1]), None)
            if not rows:
                self._txn_partitions.pop(key, None)

        pg.on_durable(durable)
