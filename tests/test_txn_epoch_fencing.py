"""A fenced producer session cannot bump its way back (KIP-360 bumps and retries)."""

from __future__ import annotations

import asyncio

import pytest

from tablets import EngineSettings, StorageEngine
from txn import TransactionCoordinator
from txn.errors import ProducerFenced


def run(coro_fn, data_dir, clock):
    async def main():
        engine = StorageEngine(str(data_dir), EngineSettings())
        engine.start(asyncio.get_running_loop())
        try:
            coordinator = TransactionCoordinator(engine, clock=clock)
            coordinator.load()
            return await coro_fn(coordinator)
        finally:
            engine.close()

    return asyncio.run(main())


def test_a_session_fenced_by_a_new_one_cannot_bump_its_epoch(tmp_path):
    async def test(txns: TransactionCoordinator):
        zombie = await txns.init_producer_id("t", 60_000)
        successor = await txns.init_producer_id("t", 60_000)
        assert successor == (zombie[0], zombie[1] + 1)
        with pytest.raises(ProducerFenced):  # not "a retry of the bump": it asked none
            await txns.init_producer_id("t", 60_000, *zombie)
        bumped = await txns.init_producer_id("t", 60_000, *successor)  # KIP-360
        assert bumped == (zombie[0], zombie[1] + 2)
        assert await txns.init_producer_id("t", 60_000, *successor) == bumped  # its retry
        with pytest.raises(ProducerFenced):
            await txns.init_producer_id("t", 60_000, *zombie)

    run(test, tmp_path, lambda: 1_000)


def test_a_session_whose_transaction_timed_out_cannot_bump_its_epoch(tmp_path):
    now = [1_000]

    async def test(txns: TransactionCoordinator):
        session = await txns.init_producer_id("t", 5_000)
        await txns.add_offsets("t", *session, "group")
        now[0] += 6_000
        await txns.expire()
        assert txns.describe("t").epoch == session[1] + 1
        with pytest.raises(ProducerFenced):
            await txns.init_producer_id("t", 5_000, *session)

    run(test, tmp_path, lambda: now[0])
