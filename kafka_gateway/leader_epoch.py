"""The leader-epoch fence every partition request applies (KIP-320).

This node leads every partition at one epoch forever; a client that names
another epoch learned it elsewhere and is told so, as Kafka would.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from tablets.seam import LEADER_EPOCH


def leader_epoch_error(current_leader_epoch: int) -> ErrorCode:
    """-1 names no epoch; any other below this node's is fenced, as in Kafka
    (Fetch reads every negative value as none: it passes -1 for them)."""
    if current_leader_epoch == -1:
        return ErrorCode.none
    if current_leader_epoch > LEADER_EPOCH:
        return ErrorCode.unknown_leader_epoch
    if current_leader_epoch < LEADER_EPOCH:
        return ErrorCode.fenced_leader_epoch
    return ErrorCode.none
