"""Transactions, YDB-style: the coordinator (``coordinator.py``, the front of
``sessions.py``, ``open_transactions.py``, ``commit.py`` and ``registry.py``), its state
machine (``state.py``), producer-id allocation (``producer_ids.py``), open
transactions' pending data (``pending.py``) and staged offsets
(``pending_offsets.py``), and the optimistic offset-range conflict check
(``conflicts.py``). Knows nothing of sockets or the wire."""

from .coordinator import TransactionCoordinator, TxnSettings, TxnStats
from .state import TxnMetadata, TxnState

__all__ = ["TransactionCoordinator", "TxnMetadata", "TxnSettings", "TxnState", "TxnStats"]
