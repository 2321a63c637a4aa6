"""The state every API handler shares: storage, settings, metrics."""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field

from common.logtext import client_text
from tablets.errors import TopicAlreadyExists
from tablets.seam import NodeStorage, TopicView
from txn import TransactionCoordinator

from .groups import GroupCoordinator, GroupOffsets
from .metrics import Metrics
from .security.authorizer import Authorizer
from .security.scram import Credentials
from .settings import GatewayConfig

log = logging.getLogger(__name__)


@dataclass(slots=True)
class HandlerContext:
    """Built complete, once the engine has loaded (server.py's start)."""

    config: GatewayConfig
    engine: NodeStorage
    metrics: Metrics
    groups: GroupCoordinator
    group_offsets: GroupOffsets
    txns: TransactionCoordinator
    credentials: Credentials  # SCRAM credentials
    authorizer: Authorizer | None  # None: no authorizer configured, all is allowed
    # Connection ids increase: the transaction coordinator tells a delayed
    # request of an old connection from a new one (KAFKA-17754).
    newest_connection: int = -1
    _connection_ids: itertools.count = field(default_factory=itertools.count)
    stopping: bool = False  # set at shutdown: long-polls answer at once

    def advertised(self, request) -> tuple[str, int]:
        """The address of this node on the listener ``request`` came in on."""
        session = request.session
        return session.listener.advertised if session is not None else self.config.advertised

    def new_connection_id(self) -> int:
        self.newest_connection = next(self._connection_ids)
        return self.newest_connection

    @property
    def node_id(self) -> int:
        return self.config.node_id

    @property
    def cluster_id(self) -> str:
        return self.engine.cluster_id

    async def auto_create(self, name: str) -> TopicView:
        existing = self.engine.find_topic(name)
        if existing is not None:
            return existing
        log.info("auto-creating topic %s", client_text(name))
        try:
            return await self.engine.create_topic(name, self.config.num_partitions, {})
        except TopicAlreadyExists:  # a concurrent request created it first
            return self.engine.topic(name)
