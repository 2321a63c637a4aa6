"""The one error model (kafka_gateway/errors.py): one class per code, the
layers below mapped in one table, and the per-API overrides answering as Kafka 3.4."""

from __future__ import annotations

import asyncio
import datetime
import inspect

import pytest
from kio.schema.errors import ErrorCode

from kafka_gateway import errors
from kafka_gateway.apis import APIS
from kafka_gateway.client import KafkaClient
from kafka_gateway.codec import request_schema
from tablets import errors as storage
from tablets.tablet import PartitionTablet
from testkit.inprocess import serve
from txn import errors as txn


def _classes(module, base) -> list[type]:
    return [cls for _, cls in inspect.getmembers(module, inspect.isclass)
            if issubclass(cls, base) and cls is not base and cls.__module__ == module.__name__]


def test_each_class_names_one_code_and_carries_its_retriable_flag():
    classes = _classes(errors, errors.KafkaError)
    assert len(classes) == len({cls.code for cls in classes}) > 30
    for cls in classes:
        assert errors.error_class(cls.code) is cls
        assert cls("x").retriable is bool(cls.code.retriable), cls
        assert errors.error_code(cls("why")) is cls.code
    assert errors.NotEnoughReplicas().retriable and not errors.InvalidRequest().retriable


@pytest.mark.parametrize("module, base", [(storage, storage.TabletError), (txn, txn.TxnError)])
def test_every_exception_of_the_layers_below_is_in_the_one_table(module, base):
    # RejectedRecords is only a base (of InvalidRecord, InvalidTimestamp): never raised.
    found = [cls for cls in _classes(module, base) if cls is not storage.RejectedRecords]
    assert len(found) > 5, module
    for cls in found:
        assert errors.mapped_class(cls("x")) is not errors.UnknownServerError, cls
    assert isinstance(storage.StorageError("x"), errors.EXPECTED)


def test_an_unexpected_exception_is_unknown_server_error_and_not_expected():
    assert errors.error_code(RuntimeError("bug")) is ErrorCode.unknown_server_error
    assert not isinstance(RuntimeError("bug"), errors.EXPECTED)


@pytest.mark.parametrize("api_key, version, exc, code", [
    # KIP-588: PRODUCER_FENCED from InitProducerId v4, AddPartitionsToTxn,
    # AddOffsetsToTxn and EndTxn v2 on; never at Produce or TxnOffsetCommit.
    (errors.INIT_PRODUCER_ID, 3, txn.ProducerFenced(), ErrorCode.invalid_producer_epoch),
    (errors.INIT_PRODUCER_ID, 4, txn.ProducerFenced(), ErrorCode.producer_fenced),
    (errors.ADD_PARTITIONS_TO_TXN, 1, txn.ProducerFenced(), ErrorCode.invalid_producer_epoch),
    (errors.ADD_PARTITIONS_TO_TXN, 2, txn.ProducerFenced(), ErrorCode.producer_fenced),
    (errors.ADD_OFFSETS_TO_TXN, 1, txn.ProducerFenced(), ErrorCode.invalid_producer_epoch),
    (errors.ADD_OFFSETS_TO_TXN, 3, txn.ProducerFenced(), ErrorCode.producer_fenced),
    (errors.END_TXN, 1, txn.ProducerFenced(), ErrorCode.invalid_producer_epoch),
    (errors.END_TXN, 2, txn.ProducerFenced(), ErrorCode.producer_fenced),
    (errors.PRODUCE, 9, txn.ProducerFenced(), ErrorCode.invalid_producer_epoch),
    (errors.TXN_OFFSET_COMMIT, 3, txn.ProducerFenced(), ErrorCode.invalid_producer_epoch),
    # A failed offset-range check: abortable everywhere, ILLEGAL_GENERATION at
    # TxnOffsetCommit, UNKNOWN_PRODUCER_ID elsewhere.
    (errors.TXN_OFFSET_COMMIT, 0, txn.TxnConflict("r"), ErrorCode.illegal_generation),
    (errors.END_TXN, 3, txn.TxnConflict("r"), ErrorCode.unknown_producer_id),
    (errors.TXN_OFFSET_COMMIT, 3, storage.UnknownProducerId(), ErrorCode.unknown_producer_id),
    # Produce's CONCURRENT_TRANSACTIONS: NOT_ENOUGH_REPLICAS (Kafka 3.6+).
    (errors.PRODUCE, 9, txn.ConcurrentTransactions(), ErrorCode.not_enough_replicas),
    (errors.ADD_PARTITIONS_TO_TXN, 3, txn.ConcurrentTransactions(),
     ErrorCode.concurrent_transactions),
    # Without an API: the table's code.
    (None, 0, txn.ProducerFenced(), ErrorCode.producer_fenced),
])
def test_overrides_answer_as_kafka(api_key, version, exc, code):
    assert errors.error_code(exc, api_key, version) is code


def test_each_override_is_for_a_served_api_and_changes_the_answer():
    for override in errors.OVERRIDES:
        api = APIS[override.api_key]
        if override.before is not None:
            assert api.min_version < override.before <= api.max_version, override
        raised = override.raised
        mapped = raised if issubclass(raised, errors.KafkaError) else errors.BY_TYPE[raised]
        assert mapped is not override.answer, override
        assert override.why, override


DELETE_RECORDS, CREATE_TOPICS = 21, 19


def test_a_bug_fails_the_request_counted_and_an_expected_error_answers_its_partition(
        tmp_path, monkeypatch):
    """Per partition a handler catches only EXPECTED: an expected error is that
    partition's answer; a bug is not hidden as one partition's
    UNKNOWN_SERVER_ERROR but fails the request at the dispatch, counted."""
    def delete(offset: int):
        schema = request_schema(DELETE_RECORDS, 2)
        return schema.DeleteRecordsRequest(
            topics=(schema.DeleteRecordsTopic(name="t", partitions=(
                schema.DeleteRecordsPartition(partition_index=0, offset=offset),)),),
            timeout=datetime.timedelta(seconds=5))

    async def scenario(client: KafkaClient, server) -> None:
        schema = request_schema(CREATE_TOPICS, 7)
        await client.request(schema.CreateTopicsRequest(
            topics=(schema.CreatableTopic(name="t", num_partitions=1, replication_factor=1,
                                          assignments=(), configs=()),),
            timeout=datetime.timedelta(seconds=5), validate_only=False))
        answer = await client.request(delete(5))  # past the end: an expected error
        part = answer.topics[0].partitions[0]
        assert part.error_code is ErrorCode.offset_out_of_range
        assert server.broker.metrics.request_errors == {}

        async def bug(self, offset):
            raise RuntimeError("a bug")

        monkeypatch.setattr(PartitionTablet, "delete_records", bug)
        other = await KafkaClient.connect(*server.config.listen)
        try:
            with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):
                await other.request(delete(0))
        finally:
            await other.close()
        assert server.broker.metrics.request_errors == {"delete_records": 1}

    serve(tmp_path, scenario)
