"""The node's tail budget goes to the partitions that are read
(``tablets.tail_budget``): who holds what share after each event."""

from __future__ import annotations

import asyncio

from tablets.tail_budget import TailBudget
from testkit.tail_budget import reshared


class Holder:
    def __init__(self, name: str) -> None:
        self.name = name
        self.share = -1  # never set

    def set_tail_budget(self, nbytes: int) -> None:
        self.share = nbytes


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def shares(holders: list[Holder]) -> dict[str, int]:
    return {h.name: h.share for h in holders}


def test_shares_follow_reads_and_expire_after_the_window():
    holders = [Holder("a"), Holder("b"), Holder("c")]
    clock = Clock()
    budget = TailBudget(900, lambda: holders, window=60.0, clock=clock)
    budget.reshare()
    assert shares(holders) == {"a": 0, "b": 0, "c": 0}  # nobody reads: newest batch only
    budget.read(holders[0])
    assert shares(holders) == {"a": 900, "b": 0, "c": 0}
    clock.now += 30
    budget.read(holders[1])
    assert shares(holders) == {"a": 450, "b": 450, "c": 0}
    holders[1].share = -1
    budget.read(holders[1])  # read again within the window: no reshare
    assert holders[1].share == -1
    clock.now += 31  # a's last read 61 s ago, b's 31 s ago
    budget.sweep()
    assert shares(holders) == {"a": 0, "b": 900, "c": 0}
    assert budget.share(holders[0]) == 0 and budget.share(holders[1]) == 900
    clock.now += 60.5
    budget.sweep()
    assert shares(holders) == {"a": 0, "b": 0, "c": 0}


def test_a_holder_gone_from_the_catalog_gives_its_share_back():
    holders = [Holder("a"), Holder("b")]
    budget = TailBudget(1000, lambda: holders, clock=Clock())
    budget.read(holders[0])
    budget.read(holders[1])
    assert shares(holders) == {"a": 500, "b": 500}
    gone = holders.pop()
    budget.reshare()  # what the catalog calls when a topic is deleted
    assert shares(holders) == {"a": 1000}
    assert budget.share(gone) == 0


def test_the_sweep_timer_is_armed_while_anything_is_read():
    async def scenario() -> None:
        holders = [Holder("a")]
        budget = TailBudget(100, lambda: holders, window=0.2)
        assert budget._timer is None
        budget.read(holders[0])
        assert budget._timer is not None  # the premise: a sweep is due
        await reshared(budget)
        assert holders[0].share == 100
        loop = asyncio.get_running_loop()
        started = loop.time()
        while holders[0].share and loop.time() < started + 5:  # the window, then a sweep
            await asyncio.sleep(0.02)
        assert holders[0].share == 0
        assert loop.time() - started >= 0.2  # not before the window ended
        assert budget._timer is None  # nothing read: no timer left behind
        budget.read(holders[0])
        await reshared(budget)
        assert holders[0].share == 100
        timer = budget._timer
        budget.close()  # what the engines' close calls
        assert budget._timer is None and timer is not None and timer.cancelled()

    asyncio.run(scenario())


def test_first_reads_of_many_partitions_cost_one_pass_not_one_each():
    async def scenario() -> None:
        holders = [Holder(f"p{i}") for i in range(5000)]
        budget = TailBudget(5000 * 100, lambda: holders)
        budget.reshare()
        assert budget.reshares == 1
        for holder in holders:  # one Fetch reading them all for the first time
            budget.read(holder)
        assert budget.reshares == 1  # nothing yet: one pass is due
        await asyncio.sleep(0.05)
        assert budget.reshares == 2
        assert {h.share for h in holders} == {100}
        # A client reading one new partition per request: at most one pass per interval.
        late = [Holder(f"q{i}") for i in range(20)]
        holders.extend(late)
        loop = asyncio.get_running_loop()
        started = loop.time()
        for holder in late:
            budget.read(holder)
            await asyncio.sleep(0.01)
        assert budget.reshares == 2  # the interval since the last pass has not passed
        while budget._pending is not None and loop.time() < started + 5:
            await asyncio.sleep(0.02)
        assert budget.reshares == 3 and loop.time() - started >= 0.9
        assert {h.share for h in holders} == {5000 * 100 // 5020}
        budget.close()

    asyncio.run(scenario())
