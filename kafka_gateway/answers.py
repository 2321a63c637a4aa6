"""The shape most handlers share: authorize, try each item, build the answer.

``answer_each`` tries ``attempt`` on each item, a slice at a time (so a
request naming 100,000 partitions does not hold the event loop: slicing.py),
and answers an item whose attempt raised an expected error
(``errors.EXPECTED``) with ``failed(item, exc)``. Anything else is a bug: it
is not hidden as one item's UNKNOWN_SERVER_ERROR but fails the request at the
dispatch, which counts it. ``each_partition`` is the same over a request's
topics and their partitions, the answers grouped by topic in request order.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from functools import partial
from typing import TypeVar

from kio.schema.errors import ErrorCode

from .errors import EXPECTED, error_class
from .slicing import sliced

T = TypeVar("T")
P = TypeVar("P")
R = TypeVar("R")


async def answer_each(items: Iterable[T], attempt: Callable[[T], Awaitable[R]],
                      failed: Callable[[T, Exception], R]) -> list[R]:
    """``attempt(item)``'s answer for each item; ``failed(item, exc)`` where it
    raised an expected error."""
    answers = []
    async for item in sliced(items):
        try:
            answers.append(await attempt(item))
        except EXPECTED as exc:
            answers.append(failed(item, exc))
    return answers


async def each_partition(topics: Iterable[T], partitions_of: Callable[[T], Iterable[P]],
                         attempt: Callable[[T, P], Awaitable[R]],
                         failed: Callable[[T, P, Exception], R]) -> list[tuple[T, list[R]]]:
    """``answer_each`` over each topic's partitions: (topic, its answers) in request order."""
    return [(topic, await answer_each(partitions_of(topic), partial(attempt, topic),
                                      partial(failed, topic))) for topic in topics]


def refuse_denied(denied: Mapping[str, ErrorCode], name: str) -> None:
    """Raise the authorization error of a name ``denied_names`` refused."""
    code = denied.get(name)
    if code is not None:
        raise error_class(code)()
