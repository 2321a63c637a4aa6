"""Transaction coordinator: producer ids, transaction state, conflict checks.

Knows nothing of sockets. See ../shared/DESIGN.md, "Transactions, YDB-style".
"""
