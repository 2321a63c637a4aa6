"""Transactions, YDB-style: the coordinator state machine (``state.py``,
``coordinator.py``), producer-id allocation (``producer_ids.py``), open
transactions' pending data (``pending.py``) and the optimistic offset-range
conflict check (``conflicts.py``). Knows nothing of sockets or the wire."""

from .coordinator import TransactionCoordinator, TxnSettings, TxnStats
from .state import TxnMetadata, TxnState

__all__ = ["TransactionCoordinator", "TxnMetadata", "TxnSettings", "TxnState", "TxnStats"]
