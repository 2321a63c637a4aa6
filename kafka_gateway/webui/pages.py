"""The console's pages: each handler reads the model and renders HTML."""

from __future__ import annotations

import datetime
from urllib.parse import quote

from aiohttp import web

from tablets.seam import ImportantGroup

from ..context import HandlerContext
from . import model
from .html import CSP, Html, chart, facts, link, page, pager, size, table, tag
from .paging import Page, page_size


def _response(body: Html, status: int = 200) -> web.Response:
    return web.Response(text=body, status=status, content_type="text/html",
                        headers={"Content-Security-Policy": CSP,
                                 "X-Content-Type-Options": "nosniff"})


def _not_found(section: str, what: str) -> web.Response:
    return _response(page("Not found", section, tag("p", what, class_="empty")), status=404)


def _when(ms: int) -> str:
    if ms < 0:
        return "-"
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC).strftime(
        "%Y-%m-%d %H:%M:%S UTC")


def _optional(value: object) -> object:
    return "-" if value is None else value


def _partitions(partitions: list[tuple[str, int]]) -> str:
    return ", ".join(f"{t}-{p}" for t, p in partitions) or "-"


def _charts(url: str) -> Html:
    return tag("div",
               chart("Throughput (bytes/s)", url, id="chart-bytes", series="bytes"),
               chart("Records/s (appended, committed by groups)", url, id="chart-records",
                     series="records"),
               class_="charts")


def _cursors(request: web.Request) -> tuple[str | None, str | None, int]:
    """``?after=`` / ``?before=`` and ``?size=`` of a list page (paging.py)."""
    query = request.query
    return query.get("after"), query.get("before"), page_size(query.get("size"))


def _pager(request: web.Request, listed: Page, noun: str) -> Html:
    after, before, size = _cursors(request)
    return pager(request.path, listed.previous, listed.next, len(listed.keys), listed.total,
                 noun, size=size if "size" in request.query else None,
                 first=after is None and before is None)


def _important(rows: list[ImportantGroup]) -> Html:
    """Per important group and partition: where it is, and what retention keeps for it."""
    def committed(row: ImportantGroup) -> object:
        if row.committed is not None:
            return row.committed
        return "deleted: holds nothing" if row.released else "never: holds from the log start"

    return table(
        ("Group", "Partition", "Committed", "Lag", "Held back from retention",
         "Oldest held record", "Deleted unread (ceiling)"),
        [(link(r.group, "groups", r.group), r.partition, committed(r), r.lag,
          size(r.held_bytes), _age(r.held_age_ms), r.records_passed) for r in rows],
        id="important", numeric=(1, 3, 4, 5, 6))


def _age(ms: int) -> str:
    if ms <= 0:
        return "-"
    return str(datetime.timedelta(seconds=ms // 1000))


class Console:
    def __init__(self, broker: HandlerContext) -> None:
        self.broker = broker

    async def home_redirect(self, _request: web.Request) -> web.Response:
        raise web.HTTPFound("/ui/")

    async def overview(self, _request: web.Request) -> web.Response:
        broker = self.broker
        totals = model.totals(broker)
        txns = broker.txns
        host, port = broker.config.advertised
        body = [
            facts([
                ("Cluster id", broker.cluster_id),
                ("Node", broker.node_id),
                ("Advertised", f"{host}:{port}"),
                ("Topics", totals.topics),
                ("Partitions", totals.partitions),
                ("Records", totals.records),
                ("Stored", size(totals.size_bytes)),
                ("Groups", len(model.group_keys(broker))),
                ("Transactional ids", len(txns.txns)),
                ("Open transactions", txns.open_count),
                ("Connections", broker.metrics.connections),
            ], id="overview"),
            _charts("/ui/api/rates"),
        ]
        return _response(page("Overview", "Overview", *body))

    async def topics(self, request: web.Request) -> web.Response:
        listed, summaries = model.topic_page(self.broker, *_cursors(request))
        rows = [(link(t.name, "topics", t.name), len(t.partitions), t.records,
                 size(t.size_bytes),
                 ", ".join(f"{k}={v}" for k, v in sorted(t.overrides.items())) or "-")
                for t in summaries]
        return _response(page("Topics", "Topics", table(
            ("Topic", "Partitions", "Records", "Size", "Configs set"), rows, id="topics",
            empty="no topics yet" if not listed.total else "no more topics",
            numeric=(1, 2, 3)), _pager(request, listed, "topics")))

    async def topic(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        summary = model.topic(self.broker, name)
        if summary is None:
            return _not_found("Topics", f"There is no topic {name}.")
        leaders = model.partition_leaders(self.broker, name, summary.partitions)
        partitions = table(
            ("Partition", "Leader", "Leader epoch", "Log start offset", "High watermark",
             "Records", "Size"),
            [(p.partition, _optional(leader), epoch, p.log_start_offset, p.high_watermark,
              p.records, size(p.size_bytes))
             for p, (leader, epoch) in zip(summary.partitions, leaders, strict=True)],
            id="partitions", numeric=(0, 1, 2, 3, 4, 5, 6))
        configs = table(("Config", "Value", "Source"),
                        [(c.name, c.value, c.source)
                         for c in model.topic_configs(self.broker, name)], id="configs")
        important = model.important_of(self.broker, name)
        marked = {row.group for row in important}
        readers = table(("Group", "Lag", "Important"),
                        [(link(g, "groups", g), lag, "important" if g in marked else "")
                         for g, lag in model.readers_of(self.broker, name)],
                        id="readers", empty="no group has committed offsets here",
                        numeric=(1,))
        body = [
            facts([("Topic id", summary.topic_id), ("Partitions", len(summary.partitions)),
                   ("Records", summary.records), ("Size", size(summary.size_bytes))],
                  id="topic-facts"),
            _charts(f"/ui/api/rates?topic={quote(name, safe='')}"),
            tag("h2", "Partitions"), partitions,
            tag("h2", "Consumer groups"), readers,
        ]
        if important:
            body += [tag("h2", "Important consumer groups"), _important(important)]
        body += [tag("h2", "Configs"), configs]
        return _response(page(f"Topic {name}", "Topics", *body))

    async def groups(self, request: web.Request) -> web.Response:
        listed, views = model.group_page(self.broker, *_cursors(request))
        rows = [(link(g.group_id, "groups", g.group_id), g.state, g.protocol_type or "-",
                 g.protocol or "-", len(g.members), g.lag) for g in views]
        return _response(page("Consumer groups", "Groups", table(
            ("Group", "State", "Protocol type", "Assignor", "Members", "Lag"), rows,
            id="groups", empty="no groups yet" if not listed.total else "no more groups",
            numeric=(4, 5)), _pager(request, listed, "groups")))

    async def group(self, request: web.Request) -> web.Response:
        group_id = request.match_info["group_id"]
        view = model.group(self.broker, group_id)
        if view is None:
            return _not_found("Groups", f"There is no group {group_id}.")
        members = table(
            ("Member id", "Instance id", "Client id", "Host", "Assignment"),
            [(m.member_id, _optional(m.instance_id), m.client_id, m.host or "-",
              _partitions(m.assignment)) for m in view.members],
            id="members", empty="no members")
        offsets = table(
            ("Topic", "Partition", "Committed offset", "Log end offset", "Lag", "Member",
             "Client id"),
            [(link(o.topic, "topics", o.topic), o.partition, _optional(o.committed),
              _optional(o.end), _optional(o.lag), _optional(o.owner), _optional(o.client_id))
             for o in view.offsets],
            id="offsets", empty="no committed offsets", numeric=(1, 2, 3, 4))
        body = [
            facts([("State", view.state), ("Protocol type", view.protocol_type or "-"),
                   ("Assignor", view.protocol or "-"), ("Members", len(view.members)),
                   ("Total lag", view.lag)], id="group-facts"),
            tag("h2", "Members"), members,
            tag("h2", "Offsets and lag"), offsets,
        ]
        return _response(page(f"Group {group_id}", "Groups", *body))

    async def transactions(self, request: web.Request) -> web.Response:
        txns = self.broker.txns
        listed, metas = model.transaction_page(self.broker, *_cursors(request))
        rows = []
        for m in metas:
            # An open transaction's batches: stored until the commit, and the
            # part of them also held in memory.
            pending = txns.pending_of(m.transactional_id)
            rows.append((m.transactional_id, m.producer_id, m.epoch, m.state.value,
                         m.timeout_ms, _when(m.started_ms), _partitions(sorted(m.partitions)),
                         ", ".join(sorted(m.groups)) or "-",
                         "-" if pending is None else size(pending[0]),
                         "-" if pending is None else size(pending[1])))
        stats = txns.stats
        body = [
            facts([("Transactional ids", listed.total),
                   ("Open", txns.open_count),
                   ("Pending stored", size(txns.pending_bytes)),
                   ("Pending in memory", size(txns.pending_memory_bytes)),
                   ("Committed", stats.commits),
                   ("Aborted", stats.aborts),
                   ("Timed out", stats.timeouts),
                   ("Conflicts", stats.conflicts),
                   ("Over a pending limit", sum(stats.over_limit.values()))],
                  id="txn-facts"),
            table(("Transactional id", "Producer id", "Epoch", "State", "Timeout (ms)",
                   "Started", "Partitions", "Groups", "Stored", "In memory"),
                  rows, id="transactions",
                  empty="no transactional producers yet" if not listed.total
                  else "no more transactional ids", numeric=(1, 2, 4, 8, 9)),
            _pager(request, listed, "transactional ids"),
        ]
        return _response(page("Transactions", "Transactions", *body))

    async def cluster(self, _request: web.Request) -> web.Response:
        nodes = model.cluster_nodes(self.broker)
        if nodes is None:
            return _response(page("Cluster", "Cluster", tag(
                "p", f"Node {self.broker.node_id} runs alone over its embedded store: it leads "
                "every partition and coordinates every group and transactional id. Several "
                "gateways share one PostgreSQL store (docs/cluster.md).", id="alone")))
        body = [
            facts([("Live gateways", len(nodes)), ("This gateway", self.broker.node_id)],
                  id="cluster-facts"),
            table(("Node", "Address", "Lease runs out", "Partitions led",
                   "Coordinator slots led", ""),
                  [(n.node_id, n.address, _when(n.lease_expires_ms), n.partitions_led,
                    n.coordinator_slots_led, "this gateway" if n.this_gateway else "")
                   for n in nodes], id="nodes", empty="no live gateway",
                  numeric=(0, 3, 4)),
            tag("p", "As of this gateway's last leadership pass (every third of "
                "broker.session.timeout.ms); leases by the store's clock.", class_="note"),
        ]
        return _response(page("Cluster", "Cluster", *body))

    async def rates(self, request: web.Request) -> web.Response:
        return web.json_response(model.rates(self.broker, request.query.get("topic")),
                                 headers={"Cache-Control": "no-store"})
