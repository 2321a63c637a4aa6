"""The leader-epoch fence every partition request applies (KIP-320).

A node alone leads every partition at one epoch forever; in a cluster of
gateways over PostgreSQL each partition's epoch grows with every change of
leader (``kafka_gateway/routing.py``'s ``leader_epoch``). A client that
names another epoch learned it elsewhere and is told so, as Kafka would.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from tablets.seam import LEADER_EPOCH


def leader_epoch_error(current_leader_epoch: int, epoch: int = LEADER_EPOCH) -> ErrorCode:
    """-1 names no epoch; any other below the partition's ``epoch`` is
    fenced, one above it unknown (yet), as in Kafka (Fetch reads every
    negative value as none: it passes -1 for them)."""
    if current_leader_epoch == -1:
        return ErrorCode.none
    if current_leader_epoch > epoch:
        return ErrorCode.unknown_leader_epoch
    if current_leader_epoch < epoch:
        return ErrorCode.fenced_leader_epoch
    return ErrorCode.none
