"""The leader-epoch fence every partition request applies (KIP-320).

This node leads every partition at one epoch forever; a client that names
another epoch learned it elsewhere and is told so, as Kafka would.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from tablets.tablet import LEADER_EPOCH


def leader_epoch_error(current_leader_epoch: int) -> ErrorCode:
    if current_leader_epoch > LEADER_EPOCH:
        return ErrorCode.unknown_leader_epoch
    if 0 <= current_leader_epoch < LEADER_EPOCH:
        return ErrorCode.fenced_leader_epoch
    return ErrorCode.none
