"""Waiting for the node's tail budget in tests (``tablets.tail_budget``)."""

from __future__ import annotations

import asyncio

from tablets.tail_budget import TailBudget


async def reshared(budget: TailBudget) -> None:
    """Until the reshare that first reads asked for has run; the next ones run
    at once too (no interval between them)."""
    budget.reshare_interval = 0
    for _ in range(500):
        if budget._pending is None:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the tail budget's reshare never ran")
