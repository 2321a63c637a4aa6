"""Transaction-coordinator errors, in Kafka's terms (``kafka_gateway.errors``
maps each to its error code; handlers pick version-specific codes there)."""

from __future__ import annotations

from tablets.errors import BatchRefused


class TxnError(Exception):
    """Base class: a transactional request that cannot proceed."""


class ProducerFenced(TxnError):
    """A producer whose epoch (or id) was superseded by a newer InitProducerId.

    PRODUCER_FENCED, or INVALID_PRODUCER_EPOCH for request versions before
    KIP-588 (InitProducerId v4, AddPartitionsToTxn/AddOffsetsToTxn/EndTxn v2).
    """


class InvalidProducerIdMapping(TxnError):
    """The transactional id is unknown, or maps to another producer id."""


class InvalidTxnState(TxnError):
    """The request does not fit the transaction's state (e.g. EndTxn(abort)
    after a commit, or transactional data for a partition not added)."""


class InvalidTransactionTimeout(TxnError):
    """A transaction timeout above ``transaction.max.timeout.ms`` (or not positive)."""


class ConcurrentTransactions(TxnError):
    """The transaction is completing; the client retries."""


class TxnConflict(TxnError):
    """The optimistic offset-range check failed: another commit claimed the
    consumed range (the version moved), or the range was already processed.
    The transaction can only abort; nothing of it is ever published."""


class TxnDoomed(TxnError, BatchRefused):
    """A transactional batch refused, nothing of it stored: it would take its
    transaction past a pending-bytes limit (``gateway.txn.max.bytes``,
    ``gateway.txn.pending.disk.bytes``), or its transaction can only abort
    already. POLICY_VIOLATION (as every BatchRefused): non-retriable, and
    each client's transaction becomes abortable (not fatal). A storage error
    too, so the tablet, asked to store the batch, fails the append with it."""


class TransactionalIdNotFound(TxnError):
    pass
