"""No request holds the event loop for long, whatever the size of its arrays.

One event loop serves every client of every listener, so a request whose
cost grows with its arrays would stall them all while it runs. That cost is
bounded at each stage:

- decoding: ``gateway.request.max.array.items`` caps the array items of one
  request body (body_bounds.py, before kio allocates anything); kio's native
  reader, which holds the interpreter while it runs, then takes some tens of
  milliseconds at most;
- handlers: loops over a request's items run through :func:`sliced`, which
  hands the loop back every ``SLICE_SECONDS``;
- encoding: a response of more than ``LARGE_RESPONSE_ITEMS`` array items is
  encoded, and its error codes counted, on a worker thread (:func:`encode`):
  kio's writer is pure Python, which the interpreter interleaves with the
  loop every few milliseconds (``sys.getswitchinterval``). Other pure work on
  a large answer (Fetch's own encoding, sorting ACLs) goes there too
  (:func:`off_loop`). Every answer is written as buffers of about 64 KiB
  (``codec.encode_response``).

Measured with each API at 50,000 items (tests/test_big_requests.py): an
ApiVersions round trip on another connection takes 50-250 ms meanwhile on a
shared 2-core machine, where it took up to 22 s for 3,000,000 partitions before.
What remains is mostly kio's decoding and the garbage collector's full
collections (server.py freezes what startup made to keep these short).
"""

from __future__ import annotations

import asyncio
import time
import typing
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields, is_dataclass
from functools import cache
from typing import Any, TypeVar

from tablets.seam import FileRegion

from .codec import EncodedBody, encode_response
from .metrics import Metrics, error_counts

# Handler loops yield to other clients at least this often.
SLICE_SECONDS = 0.01
# Items between two looks at the clock in sliced().
_CHECK_EVERY = 32
# Responses with more array items (or chunks) than this are encoded off the loop.
LARGE_RESPONSE_ITEMS = 2000

T = TypeVar("T")
R = TypeVar("R")
_executor: ThreadPoolExecutor | None = None


async def sliced(items: Iterable[T]) -> AsyncIterator[T]:
    """``items``, handing the loop back every ``SLICE_SECONDS`` of the caller's work."""
    deadline = time.perf_counter() + SLICE_SECONDS
    countdown = _CHECK_EVERY
    for item in items:
        yield item
        countdown -= 1
        if not countdown:
            countdown = _CHECK_EVERY
            if time.perf_counter() >= deadline:
                await asyncio.sleep(0)
                deadline = time.perf_counter() + SLICE_SECONDS


class Slices:
    """:func:`sliced`'s check for a loop written out by hand, on a hot path where an
    async generator per loop (its first-iteration hook, a step per item) costs more
    than the loop's own work::

        slices = Slices()
        for item in items:
            ...
            if slices.due():
                await slices.pause()
    """

    __slots__ = ("countdown", "deadline")

    def __init__(self) -> None:
        self.deadline = time.perf_counter() + SLICE_SECONDS
        self.countdown = _CHECK_EVERY

    def due(self) -> bool:
        """After each item: whether the loop should hand the loop back now."""
        self.countdown -= 1
        if self.countdown:
            return False
        self.countdown = _CHECK_EVERY
        return time.perf_counter() >= self.deadline

    async def pause(self) -> None:
        await asyncio.sleep(0)
        self.deadline = time.perf_counter() + SLICE_SECONDS


def never_yields(items: int) -> bool:
    """Whether a loop of ``items`` items checked by :class:`Slices` (or :func:`sliced`)
    runs through without handing the loop back: it first looks at the clock
    after ``_CHECK_EVERY`` items."""
    return items <= _CHECK_EVERY


async def off_loop(large: bool, function: Callable[..., R], *args: Any) -> R:
    """``function(*args)``, on the worker thread if ``large``: pure work over
    data nothing else changes meanwhile."""
    if not large:
        return function(*args)
    return await asyncio.get_running_loop().run_in_executor(_worker(), function, *args)


def _worker() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kafka-gateway-encode")
    return _executor


async def encode(metrics: Metrics, api: str, api_key: int, correlation_id: int,
                 body: Any) -> list[bytes | bytearray | FileRegion]:
    """The response's buffers, with its error codes counted in ``metrics``;
    a large one is encoded on the worker thread."""
    chunks = encode_small(metrics, api, api_key, correlation_id, body)
    if chunks is not None:
        return chunks
    chunks, counts = await asyncio.get_running_loop().run_in_executor(
        _worker(), _encode_counted, api, api_key, correlation_id, body)
    for key, count in counts.items():  # the counters belong to the loop's thread
        metrics.response_errors[key] += count
    return chunks


def encode_small(metrics: Metrics, api: str, api_key: int, correlation_id: int,
                 body: Any) -> list[bytes | bytearray | FileRegion] | None:
    """:func:`encode` without a coroutine, for a response small enough to encode on
    the loop (every Produce answer on the hot path); None for a large one."""
    if isinstance(body, EncodedBody):
        # Encoded by its handler, which counted its errors (a kio walk finds none in it).
        if len(body.chunks) > LARGE_RESPONSE_ITEMS:
            return None
    elif is_large(body):
        return None
    else:
        metrics.count_errors(api, body)
    return encode_response(api_key, correlation_id, body)


def _encode_counted(api: str, api_key: int, correlation_id: int,
                    body: Any) -> tuple[list[bytes | bytearray | FileRegion],
                                        Counter[tuple[str, str]]]:
    return encode_response(api_key, correlation_id, body), error_counts(api, body)


def is_large(body: Any) -> bool:
    """Whether ``body`` has more than ``LARGE_RESPONSE_ITEMS`` array items
    (looking at no more than that many)."""
    if isinstance(body, EncodedBody):
        return len(body.chunks) > LARGE_RESPONSE_ITEMS
    budget = LARGE_RESPONSE_ITEMS
    stack = [body]
    while stack:
        entity = stack.pop()
        for name in _array_fields(type(entity)):
            items = getattr(entity, name)
            if items is None:
                continue
            budget -= len(items)
            if budget < 0:
                return True
            stack.extend(items)
    return False


@cache
def _array_fields(cls: type) -> tuple[str, ...]:
    """The fields of a kio entity that hold tuples (none for anything else)."""
    if not is_dataclass(cls):
        return ()
    hints = typing.get_type_hints(cls)
    return tuple(f.name for f in fields(cls) if typing.get_origin(hints.get(f.name)) is tuple)
