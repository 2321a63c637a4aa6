"""A read-only web console on the admin HTTP port, under ``/ui/``.

- ``/ui/``                    the node, totals and live produce/consume charts
- ``/ui/topics``              every topic: partitions, records, size, configs set
- ``/ui/topics/{name}``       partitions with leaders, watermarks and sizes, every config
                              and its source, the groups reading it, live charts
- ``/ui/groups``              every group: state, members, lag
- ``/ui/groups/{id}``         members and their assignment, lag per partition
- ``/ui/transactions``        transactional ids, their state and partitions, the
                              bytes their open transactions store and hold in memory
- ``/ui/cluster``             the live gateways over a shared store: their
                              addresses, leases, partitions and coordinator
                              slots led (a gateway alone says so)
- ``/ui/api/rates``           the counters the charts poll (JSON)

The three lists are paged (webui/paging.py): ``?after=<last key shown>`` or
``?before=<first key shown>``, ``?size=`` rows (50 unless asked, 500 at most);
a page reads and renders its own rows only.

Server-rendered HTML (webui/html.py escapes every value) with one script,
console.js, which draws the charts with uPlot (from npm, served from this
package: static/vendor/). Nothing loads from another origin. Nothing here
changes the gateway: it only reads (webui/model.py).
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from ..context import HandlerContext
from . import pages

STATIC = Path(__file__).parent / "static"


def add_console(app: web.Application, broker: HandlerContext) -> None:
    console = pages.Console(broker)
    app.add_routes([
        web.get("/", console.home_redirect),
        web.get("/ui", console.home_redirect),
        web.get("/ui/", console.overview),
        web.get("/ui/topics", console.topics),
        web.get("/ui/topics/{name}", console.topic),
        web.get("/ui/groups", console.groups),
        web.get("/ui/groups/{group_id}", console.group),
        web.get("/ui/transactions", console.transactions),
        web.get("/ui/cluster", console.cluster),
        web.get("/ui/api/rates", console.rates),
        web.static("/ui/static", STATIC),
    ])
