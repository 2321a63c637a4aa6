"""Server-side HTML for the console: every value escaped on the way in.

Names of topics, groups, members and transactional ids are chosen by clients,
so nothing is ever interpolated raw: ``Html`` marks markup built here, and
``render`` escapes anything else. No inline script or style: the page's
Content-Security-Policy allows only this origin's files.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from urllib.parse import quote

NAV = (("Overview", "/ui/"), ("Topics", "/ui/topics"), ("Groups", "/ui/groups"),
       ("Transactions", "/ui/transactions"), ("Cluster", "/ui/cluster"))
CSP = "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'"


class Html(str):
    """Markup that is already safe (built from escaped parts)."""


Cell = object  # a str (escaped when rendered), an Html, or a number


def render(value: Cell) -> Html:
    if isinstance(value, Html):
        return value
    return Html(html.escape(str(value), quote=True))


def join(parts: Iterable[Cell]) -> Html:
    return Html("".join(render(p) for p in parts))


def tag(name: str, *children: Cell, **attrs: object) -> Html:
    """``<name attrs>children</name>``; attribute names use _ for - (data_x -> data-x)."""
    rendered = "".join(
        f' {key.rstrip("_").replace("_", "-")}="{html.escape(str(value), quote=True)}"'
        for key, value in attrs.items() if value is not None)
    return Html(f"<{name}{rendered}>{join(children)}</{name}>")


def link(text: Cell, *path: str) -> Html:
    """A link to /ui/<path...>, each segment URL-quoted (names may hold / or ?)."""
    return tag("a", text, href="/ui/" + "/".join(quote(p, safe="") for p in path))


def table(headers: Sequence[str], rows: Iterable[Sequence[Cell]], *, id: str,
          empty: str = "none", numeric: Iterable[int] = ()) -> Html:
    numeric = set(numeric)
    head = tag("tr", *(tag("th", h, class_="num" if i in numeric else None)
                       for i, h in enumerate(headers)))
    body = [tag("tr", *(tag("td", c, class_="num" if i in numeric else None)
                        for i, c in enumerate(row))) for row in rows]
    if not body:
        body = [tag("tr", tag("td", empty, colspan=len(headers), class_="empty"))]
    return tag("table", tag("thead", head), tag("tbody", *body), id=id, class_="data")


def pager(path: str, previous: str | None, next_: str | None, shown: int, total: int,
          noun: str, *, size: int | None = None, first: bool = True) -> Html:
    """Links to the pages around this one (keyset cursors, see paging.py) and a count."""
    extra = "" if size is None else f"&size={size}"

    def href(cursor: str, key: str) -> str:
        return f"{path}?{cursor}={quote(key, safe='')}{extra}"

    links = []
    if not first:
        links.append(tag("a", "First", href=path + ("" if size is None else f"?size={size}"),
                         class_="first"))
    if previous is not None:
        links.append(tag("a", "\u2190 Previous", href=href("before", previous), rel="prev"))
    links.append(tag("span", f"{shown} of {total} {noun}", class_="count"))
    if next_ is not None:
        links.append(tag("a", "Next \u2192", href=href("after", next_), rel="next"))
    return tag("nav", *links, class_="pager")


def facts(items: Sequence[tuple[str, Cell]], *, id: str) -> Html:
    """A definition list of label: value pairs."""
    return tag("dl", *(tag("div", tag("dt", k), tag("dd", v), class_="fact")
                       for k, v in items), id=id, class_="facts")


def chart(title: str, rates_url: str, *, id: str, series: str) -> Html:
    """A live chart console.js fills from ``rates_url`` (series: in,out or records)."""
    return tag("section", tag("h3", title), tag("div", class_="chart-area"),
               class_="chart", id=id, data_rates=rates_url, data_series=series)


def page(title: str, section: str, *body: Cell) -> Html:
    nav = tag("nav", tag("span", "kafka-gateway", class_="brand"), *(
        tag("a", name, href=href, class_="active" if name == section else None)
        for name, href in NAV))
    return Html(
        "<!doctype html>"
        + tag("html",
              tag("head",
                  Html('<meta charset="utf-8">'),
                  Html('<meta name="viewport" content="width=device-width, initial-scale=1">'),
                  Html('<link rel="icon" href="data:,">'),
                  tag("title", f"{title} · kafka-gateway"),
                  Html('<link rel="stylesheet" href="/ui/static/vendor/uPlot.min.css">'),
                  Html('<link rel="stylesheet" href="/ui/static/console.css">'),
                  Html('<script defer src="/ui/static/vendor/uPlot.iife.min.js"></script>'),
                  Html('<script defer src="/ui/static/console.js"></script>')),
              tag("body", nav, tag("main", tag("h1", title), *body)),
              lang="en"))


def size(nbytes: int) -> str:
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
