"""The coordinator's settings and counters."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TxnSettings:
    max_timeout_ms: int = 900_000  # transaction.max.timeout.ms
    id_expiration_ms: int = 604_800_000  # transactional.id.expiration.ms
    # Node-wide bytes of open transactions' batches kept in memory, so a
    # commit can serve them from the partitions' in-memory tails.
    pending_memory_bytes: int = 64 << 20
    # Bytes of open transactions' batches stored (waiting for their commit),
    # node-wide and per transaction; a batch past either is refused and its
    # transaction made abort-only (-1: no limit).
    pending_disk_bytes: int = 4 << 30  # gateway.txn.pending.disk.bytes
    max_txn_bytes: int = 1 << 30  # gateway.txn.max.bytes


@dataclass(slots=True)
class TxnStats:
    """Counters for /metrics and the benchmark."""

    commits: int = 0
    aborts: int = 0
    timeouts: int = 0
    conflicts: int = 0
    fenced: int = 0
    stale_end_txn: int = 0
    # Transactions made abort-only because a batch would have crossed a
    # pending-bytes limit, per limit ("transaction", "node").
    over_limit: dict[str, int] = field(
        default_factory=lambda: {"transaction": 0, "node": 0})
