"""Pages of a console list, by key: ``?after=<last key shown>`` or ``?before=<first>``.

A list of 30,000 transactional ids is not sorted nor rendered to show 50: only
a page's rows are read and rendered. Transactional ids, which clients can make
as many of as they like, are kept in order by the coordinator
(txn/ordered.py): a page is a binary search and a slice (``page_of_sorted``).
Topics and groups are picked from their unordered keys with a bounded heap, in
one pass over the keys (``page_of``, about 2 ms for 30,000 keys). Keyset
paging, not offsets: a page stays put while keys come and go around it.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

PAGE_SIZE = 50
MAX_PAGE_SIZE = 500


@dataclass(frozen=True, slots=True)
class Page:
    keys: list[str]  # this page's keys, in order
    total: int  # keys in the whole list
    previous: str | None  # the ``before`` cursor of the page before, None: first page
    next: str | None  # the ``after`` cursor of the page after, None: last page


def page_size(raw: str | None) -> int:
    """``?size=``: PAGE_SIZE unless a number in 1..MAX_PAGE_SIZE is asked for."""
    if raw is None or not raw.isdigit():
        return PAGE_SIZE
    return min(max(int(raw), 1), MAX_PAGE_SIZE)


def page_of(keys: Collection[str], *, after: str | None = None, before: str | None = None,
            size: int = PAGE_SIZE) -> Page:
    """The page of ``keys`` (in string order) after ``after``, or else before ``before``."""
    if before is not None and after is None:
        picked = heapq.nlargest(size + 1, _below(keys, before))
        more_before = len(picked) > size
        shown = sorted(picked[:size])
        more_after = bool(keys) and max(keys) >= before
    else:
        picked = heapq.nsmallest(size + 1, keys if after is None else _above(keys, after))
        more_after = len(picked) > size
        shown = picked[:size]
        more_before = after is not None and bool(keys) and min(keys) <= after
    return Page(shown, len(keys),
                shown[0] if more_before and shown else None,
                shown[-1] if more_after and shown else None)


def page_of_sorted(keys: Sequence[str], *, after: str | None = None,
                   before: str | None = None, size: int = PAGE_SIZE) -> Page:
    """``page_of`` for keys already in order: a binary search and a slice."""
    if before is not None and after is None:
        end = bisect_left(keys, before)
        start = max(end - size, 0)
    else:
        start = 0 if after is None else bisect_right(keys, after)
        end = min(start + size, len(keys))
    shown = list(keys[start:end])
    return Page(shown, len(keys), shown[0] if start > 0 and shown else None,
                shown[-1] if end < len(keys) and shown else None)


def _above(keys: Iterable[str], after: str) -> Iterable[str]:
    return (key for key in keys if key > after)


def _below(keys: Iterable[str], before: str) -> Iterable[str]:
    return (key for key in keys if key < before)
