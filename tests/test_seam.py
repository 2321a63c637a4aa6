"""The RocksDB engine implements the storage seam (tablets/seam.py).

mypy checks it statically (tablets/seam_check.py, strict, in tests/run_all.sh);
this checks the live objects a started engine hands out against each
Protocol's members: present, async where the seam says async, and taking the
seam's parameters by the same names. Then it drives the seam end to end: a
topic, an append, a read, the node records, and one transaction's pending
blob staged, published and recovered through ``TransactionStorage`` alone.
"""

from __future__ import annotations

import inspect
from typing import Any

import tablets.seam as seam
from tablets.batch import ATTR_TRANSACTIONAL
from tablets.node_records import open_node_records
from tablets.seam import (
    ChangeWriter,
    ConsumerOffsetStore,
    NodeRecordStore,
    NodeStorage,
    PartitionLog,
    TopicView,
    TransactionStorage,
)
from testkit.batches import make_batch
from testkit.compaction import as_batches, run_engine


def _members(protocol: type) -> dict[str, Any]:
    """The Protocol's own members and those of the Protocols it extends."""
    out: dict[str, Any] = {}
    for klass in reversed(protocol.__mro__):
        if klass in (object,) or not getattr(klass, "_is_protocol", False):
            continue
        for name, value in vars(klass).items():
            if not name.startswith("_"):
                out[name] = value
        for name in getattr(klass, "__annotations__", {}):
            out.setdefault(name, None)
    return out


def _check(implementation: object, protocol: type) -> list[str]:
    """What of ``protocol`` ``implementation`` lacks or takes otherwise."""
    problems = []
    members = _members(protocol)
    assert members, f"{protocol.__name__}: no members read"  # the premise
    for name, declared in members.items():
        if not hasattr(implementation, name):
            problems.append(f"{protocol.__name__}.{name}: missing")
            continue
        if not inspect.isfunction(declared):
            continue  # a property or an attribute: present is what can be seen here
        actual = getattr(implementation, name)
        if inspect.iscoroutinefunction(declared) and not inspect.iscoroutinefunction(actual):
            problems.append(f"{protocol.__name__}.{name}: not async")
        wanted = [p for p in inspect.signature(declared).parameters if p != "self"]
        have = list(inspect.signature(actual).parameters)
        if have[:len(wanted)] != wanted:
            problems.append(f"{protocol.__name__}.{name}: takes {have}, the seam {wanted}")
    return problems


def test_the_checker_finds_what_is_missing():
    class Half:
        def list_topics(self) -> list[Any]:
            return []

        def find_topic(self, other_name: str) -> None:
            return None

    problems = _check(Half(), NodeStorage)
    assert "NodeStorage.create_topic: missing" in problems
    assert any(p.startswith("NodeStorage.find_topic: takes") for p in problems)
    assert not any(p.startswith("NodeStorage.list_topics") for p in problems)


def test_the_engine_implements_every_protocol(tmp_path):
    async def check(engine) -> None:
        await engine.create_topic("t", 2, {})
        topic = engine.find_topic("t")
        txns = engine.transaction_storage()
        problems = (_check(engine, NodeStorage) + _check(topic, TopicView)
                    + _check(topic.partitions[0], PartitionLog)
                    + _check(engine.consumer_offsets, ConsumerOffsetStore)
                    + _check(engine.node_records("acl"), NodeRecordStore)
                    + _check(txns, TransactionStorage) + _check(txns, ChangeWriter))
        assert problems == []

    run_engine(check, tmp_path)


def test_the_seam_end_to_end(tmp_path):
    """A transaction's batch through TransactionStorage only: staged as a
    pending blob, recovered after a restart, published with its marker."""
    from tablets.control import commit_marker

    class Sink:
        """One open transaction (instance 7) of partition t-0."""

        def __init__(self, storage: TransactionStorage) -> None:
            self.storage = storage
            self.refs: list[tuple[bytes, bytes]] = []

        def expect(self) -> None: ...
        def admit(self, nbytes: int) -> None: ...
        def settled(self) -> None: ...
        def pending_records(self, partition_prefix: bytes) -> int:
            return 0

        def next_key(self, partition_prefix: bytes) -> bytes:
            return self.storage.pending_ref(partition_prefix, 7, len(self.refs))

        def added(self, key: bytes, batch: bytes) -> None:
            self.refs.append((key, batch))

    async def first(engine) -> None:
        await engine.create_topic("t", 1, {})
        storage = engine.transaction_storage()
        log = storage.partition("t", 0)
        sink = Sink(storage)
        batch = make_batch([b"v"], producer_id=5, producer_epoch=0, base_sequence=0,
                           attributes=ATTR_TRANSACTIONAL)
        await log.append(batch, 1, sink)
        [(ref, _data)] = sink.refs
        assert storage.pending_log_ref(ref) == storage.log_ref(log)
        assert log.high_watermark == 0  # pending: not in the log
        change = storage.begin()
        storage.put_txn_state(change, "tx", b"state")
        storage.set_counter(change, "test.counter", 41)
        await storage.commit(change)

    async def second(engine) -> None:
        storage = engine.transaction_storage()
        log = storage.partition("t", 0)
        assert dict(storage.txn_states()) == {"tx": b"state"}
        assert storage.counter("test.counter") == 41
        [blob] = storage.recover_pending(storage.log_ref(log), 7)
        assert blob.ordinal == 0 and blob.nbytes > len(blob.header)
        change = storage.begin()
        publish = storage.stage_commit(
            change, log, [seam.PendingBlob(blob.ref, blob.header, None)],
            commit_marker(5, 0, 2))
        storage.delete_txn_state(change, "tx")
        await storage.commit(change)
        publish()
        assert log.high_watermark == 2  # the batch and its COMMIT marker
        read = await log.read(0, 1 << 20)
        assert len(as_batches(read.batches)) == 2
        assert list(storage.txn_states()) == []

    run_engine(first, tmp_path)
    run_engine(second, tmp_path)


def test_node_records_offline_and_online(tmp_path):
    async def online(engine) -> None:
        await engine.node_records("scram").change({b"u\x00m": b"secret"})

    run_engine(online, tmp_path)
    records = open_node_records(str(tmp_path), "scram")
    try:
        assert records.get(b"u\x00m") == b"secret"
        records.change_now({}, [b"u\x00m"])
    finally:
        records.close()

    async def again(engine) -> None:
        assert dict(engine.node_records("scram").records) == {}
        assert engine.store_failure() is None
        assert engine.write_stats().changes >= 0

    run_engine(again, tmp_path)
