"""Topic changes told to every gateway of a cluster: a topic change notifies
the channel ``<schema>_topics`` inside its own transaction
(``announce_topics``), and each gateway listens on it (``TopicNotices``) and
rereads its catalog (``pgstore.cluster``: ``PgCluster.topics_changed``), also
after its listening connection was lost. The listening connection itself is
``pgstore.log_notices``'s.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from .log_notices import LogNotices

if TYPE_CHECKING:
    from .writer import PgChange


def topics_channel(schema: str) -> str:
    return f"{schema}_topics"


def announce_topics(change: PgChange, schema: str, name: str) -> None:
    """Tell every gateway, once ``change`` commits, that topic ``name`` changed."""
    change.execute("SELECT pg_notify($1, $2)", topics_channel(schema), name)


class TopicNotices(LogNotices):
    """One connection listening on the topics' channel; any notice (and every
    reconnection) makes the gateway reread its catalog."""

    def __init__(self, dsn: str, schema: str, on_topics: Callable[[], None],
                 on_resync: Callable[[], Awaitable[None]]) -> None:
        super().__init__(dsn, schema, lambda _notice: None, on_resync)
        self.channel = topics_channel(schema)
        self._on_topics = on_topics

    def _notice(self, _conn: object, _pid: int, _channel: str, payload: object, /) -> None:
        self.notices += 1
        self._on_topics()
